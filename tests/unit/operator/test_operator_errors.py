"""API failures are classified once, from the status and message, and retried by one loop."""

from __future__ import annotations

import pytest

from kubeseer.operator import backoff, errors


@pytest.mark.parametrize(
    ("status", "message", "kind", "transient"),
    [
        (None, "connection refused", errors.UnavailableError, True),
        (503, "etcdserver: leader changed", errors.UnavailableError, True),
        (429, "too many requests", errors.UnavailableError, True),
        (404, 'pods "x" not found', errors.NotFoundError, False),
        (409, 'pods "x" already exists', errors.ConflictError, False),
        (422, "spec.containers[0].image: Required value", errors.InvalidObjectError, False),
        (400, "cannot unmarshal number into Go struct field", errors.InvalidObjectError, False),
        (
            403,
            'pods "x" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1',
            errors.QuotaExceededError,
            True,
        ),
        (403, 'pods is forbidden: User "x" cannot create resource', errors.ApiError, False),
    ],
)
def test_an_api_failure_has_one_class_that_says_whether_to_retry(
    status: int | None, message: str, kind: type[errors.ApiError], transient: bool
) -> None:
    chosen = errors.classify(status, message)
    assert chosen is kind
    assert chosen.transient is transient


class Flaky:
    def __init__(self, failures: list[errors.OperatorError]) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_transient_failures_are_retried_with_growing_jittered_delays() -> None:
    slept: list[float] = []
    call = Flaky([errors.UnavailableError("503"), errors.UnavailableError("503")])
    result = backoff.retrying(
        call, backoff.Backoff(tries=3, base_s=1.0, max_s=8.0), sleep=slept.append
    )
    assert (result, call.calls) == ("done", 3)
    assert 0.5 <= slept[0] <= 1.0 and 1.0 <= slept[1] <= 2.0


def test_a_permanent_failure_or_the_last_try_is_raised_at_once() -> None:
    slept: list[float] = []
    with pytest.raises(errors.NotFoundError):
        backoff.retrying(
            Flaky([errors.NotFoundError("404")]), backoff.Backoff(), sleep=slept.append
        )
    call = Flaky([errors.UnavailableError("503")] * 5)
    with pytest.raises(errors.UnavailableError):
        backoff.retrying(call, backoff.Backoff(tries=2, base_s=0.0, max_s=0.0), sleep=slept.append)
    assert call.calls == 2


def test_no_retry_starts_whose_delay_would_end_past_the_deadline() -> None:
    call = Flaky([errors.UnavailableError("503")] * 5)
    with pytest.raises(errors.UnavailableError):
        backoff.retrying(
            call, backoff.Backoff(tries=5, base_s=10.0, max_s=10.0), deadline=0.0, sleep=print
        )
    assert call.calls == 1
