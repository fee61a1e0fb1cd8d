"""Why a model could not be fetched: one class per failure the DLJob reports.

Decided once, where the HTTP response, socket error or size check happens. Each class carries
its metric label (`failure`) and, through `OperatorError.transient`, whether a retry may
succeed; the operator maps the class to the DLJob's `ModelReady` reason without looking inside.
"""

from __future__ import annotations

from typing import ClassVar

from kubeseer import metrics
from kubeseer.operator import errors


class FetchError(errors.OperatorError):
    """Base of every fetch failure; `failure` is the metric label, `url` what was fetched."""

    failure: ClassVar[metrics.FetchFailure] = metrics.FetchFailure.INVALID

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class BadURLError(FetchError):
    """The URL cannot be fetched as written (scheme, host, credentials in it, bad digest)."""


class TooManyRedirectsError(FetchError):
    """More redirects than `max_redirects`, or a redirect the fetcher will not follow."""


class HTTPStatusError(FetchError):
    """The server answered with a final error status that has no class of its own."""

    def __init__(self, message: str, *, url: str | None = None, status: int) -> None:
        super().__init__(message, url=url)
        self.status = status


class ForbiddenAddressError(FetchError):
    """The host is, or resolves to, an address the SSRF guard refuses."""

    failure = metrics.FetchFailure.REFUSED


class TLSError(FetchError):
    """The server's certificate does not verify for the URL's host: final, never retried."""

    failure = metrics.FetchFailure.REFUSED


class AccessDeniedError(FetchError):
    """401 or 403: the source refuses the operator's credentials (or their absence)."""

    failure = metrics.FetchFailure.REFUSED


class NotFoundError(FetchError):
    """404 or 410 from a URL; a ConfigMap or key that does not exist."""

    failure = metrics.FetchFailure.NOT_FOUND


class TooLargeError(FetchError):
    """The model is larger than the policy's `max_bytes`."""

    failure = metrics.FetchFailure.TOO_LARGE


class DigestMismatchError(FetchError):
    """The bytes do not hash to the sha256 the DLJob names."""

    failure = metrics.FetchFailure.DIGEST_MISMATCH


class TooSlowError(FetchError):
    """The source sent under the minimum rate, or the fetch missed its total deadline.

    Final: retrying a source that trickles would hold a fetch worker for as long again.
    """

    failure = metrics.FetchFailure.TOO_SLOW


class UnreachableError(FetchError):
    """Network failure, timeout or server error that outlasted every retry."""

    failure = metrics.FetchFailure.UNREACHABLE
    transient = True


class CacheError(FetchError):
    """The model cache directory cannot be written (a problem of the operator's volume)."""

    failure = metrics.FetchFailure.UNREACHABLE
    transient = True


class CancelledError(FetchError):
    """The fetch was cancelled (its DLJob was deleted); nobody is waiting for the answer."""
