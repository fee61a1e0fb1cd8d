"""Reading the Job controller's FailedCreate events: which refusal, and since when.

The messages are the ones kube-controller-manager and kube-apiserver 1.37.2 wrote on the local
control plane for a Job whose pods a quota, Pod Security, a LimitRange and a
ValidatingAdmissionPolicy refused.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kubeseer.operator import refusals

Kind = refusals.RefusalKind

QUOTA = (
    'Error creating: pods "q-7gfwp" is forbidden: exceeded quota: q, requested: pods=1, '
    "used: pods=0, limited: pods=0"
)
POD_SECURITY = (
    'Error creating: pods "ps-zhg56" is forbidden: violates PodSecurity "restricted:latest": '
    'allowPrivilegeEscalation != false (container "main" must set '
    "securityContext.allowPrivilegeEscalation=false)"
)
LIMIT_RANGE = (
    'Error creating: pods "lr-2l22n" is forbidden: maximum cpu usage per Container is 1, but '
    "limit is 2"
)
POLICY = (
    "Error creating: pods \"vap-dc762\" is forbidden: ValidatingAdmissionPolicy 'no-latest' with "
    "binding 'no-latest' denied request: images must be pinned by digest"
)
WEBHOOK_DENIED = (
    'Error creating: admission webhook "validate.kyverno.svc" denied the request: '
    "policy require-labels: label team is required"
)
WEBHOOK_DOWN = (
    'Error creating: Internal error occurred: failed calling webhook "validate.example.com": '
    'failed to call webhook: Post "https://hook.example.svc:443/validate": dial tcp '
    "10.0.0.7:443: connect: connection refused"
)
MUST_SPECIFY = (
    'Error creating: pods "c-x2v9q" is forbidden: failed quota: compute: must specify '
    "limits.cpu for: main"
)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (QUOTA, Kind.QUOTA),
        (f"(combined from similar events): {QUOTA}", Kind.QUOTA),
        (POD_SECURITY, Kind.POLICY),
        (LIMIT_RANGE, Kind.POLICY),
        (POLICY, Kind.POLICY),
        (WEBHOOK_DENIED, Kind.POLICY),
        (MUST_SPECIFY, Kind.POLICY),
        (WEBHOOK_DOWN, Kind.UNAVAILABLE),
        (
            'Error creating: pods "x-1" is forbidden: error looking up service account ml/trainer: '
            'serviceaccount "trainer" not found',
            Kind.UNAVAILABLE,
        ),
        (
            "Error creating: Timeout: request did not complete within requested timeout",
            Kind.UNAVAILABLE,
        ),
    ],
)
def test_each_refusal_is_read_as_what_it_means(message: str, kind: refusals.RefusalKind) -> None:
    """A quota may clear, an unanswered call may be answered, admission judging the pod as
    written answers the same way every time."""
    assert refusals.classify(refusals.answer(message)) is kind


def test_the_answer_drops_the_prefixes_and_the_pod_name_that_changes_every_try() -> None:
    combined = f"(combined from similar events): {QUOTA}"
    expected = (
        "pods is forbidden: exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0"
    )
    assert refusals.answer(QUOTA) == refusals.answer(combined) == expected
    assert refusals.answer(WEBHOOK_DENIED).startswith('admission webhook "validate.kyverno.svc"')


def event(message: str, last: str, reason: str = refusals.FAILED_CREATE) -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "type": "Warning",
        "firstTimestamp": last,
        "lastTimestamp": last,
        "count": 1,
    }


def test_the_latest_refusal_since_the_job_started_counts() -> None:
    """A quota refusal from before the Job was last resumed is history; the newest is read."""
    started = datetime(2026, 11, 25, 14, 47, 6, tzinfo=UTC)
    events = [
        event(QUOTA, "2026-11-25T14:46:40Z"),
        event(LIMIT_RANGE, "2026-11-25T14:47:09Z"),
        event(POD_SECURITY, "2026-11-25T14:47:08Z"),
        event("Created pod: x", "2026-11-25T14:47:30Z", reason="SuccessfulCreate"),
    ]
    found = refusals.latest(events, since=started)
    assert found is not None
    assert found.kind is Kind.POLICY
    assert found.message.startswith("pods is forbidden: maximum cpu usage per Container is 1")
    assert found.at == datetime(2026, 11, 25, 14, 47, 9, tzinfo=UTC)
    assert refusals.latest(events[:1], since=started) is None
    assert refusals.latest(events[:1], since=None) is not None
    assert refusals.latest([], since=None) is None


def test_events_of_the_events_api_are_timed_by_their_series_or_event_time() -> None:
    series = {"series": {"lastObservedTime": "2026-11-25T14:50:00.123456Z", "count": 4}}
    assert refusals.event_time({**series, "eventTime": "2026-11-25T14:40:00.000000Z"}) == datetime(
        2026, 11, 25, 14, 50, 0, 123456, tzinfo=UTC
    )
    assert refusals.event_time({"eventTime": "2026-11-25T14:40:00.000000Z"}) == datetime(
        2026, 11, 25, 14, 40, tzinfo=UTC
    )
    assert refusals.event_time({}) is None
    assert refusals.parse_time("not a time") is None
