"""One download attempt: a GET to a guarded, pinned address, redirects checked hop by hop, the
body streamed to a file under a size limit, a deadline, a minimum rate and cancellation.

Redirects are followed by hand (each hop goes through the SSRF guard again, at most
`max_redirects`, never from https down to http). The connection goes to the address the guard
checked while TLS still verifies the URL's host name. The body is hashed on the way to disk, so
no more than one read buffer of it is ever in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from kubeseer import units
from kubeseer.operator.fetch import cancel, errors, guard, policy

_CHUNK = units.MIB
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

Signer = Callable[[str, str], dict[str, str]]
"""(Host header, URI-encoded path) -> headers that authenticate the GET (S3 signing)."""


@dataclass(frozen=True)
class Request:
    """One GET: the URL to connect to, whether its host is trusted, and how to sign it."""

    url: str
    trusted_host: str | None = None
    sign: Signer | None = None
    follow_redirects: bool = True


@dataclass(frozen=True)
class Body:
    """What one attempt wrote: its sha256 and size."""

    sha256: str
    size: int


def get(
    request: Request,
    rules: policy.FetchPolicy,
    deadline: float,
    sink: BinaryIO,
    cancellation: cancel.Cancellation,
) -> Body:
    """One try: follow redirects (each hop guarded) and stream the body into `sink`."""
    url = request.url
    for _hop in range(rules.max_redirects + 1):
        parts = guard.split(url)
        if parts.scheme not in ("http", "https"):
            raise errors.TooManyRedirectsError(f"refusing to follow a redirect to {url!r}", url=url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        trusted = host == request.trusted_host or guard.host_allowed(host, rules.allowed_hosts)
        address = guard.guarded_address(host, port, rules, trusted=trusted, url=url)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        host_header = _host_header(host, port, parts.scheme)
        headers = {
            "Host": host_header,
            "User-Agent": rules.user_agent,
            "Accept-Encoding": "identity",
        }
        if request.sign is not None:
            headers.update(request.sign(host_header, parts.path or "/"))
        connection = _connection(parts.scheme, host, port, address, rules, deadline)
        with contextlib.ExitStack() as cleanup:
            # Closing the connection alone leaves the response's file (and so the socket) open.
            cleanup.callback(connection.close)
            try:
                connection.connect()
                # The socket itself: the connection forgets it once a response says "close".
                cleanup.enter_context(cancellation.interrupting(_shutdown(connection.sock)))
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
            except ssl.SSLCertVerificationError as e:
                raise errors.TLSError(f"{url}: {e.verify_message or e}", url=url) from e
            except (OSError, http.client.HTTPException) as e:
                _raise_if_cancelled(cancellation, url)
                raise errors.UnreachableError(
                    f"cannot GET {url}: {guard.describe(e)}", url=url
                ) from e
            cleanup.callback(response.close)
            if response.status in _REDIRECTS and request.follow_redirects:
                location = response.getheader("Location")
                if not location:
                    raise errors.HTTPStatusError(
                        f"{url} answered {response.status} without a Location",
                        url=url,
                        status=response.status,
                    )
                nxt = urllib.parse.urljoin(url, location)
                if parts.scheme == "https" and guard.split(nxt).scheme == "http":
                    raise errors.TooManyRedirectsError(
                        f"refusing the redirect from https to http ({nxt})", url=url
                    )
                url = nxt
                continue
            _raise_for_status(response, url)
            return _stream(response, url, rules, deadline, sink, cancellation)
    raise errors.TooManyRedirectsError(
        f"more than {rules.max_redirects} redirects starting at {request.url}", url=request.url
    )


def _raise_for_status(response: http.client.HTTPResponse, url: str) -> None:
    status = response.status
    if 200 <= status < 300:
        return
    text = f"{url} answered {status} {response.reason or ''}".rstrip()
    if status == 429 or status >= 500:
        raise errors.UnreachableError(text, url=url)
    if status in (404, 410):
        raise errors.NotFoundError(text, url=url)
    if status in (401, 403):
        raise errors.AccessDeniedError(text, url=url)
    raise errors.HTTPStatusError(text, url=url, status=status)


def _shutdown(sock: socket.socket) -> Callable[[], None]:
    """What cancelling does to a connection: its socket shut down, so that a read blocked on it
    in another thread returns at once."""

    def interrupt() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    return interrupt


def _raise_if_cancelled(cancellation: cancel.Cancellation, url: str) -> None:
    if cancellation.cancelled:
        raise errors.CancelledError(f"the fetch of {url} was cancelled", url=url)


def _stream(
    response: http.client.HTTPResponse,
    url: str,
    rules: policy.FetchPolicy,
    deadline: float,
    sink: BinaryIO,
    cancellation: cancel.Cancellation,
) -> Body:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > rules.max_bytes:
        raise errors.TooLargeError(
            f"{url} declares {int(declared)} bytes, more than the limit of {rules.max_bytes}",
            url=url,
        )
    digest = hashlib.sha256()
    size = 0
    started = time.monotonic()
    while True:
        try:
            chunk = response.read1(_CHUNK)
        except (OSError, http.client.HTTPException) as e:
            _raise_if_cancelled(cancellation, url)
            raise errors.UnreachableError(
                f"reading {url} failed: {guard.describe(e)}", url=url
            ) from e
        _raise_if_cancelled(cancellation, url)
        if not chunk:
            break
        size += len(chunk)
        if size > rules.max_bytes:
            raise errors.TooLargeError(
                f"{url} sent more than the limit of {rules.max_bytes} bytes", url=url
            )
        digest.update(chunk)
        sink.write(chunk)
        _check_pace(url, rules, deadline, started, size)
    if declared is not None and declared.isdigit() and size != int(declared):
        raise errors.UnreachableError(f"{url} ended after {size} of {declared} bytes", url=url)
    sink.flush()
    return Body(digest.hexdigest(), size)


def _check_pace(
    url: str, rules: policy.FetchPolicy, deadline: float, started: float, size: int
) -> None:
    """Fail a body that misses the deadline, or whose average rate after the grace period is
    under the minimum (one byte every few seconds never trips a read timeout)."""
    now = time.monotonic()
    if now > deadline:
        raise errors.TooSlowError(
            f"{url} did not finish within {rules.total_timeout_s:g} s ({size} bytes received)",
            url=url,
        )
    elapsed = now - started
    if elapsed > rules.rate_grace_s and size < rules.min_rate_bytes_s * elapsed:
        raise errors.TooSlowError(
            f"{url} sent {size} bytes in {elapsed:.0f} s, under the minimum rate of "
            f"{rules.min_rate_bytes_s / 1024:.0f} KiB/s",
            url=url,
        )


def _host_header(host: str, port: int, scheme: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return shown if port == default else f"{shown}:{port}"


def _connection(
    scheme: str,
    host: str,
    port: int,
    address: str,
    rules: policy.FetchPolicy,
    deadline: float,
) -> _PinnedHTTPConnection:
    remaining = deadline - time.monotonic()
    connect_timeout = max(0.001, min(rules.connect_timeout_s, remaining))
    # A silent server must not outlast the deadline either: reads time out by then at the latest.
    read_timeout = max(0.001, min(rules.read_timeout_s, remaining))
    if scheme == "https":
        return _PinnedHTTPSConnection(
            host,
            port,
            address,
            connect_timeout,
            read_timeout,
            ssl.create_default_context(cafile=rules.ca_file),
        )
    return _PinnedHTTPConnection(host, port, address, connect_timeout, read_timeout)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a pre-checked address, whatever DNS says by the time it connects."""

    def __init__(
        self, host: str, port: int, address: str, connect_timeout: float, read_timeout: float
    ) -> None:
        super().__init__(host, port, timeout=read_timeout)
        self._address = address
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout

    def connect(self) -> None:
        """Open TCP to the checked address; later reads use the read timeout."""
        self.sock = socket.create_connection((self._address, self.port), self._connect_timeout)
        self.sock.settimeout(self._read_timeout)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """HTTPS to a pre-checked address; the certificate is verified against the URL's host."""

    default_port = http.client.HTTPS_PORT

    def __init__(
        self,
        host: str,
        port: int,
        address: str,
        connect_timeout: float,
        read_timeout: float,
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(host, port, address, connect_timeout, read_timeout)
        self._tls = context

    def connect(self) -> None:
        """TCP to the checked address, then TLS with SNI and verification for the host name."""
        super().connect()
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self.host)
