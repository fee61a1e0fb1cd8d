"""What a fetch may do: limits, timeouts, retries, the SSRF guard's exceptions, the cache, S3.

One frozen value the operator builds from its configuration at start; every function of the
fetch package reads its limits from here, so a test can tighten any of them.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kubeseer import units
from kubeseer.operator import backoff
from kubeseer.operator.fetch import errors

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> the addresses the host resolves to, as strings."""


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
            raise errors.BadURLError(f"S3 endpoint {self.url!r} must be an http(s) URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise errors.BadURLError(f"S3 endpoint {self.url!r} must not have a path or query")


@dataclass(frozen=True)
class S3Credentials:
    """Access key pair (and session token) read by the operator from the admin's Secret."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def system_resolver(host: str, port: int) -> Sequence[str]:
    """The addresses the system resolver returns for `host`, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class FetchPolicy:
    """Limits, security settings and cache for fetching; the operator builds one from its config.

    Args:
        max_bytes: largest model accepted (the body is cut off past it).
        connect_timeout_s: TCP (and TLS) connect timeout of one attempt.
        read_timeout_s: longest silence between bytes of a response.
        total_timeout_s: deadline for the whole fetch, retries included.
        min_rate_bytes_s: slowest average rate accepted once `rate_grace_s` of the body have
            passed; a source that trickles fails as too slow instead of holding a worker.
        rate_grace_s: seconds of a body before its rate is judged (slow start, TLS, caches).
        retries: extra attempts after a transient failure.
        backoff_base_s, backoff_max_s: delays between attempts (`backoff.Backoff`).
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

    max_bytes: int = 2 * units.GIB
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 600.0
    min_rate_bytes_s: float = 256 * 1024
    rate_grace_s: float = 10.0
    retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    max_redirects: int = 5
    allowed_hosts: frozenset[str] = frozenset()
    forbidden_networks: tuple[IPNetwork, ...] = ()
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache/kubeseer/models")
    cache_max_bytes: int = 8 * units.GIB
    ca_file: Path | None = None
    s3_endpoint: S3Endpoint | None = None
    s3_credentials: S3Credentials | None = None
    user_agent: str = "kubeseer-fetch/1"
    resolver: Resolver = system_resolver

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
        if self.min_rate_bytes_s < 0 or self.rate_grace_s < 0:
            raise ValueError("fetch policy min_rate_bytes_s and rate_grace_s must not be negative")
        if self.retries < 0 or self.max_redirects < 0:
            raise ValueError("fetch policy retries and max_redirects must not be negative")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError("fetch policy needs 0 <= backoff_base_s <= backoff_max_s")

    @property
    def retry_backoff(self) -> backoff.Backoff:
        """Tries and delays of the download retries."""
        return backoff.Backoff(self.retries + 1, self.backoff_base_s, self.backoff_max_s)
