"""Fetching a model: the request for a URL, retries, verification, and the digest cache.

`fetch` always asks the source: the sha256 a DLJob names is checked against the bytes the source
serves, never used to skip asking it (which one DLJob's digest could otherwise use to run on
another tenant's model). Whether a verified source may be served from the cache without the
network is the caller's decision (`models.ModelStore` remembers which source served which
digest). Transient failures are retried with `backoff`; every wait is cancellable.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from kubeseer import digests
from kubeseer.operator import backoff
from kubeseer.operator.fetch import cache, cancel, errors, guard, policy, s3, transfer


@dataclass(frozen=True)
class FetchedModel:
    """A verified model in the digest cache (evictable: take a `checkout` to read it later)."""

    path: Path
    sha256: str
    size: int
    source: str
    from_cache: bool


def check_digest_format(sha256: str) -> None:
    """Refuse anything but 64 lower-case hex digits."""
    if not digests.is_sha256(sha256):
        raise errors.BadURLError(f"sha256 {sha256!r} is not 64 lowercase hexadecimal digits")


def fetch(
    url: str,
    rules: policy.FetchPolicy,
    *,
    sha256: str | None = None,
    cancellation: cancel.Cancellation | None = None,
) -> FetchedModel:
    """Download `url` under `rules` into the cache, checked against `sha256` when given.

    Raises:
        FetchError: a subclass naming why (see `fetch.errors`).
    """
    if sha256 is not None:
        check_digest_format(sha256)
    cancellation = cancellation or cancel.Cancellation()
    request = _request(url, rules)
    store = cache.DigestCache(rules.cache_dir, rules.cache_max_bytes)
    deadline = time.monotonic() + rules.total_timeout_s

    def attempt() -> FetchedModel:
        with store.staging() as (staged, sink):
            body = transfer.get(request, rules, deadline, sink, cancellation)
            _check_digest(body.sha256, sha256, url)
            path = store.put(staged, body.sha256)
        return FetchedModel(path, body.sha256, body.size, url, from_cache=False)

    def wait(seconds: float) -> None:
        if cancellation.wait(seconds):
            raise errors.CancelledError(f"the fetch of {url} was cancelled", url=url)

    return backoff.retrying(attempt, rules.retry_backoff, deadline=deadline, sleep=wait)


def from_bytes(
    data: bytes, rules: policy.FetchPolicy, *, sha256: str | None = None, source: str = "bytes"
) -> FetchedModel:
    """Admit bytes the operator already holds (a ConfigMap's binaryData) under the same rules."""
    if sha256 is not None:
        check_digest_format(sha256)
    if len(data) > rules.max_bytes:
        raise errors.TooLargeError(
            f"the model in {source} has {len(data)} bytes, more than the limit of {rules.max_bytes}"
        )
    digest = hashlib.sha256(data).hexdigest()
    _check_digest(digest, sha256, source)
    store = cache.DigestCache(rules.cache_dir, rules.cache_max_bytes)
    hit = store.get(digest)
    if hit is not None:
        return FetchedModel(hit[0], digest, len(data), source, from_cache=True)
    with store.staging() as (staged, sink):
        sink.write(data)
        sink.flush()
        path = store.put(staged, digest)
    return FetchedModel(path, digest, len(data), source, from_cache=False)


def _check_digest(actual: str, expected: str | None, where: str) -> None:
    if expected is not None and actual != expected:
        raise errors.DigestMismatchError(
            f"the model from {where} has sha256 {actual}, not the {expected} the DLJob names",
            url=where,
        )


def _request(url: str, rules: policy.FetchPolicy) -> transfer.Request:
    """The GET for an http(s) URL, or the signed GET on the S3 endpoint for s3://bucket/key."""
    parts = guard.split(url)
    if parts.scheme in ("http", "https"):
        return transfer.Request(url)
    if parts.scheme != "s3":
        raise errors.BadURLError(f"unsupported URL scheme {parts.scheme!r} in {url!r}", url=url)
    endpoint = rules.s3_endpoint
    if endpoint is None:
        raise errors.BadURLError(
            f"{url!r} is an s3:// URL but the admin configured no S3 endpoint", url=url
        )
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if not bucket or not key:
        raise errors.BadURLError(f"{url!r} must be s3://bucket/key", url=url)
    target = s3.object_url(endpoint, bucket, key)
    credentials = rules.s3_credentials

    def sign(host: str, path: str) -> dict[str, str]:
        if credentials is None:
            return {}
        return s3.sign_get(host, path, endpoint.region, credentials, dt.datetime.now(dt.UTC))

    return transfer.Request(
        target, trusted_host=guard.split(target).hostname, sign=sign, follow_redirects=False
    )
