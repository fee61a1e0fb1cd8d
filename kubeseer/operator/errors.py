"""Why a call to the API server failed, decided once where the error is caught.

`kube` turns every `ApiException` and connection error into exactly one of these classes; the
rest of the operator asks `isinstance` and `transient`, never the HTTP status or the
`__cause__`. `transient` is a property of the class: retrying later may succeed (the API server
was unavailable, a quota may free up), or it will not (the object is refused as written).
Model fetching has its own hierarchy (`fetch.errors`), built the same way.
"""

from __future__ import annotations

from typing import ClassVar


class OperatorError(Exception):
    """Base of the operator's typed failures; `transient` says whether a retry may succeed."""

    transient: ClassVar[bool] = False


class ApiError(OperatorError):
    """The API server refused or failed a request; `status` is its HTTP status (None: no answer).

    Permanent unless a subclass says otherwise: a request the API server judged wrong (RBAC, a
    webhook, an unknown status) will be judged the same way again.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFoundError(ApiError):
    """404: the object does not exist (any more)."""


class ConflictError(ApiError):
    """409: an object of that name already exists, or the write lost a race."""


class InvalidObjectError(ApiError):
    """400 or 422: the object as written is refused (schema, validation, admission)."""


class QuotaExceededError(ApiError):
    """403 from a namespace ResourceQuota: may clear when other objects finish."""

    transient = True


class UnavailableError(ApiError):
    """No usable answer: timeout, connection error, 429 or 5xx."""

    transient = True


_UNAVAILABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def classify(status: int | None, message: str) -> type[ApiError]:
    """The class of an API failure from its HTTP status and the API server's message."""
    if status is None or status in _UNAVAILABLE_STATUS:
        return UnavailableError
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status in (400, 422):
        return InvalidObjectError
    if status == 403 and "exceeded quota" in message:
        return QuotaExceededError
    return ApiError
