"""Model downloads, all in one module: http(s) and s3:// with limits and an SSRF guard.

A DLJob names its model by URL, and the operator fetches it from inside the cluster, so a URL is
untrusted input that can point at the cloud metadata service, the API server or any Service.
Every request therefore goes through the same path:

1. the URL is parsed and its host checked: names under `.svc`/`.cluster.local`, `localhost` and
   single-label names (which resolve through the cluster's search domains) are refused;
2. the host is resolved once and every address it resolves to must be globally routable and
   outside the cluster CIDRs the admin configured (no loopback, link-local, RFC 1918, 100.64/10,
   unique-local or IPv4-mapped versions of those);
3. the connection is opened to the address that was checked (TLS still verifies the hostname),
   so a second DNS answer cannot swap in an internal address (no rebinding gap);
4. redirects are followed by hand, each hop checked again, at most `max_redirects`, never from
   https down to http;
5. the body is streamed to disk with a size limit, a read timeout between bytes and an overall
   deadline, hashed on the way, and checked against the DLJob's sha256 when one is given.

Hosts the admin allow-lists skip steps 1-2 (not 3-5). Transient failures (connection errors,
timeouts, 5xx, 429) are retried with exponential backoff and jitter; 4xx, size and digest
failures are final. Verified models are kept in an on-disk cache keyed by their sha256 and
bounded in bytes (least recently used first out), so a DLJob that names its digest is served
without touching the network.

s3://bucket/key URLs are read from the S3-compatible endpoint the admin configures, with
credentials the operator reads from the Secret the admin names. Requests are signed with AWS
Signature Version 4 here (stdlib `hmac`/`hashlib`) rather than through boto3, so that S3 reads
share the guarded connection, limits and retries above; docs/placement.md ("Fetching models")
gives the reasoning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import ipaddress
import os
import random
import re
import socket
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, ClassVar, Literal

from kubeseer import metrics

__all__ = [
    "BadURLError",
    "CacheError",
    "DigestMismatchError",
    "FetchError",
    "FetchPolicy",
    "FetchedModel",
    "ForbiddenAddressError",
    "HTTPStatusError",
    "ModelSource",
    "S3Credentials",
    "S3Endpoint",
    "TLSError",
    "TooLargeError",
    "TooManyRedirectsError",
    "UnreachableError",
    "address_refusal",
    "fetch",
    "from_bytes",
    "sign_s3_get",
]

GIB = 1 << 30
_CHUNK = 1 << 20
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_INTERNAL_SUFFIXES = (".svc", ".cluster.local", ".localhost", ".internal")
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> the addresses the host resolves to, as strings."""


# --- errors -----------------------------------------------------------------------------------


class FetchError(Exception):
    """Base of every fetch failure; `failure` is the metric label, `transient` says retry later."""

    default_failure: ClassVar[metrics.FetchFailure] = metrics.FetchFailure.INVALID
    transient: ClassVar[bool] = False

    def __init__(
        self, message: str, *, url: str | None = None, failure: metrics.FetchFailure | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.failure = failure or self.default_failure


class BadURLError(FetchError):
    """The URL cannot be fetched as written (scheme, host, credentials in it, bad digest)."""


class ForbiddenAddressError(FetchError):
    """The host is, or resolves to, an address the SSRF guard refuses."""

    default_failure = metrics.FetchFailure.REFUSED


class TooLargeError(FetchError):
    """The model is larger than the policy's `max_bytes`."""

    default_failure = metrics.FetchFailure.TOO_LARGE


class DigestMismatchError(FetchError):
    """The bytes do not hash to the sha256 the DLJob names."""

    default_failure = metrics.FetchFailure.DIGEST_MISMATCH


class TooManyRedirectsError(FetchError):
    """More redirects than `max_redirects`, or a redirect the fetcher will not follow."""


class TLSError(FetchError):
    """The server's certificate does not verify for the URL's host: final, never retried."""

    default_failure = metrics.FetchFailure.REFUSED


class HTTPStatusError(FetchError):
    """The server answered with a final (non-retried) error status."""

    def __init__(self, message: str, *, url: str | None = None, status: int) -> None:
        # 404/410 are `not_found`, 401/403 `refused` (bad or missing credentials), else `invalid`.
        if status in (404, 410):
            failure = metrics.FetchFailure.NOT_FOUND
        elif status in (401, 403):
            failure = metrics.FetchFailure.REFUSED
        else:
            failure = metrics.FetchFailure.INVALID
        super().__init__(message, url=url, failure=failure)
        self.status = status


class UnreachableError(FetchError):
    """Network failure, timeout or server error that outlasted every retry."""

    default_failure = metrics.FetchFailure.UNREACHABLE
    transient = True


class CacheError(FetchError):
    """The model cache directory cannot be written (a problem of the operator's volume)."""

    default_failure = metrics.FetchFailure.UNREACHABLE
    transient = True


# --- values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """A model URL (http, https or s3://bucket/key) and the sha256 the DLJob expects, if any."""

    url: str
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.sha256 is not None:
            _check_digest_format(self.sha256)


@dataclass(frozen=True)
class S3Endpoint:
    """The S3-compatible endpoint the admin configures for s3:// models.

    `addressing` is `path` (`endpoint/bucket/key`: MinIO, Ceph, most in-cluster stores) or
    `virtual` (`bucket.endpoint/key`: AWS). The endpoint's host is trusted by configuration: it
    is exempt from the address checks (it is often an in-cluster Service), not from the limits.
    """

    url: str
    region: str = "us-east-1"
    addressing: Literal["path", "virtual"] = "path"

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadURLError(f"S3 endpoint {self.url!r} must be an http(s) URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise BadURLError(f"S3 endpoint {self.url!r} must not have a path or query")


@dataclass(frozen=True)
class S3Credentials:
    """Access key pair (and session token) read by the operator from the admin's Secret."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def _system_resolver(host: str, port: int) -> Sequence[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class FetchPolicy:
    """Limits, security settings and cache for fetching; the operator builds one from its config.

    Args:
        max_bytes: largest model accepted (the body is cut off past it).
        connect_timeout_s: TCP (and TLS) connect timeout of one attempt.
        read_timeout_s: longest wait for the next bytes of a response.
        total_timeout_s: deadline for the whole fetch, retries included (defeats trickling).
        retries: extra attempts after a transient failure.
        backoff_base_s, backoff_max_s: delay before retry n is uniform in
            [d/2, d] with d = min(backoff_max_s, backoff_base_s * 2**n).
        max_redirects: redirects followed per attempt.
        allowed_hosts: host names or literal addresses exempt from the address checks; a leading
            dot (`.models.example`) allows a domain and its subdomains.
        forbidden_networks: more refused ranges, e.g. the cluster's service and pod CIDRs when
            they are not private addresses.
        cache_dir: where verified models are kept, named by sha256.
        cache_max_bytes: bound on the cache; least recently used models are removed past it.
        ca_file: PEM bundle of the CAs to trust for https instead of the system's (model
            servers behind a private CA).
        s3_endpoint, s3_credentials: for s3:// URLs (credentials None: anonymous requests).
        resolver: host name resolution (tests substitute one; the default is the system's).
    """

    max_bytes: int = 2 * GIB
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 600.0
    retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    max_redirects: int = 5
    allowed_hosts: frozenset[str] = frozenset()
    forbidden_networks: tuple[_IPNetwork, ...] = ()
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache/kubeseer/models")
    cache_max_bytes: int = 8 * GIB
    ca_file: Path | None = None
    s3_endpoint: S3Endpoint | None = None
    s3_credentials: S3Credentials | None = None
    user_agent: str = "kubeseer-fetch/1"
    resolver: Resolver = _system_resolver

    def __post_init__(self) -> None:
        positive = {
            "max_bytes": self.max_bytes,
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "total_timeout_s": self.total_timeout_s,
            "cache_max_bytes": self.cache_max_bytes,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"fetch policy {name} must be positive, got {value}")
        if self.retries < 0 or self.max_redirects < 0:
            raise ValueError("fetch policy retries and max_redirects must not be negative")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError("fetch policy needs 0 <= backoff_base_s <= backoff_max_s")


@dataclass(frozen=True)
class FetchedModel:
    """A verified model on disk in the digest cache.

    The file may be evicted by later fetches once the cache is over its bound, so callers read it
    right away (`read_bytes`) rather than keeping the path.
    """

    path: Path
    sha256: str
    size: int
    source: str
    from_cache: bool

    def read_bytes(self) -> bytes:
        """The model's bytes."""
        return self.path.read_bytes()


# --- entry points -----------------------------------------------------------------------------


def fetch(source: ModelSource, policy: FetchPolicy) -> FetchedModel:
    """Fetch `source` under `policy`, from the digest cache when the DLJob names its sha256."""
    cache = _DigestCache(policy.cache_dir, policy.cache_max_bytes)
    if source.sha256 is not None:
        hit = cache.get(source.sha256)
        if hit is not None:
            return FetchedModel(
                path=hit[0], sha256=source.sha256, size=hit[1], source=source.url, from_cache=True
            )
    request = _initial_request(source.url, policy)
    deadline = time.monotonic() + policy.total_timeout_s
    attempt = 0
    while True:
        try:
            with cache.staging() as (tmp_path, sink):
                digest, size = _attempt(request, policy, deadline, sink)
                _check_digest(digest, source.sha256, source.url)
                path = cache.put(tmp_path, digest)
            return FetchedModel(
                path=path, sha256=digest, size=size, source=source.url, from_cache=False
            )
        except UnreachableError:
            attempt += 1
            if attempt > policy.retries:
                raise
            delay = _backoff(policy, attempt)
            if time.monotonic() + delay >= deadline:
                raise
            time.sleep(delay)


def from_bytes(
    data: bytes, policy: FetchPolicy, *, sha256: str | None = None, source: str = "bytes"
) -> FetchedModel:
    """Admit bytes the operator already holds (a ConfigMap's binaryData) under the same rules."""
    if sha256 is not None:
        _check_digest_format(sha256)
    if len(data) > policy.max_bytes:
        raise TooLargeError(
            f"the model in {source} has {len(data)} bytes, more than the limit of "
            f"{policy.max_bytes}"
        )
    digest = hashlib.sha256(data).hexdigest()
    _check_digest(digest, sha256, source)
    cache = _DigestCache(policy.cache_dir, policy.cache_max_bytes)
    hit = cache.get(digest)
    if hit is not None:
        return FetchedModel(
            path=hit[0], sha256=digest, size=len(data), source=source, from_cache=True
        )
    with cache.staging() as (tmp_path, sink):
        sink.write(data)
        sink.flush()
        path = cache.put(tmp_path, digest)
    return FetchedModel(path=path, sha256=digest, size=len(data), source=source, from_cache=False)


# --- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    """One GET: the URL to connect to, whether its host is trusted, and how to sign it."""

    url: str
    trusted_host: str | None
    sign: Callable[[str, str], dict[str, str]] | None
    follow_redirects: bool


def _initial_request(url: str, policy: FetchPolicy) -> _Request:
    parts = _split(url)
    if parts.scheme in ("http", "https"):
        return _Request(url=url, trusted_host=None, sign=None, follow_redirects=True)
    if parts.scheme != "s3":
        raise BadURLError(f"unsupported URL scheme {parts.scheme!r} in {url!r}", url=url)
    endpoint = policy.s3_endpoint
    if endpoint is None:
        raise BadURLError(
            f"{url!r} is an s3:// URL but the admin configured no S3 endpoint", url=url
        )
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if not bucket or not key:
        raise BadURLError(f"{url!r} must be s3://bucket/key", url=url)
    target = _s3_object_url(endpoint, bucket, key)
    credentials = policy.s3_credentials

    def sign(host: str, path: str) -> dict[str, str]:
        if credentials is None:
            return {}
        return sign_s3_get(host, path, endpoint.region, credentials, dt.datetime.now(dt.UTC))

    return _Request(
        url=target,
        trusted_host=_split(target).hostname,
        sign=sign,
        follow_redirects=False,
    )


def _s3_object_url(endpoint: S3Endpoint, bucket: str, key: str) -> str:
    base = urllib.parse.urlsplit(endpoint.url)
    quoted_key = urllib.parse.quote(key, safe="/~")
    if endpoint.addressing == "virtual":
        return f"{base.scheme}://{bucket}.{base.netloc}/{quoted_key}"
    return f"{base.scheme}://{base.netloc}/{urllib.parse.quote(bucket, safe='')}/{quoted_key}"


def sign_s3_get(
    host: str,
    path: str,
    region: str,
    credentials: S3Credentials,
    now: dt.datetime,
) -> dict[str, str]:
    """Headers that sign `GET path` on `host` with AWS Signature Version 4 (service s3).

    `host` is the Host header value (with `:port` when not the default); `path` is already
    URI-encoded, as sent. The payload hash is that of the empty body, as a GET has none.
    """
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload_hash = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "GET",
            path,
            "",
            "".join(f"{name}:{headers[name].strip()}\n" for name in sorted(headers)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + credentials.secret_access_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {name: value for name, value in headers.items() if name != "host"}
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return out


def _attempt(
    request: _Request, policy: FetchPolicy, deadline: float, sink: BinaryIO
) -> tuple[str, int]:
    """One try: follow redirects (each hop guarded) and stream the body; returns (sha256, size)."""
    url = request.url
    for _hop in range(policy.max_redirects + 1):
        parts = _split(url)
        if parts.scheme not in ("http", "https"):
            raise TooManyRedirectsError(f"refusing to follow a redirect to {url!r}", url=url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        trusted = host == request.trusted_host or _host_allowed(host, policy.allowed_hosts)
        address = _guarded_address(host, port, policy, trusted=trusted, url=url)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        host_header = _host_header(host, port, parts.scheme)
        headers = {
            "Host": host_header,
            "User-Agent": policy.user_agent,
            "Accept-Encoding": "identity",
        }
        if request.sign is not None:
            headers.update(request.sign(host_header, parts.path or "/"))
        connection = _connection(parts.scheme, host, port, address, policy, deadline)
        with contextlib.ExitStack() as cleanup:
            # Closing the connection alone leaves the response's file (and so the socket) open.
            cleanup.callback(connection.close)
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
            except ssl.SSLCertVerificationError as e:
                raise TLSError(f"{url}: {e.verify_message or e}", url=url) from e
            except (OSError, http.client.HTTPException) as e:
                raise UnreachableError(f"cannot GET {url}: {_describe(e)}", url=url) from e
            cleanup.callback(response.close)
            if response.status in _REDIRECTS and request.follow_redirects:
                location = response.getheader("Location")
                if not location:
                    raise HTTPStatusError(
                        f"{url} answered {response.status} without a Location",
                        url=url,
                        status=response.status,
                    )
                nxt = urllib.parse.urljoin(url, location)
                if parts.scheme == "https" and _split(nxt).scheme == "http":
                    raise TooManyRedirectsError(
                        f"refusing the redirect from https to http ({nxt})", url=url
                    )
                url = nxt
                continue
            _raise_for_status(response, url)
            return _stream(response, url, policy, deadline, sink)
    raise TooManyRedirectsError(
        f"more than {policy.max_redirects} redirects starting at {request.url}", url=request.url
    )


def _raise_for_status(response: http.client.HTTPResponse, url: str) -> None:
    status = response.status
    if 200 <= status < 300:
        return
    detail = response.reason or ""
    if status == 429 or status >= 500:
        raise UnreachableError(f"{url} answered {status} {detail}".rstrip(), url=url)
    raise HTTPStatusError(f"{url} answered {status} {detail}".rstrip(), url=url, status=status)


def _stream(
    response: http.client.HTTPResponse,
    url: str,
    policy: FetchPolicy,
    deadline: float,
    sink: BinaryIO,
) -> tuple[str, int]:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
        raise TooLargeError(
            f"{url} declares {int(declared)} bytes, more than the limit of {policy.max_bytes}",
            url=url,
        )
    digest = hashlib.sha256()
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise UnreachableError(
                f"{url} did not finish within {policy.total_timeout_s:g} s", url=url
            )
        try:
            chunk = response.read1(_CHUNK)
        except (OSError, http.client.HTTPException) as e:
            raise UnreachableError(f"reading {url} failed: {_describe(e)}", url=url) from e
        if not chunk:
            break
        size += len(chunk)
        if size > policy.max_bytes:
            raise TooLargeError(
                f"{url} sent more than the limit of {policy.max_bytes} bytes", url=url
            )
        digest.update(chunk)
        sink.write(chunk)
    if declared is not None and declared.isdigit() and size != int(declared):
        raise UnreachableError(f"{url} ended after {size} of {declared} bytes", url=url)
    sink.flush()
    return digest.hexdigest(), size


def _connection(
    scheme: str,
    host: str,
    port: int,
    address: str,
    policy: FetchPolicy,
    deadline: float,
) -> http.client.HTTPConnection:
    connect_timeout = max(0.001, min(policy.connect_timeout_s, deadline - time.monotonic()))
    if scheme == "https":
        return _PinnedHTTPSConnection(
            host,
            port,
            address,
            connect_timeout,
            policy.read_timeout_s,
            ssl.create_default_context(cafile=policy.ca_file),
        )
    return _PinnedHTTPConnection(host, port, address, connect_timeout, policy.read_timeout_s)


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


# --- the SSRF guard ---------------------------------------------------------------------------


def _guarded_address(host: str, port: int, policy: FetchPolicy, *, trusted: bool, url: str) -> str:
    """Resolve `host` once and return the address to connect to, refusing internal targets."""
    literal = _literal_address(host)
    if not trusted and literal is None:
        lowered = host.lower().rstrip(".")
        if lowered == "localhost" or lowered.endswith(_INTERNAL_SUFFIXES):
            raise ForbiddenAddressError(
                f"{host!r} is a cluster-internal or local name; ask the admin to allow-list it",
                url=url,
            )
        if "." not in lowered:
            raise ForbiddenAddressError(
                f"{host!r} is a single-label name, which resolves through the cluster's search "
                "domains; use a fully qualified public name or ask the admin to allow-list it",
                url=url,
            )
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = list(policy.resolver(host, port))
        except (OSError, UnicodeError) as e:
            raise UnreachableError(f"cannot resolve {host!r}: {_describe(e)}", url=url) from e
        if not addresses:
            raise UnreachableError(f"{host!r} resolves to no address", url=url)
    if not trusted:
        for text in addresses:
            reason = address_refusal(ipaddress.ip_address(text), policy.forbidden_networks)
            if reason is not None:
                raise ForbiddenAddressError(
                    f"{host!r} resolves to {text}, {reason}; ask the admin to allow-list the "
                    "host if this is intended",
                    url=url,
                )
    return addresses[0]


def address_refusal(address: _IPAddress, extra: Sequence[_IPNetwork] = ()) -> str | None:
    """Why the SSRF guard refuses `address`, or None for a public unicast address.

    `extra` are further refused networks (the cluster's service and pod CIDRs). IPv6 addresses
    that embed an IPv4 address (IPv4-mapped, 6to4, Teredo) are judged by the embedded address too.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = (
            address.ipv4_mapped
            or address.sixtofour
            or (address.teredo[1] if address.teredo else None)
        )
        if embedded is not None:
            inner = address_refusal(embedded, extra)
            if inner is not None:
                return f"which embeds {embedded}, {inner}"
    for network in extra:
        if address.version == network.version and address in network:
            return f"inside the cluster network {network}"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "not a unicast address"
    if not address.is_global:
        return "a private or otherwise non-public address"
    return None


def _literal_address(host: str) -> _IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _host_allowed(host: str, allowed: frozenset[str]) -> bool:
    lowered = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().rstrip(".")
        if entry.startswith("."):
            if lowered == entry[1:] or lowered.endswith(entry):
                return True
        elif lowered == entry:
            return True
    return False


def _host_header(host: str, port: int, scheme: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return shown if port == default else f"{shown}:{port}"


def _split(url: str) -> urllib.parse.SplitResult:
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError as e:
        raise BadURLError(f"malformed URL {url!r}: {e}", url=url) from e
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise BadURLError(f"URL {url!r} has no host", url=url)
        if parts.username is not None or parts.password is not None:
            raise BadURLError(
                f"URL {url!r} carries credentials; use an s3:// URL with a Secret instead", url=url
            )
    return parts


# --- digests, retries, cache ------------------------------------------------------------------


def _check_digest_format(sha256: str) -> None:
    if not _SHA256_HEX.fullmatch(sha256):
        raise BadURLError(f"sha256 {sha256!r} is not 64 lowercase hexadecimal digits")


def _check_digest(actual: str, expected: str | None, where: str) -> None:
    if expected is not None and actual != expected:
        raise DigestMismatchError(
            f"the model from {where} has sha256 {actual}, not the {expected} the DLJob names",
            url=where,
        )


def _backoff(policy: FetchPolicy, attempt: int) -> float:
    ceiling = min(policy.backoff_max_s, policy.backoff_base_s * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class _DigestCache:
    """Verified models named by sha256 under `root`, bounded by `max_bytes` (LRU by mtime)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def get(self, digest: str) -> tuple[Path, int] | None:
        """The cached model and its size, marked as recently used; None when absent."""
        path = self.root / digest
        try:
            os.utime(path)
            return path, path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CacheError(f"cannot use the model cache at {self.root}: {e}") from e

    @contextlib.contextmanager
    def staging(self) -> Iterator[tuple[Path, BinaryIO]]:
        """A temporary file beside the cache (same file system, so `put` is an atomic rename)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.root, prefix=".partial-")
        except OSError as e:
            raise CacheError(f"cannot write to the model cache at {self.root}: {e}") from e
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as sink:
                yield path, sink
        finally:
            path.unlink(missing_ok=True)

    def put(self, staged: Path, digest: str) -> Path:
        final = self.root / digest
        try:
            os.replace(staged, final)
        except OSError as e:
            raise CacheError(f"cannot store the model in the cache at {self.root}: {e}") from e
        self._evict(keep=final)
        return final

    def _evict(self, keep: Path) -> None:
        entries = []
        for path in self.root.iterdir():
            if not _SHA256_HEX.fullmatch(path.name):
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                entries.append((stat.st_mtime, path, stat.st_size))
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries, key=lambda e: (e[0], e[1].name)):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
