"""Why the Job controller could not create an attempt's pods: reading its `FailedCreate` events.

A Job's pods are created by the Job controller, not the operator, so a namespace ResourceQuota,
a LimitRange, Pod Security admission, a ValidatingAdmissionPolicy or a webhook that refuses them
refuses the Job controller. The Job's status does not say so (it only shows no pods); the one
record is the Warning event the controller posts on the Job each time it tries, `FailedCreate`,
whose message is `Error creating: ` and the API server's answer, e.g.::

    Error creating: pods "train-0-7gfwp" is forbidden: exceeded quota: gpus, requested: pods=1, ...
    Error creating: pods "train-0-zhg56" is forbidden: violates PodSecurity "restricted:latest": ...
    Error creating: pods "train-0-2l22n" is forbidden: maximum cpu usage per Container is 1, ...

Past ten such events in ten minutes the event recorder merges them into one whose message starts
`(combined from similar events): `. The HTTP status is not in the event, so the kind of refusal
is read from the words: a quota that is exceeded may clear (other pods finish, the quota grows),
an API server or webhook that could not answer may answer later, and anything else is admission
judging the pod as written, which it will judge the same way on every retry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

FAILED_CREATE = "FailedCreate"
"""The reason of the Job controller's event for a pod it could not create."""


class RefusalKind(StrEnum):
    """What a refusal means for the DLJob."""

    QUOTA = "quota"
    """A namespace ResourceQuota has no room: the pods are created once it has."""
    UNAVAILABLE = "unavailable"
    """The API server, a webhook or something the pod names could not be reached or found (a
    webhook down, a timeout, a missing ServiceAccount): the Job controller keeps trying."""
    POLICY = "policy"
    """Admission refuses the pod as written (Pod Security, a LimitRange, a policy or webhook
    that denies it, validation): every retry gets the same answer."""


@dataclass(frozen=True)
class Refusal:
    """The latest refusal of an attempt's pods."""

    kind: RefusalKind
    message: str
    """The API server's answer, without the controller's prefix or the pod's generated name."""
    at: datetime


_PREFIXES = ("(combined from similar events): ", "Error creating: ")
_POD_NAME = re.compile(r'^pods? "[^"]*" ')
_UNAVAILABLE = re.compile(
    r"failed calling webhook|Internal error occurred|the server is currently unable|"
    r"Timeout:|timed out|deadline exceeded|connection refused|too many requests|rate limit|"
    r"Operation cannot be fulfilled|please apply your changes|being terminated|try again|"
    r"not found|was found|etcdserver",
    re.IGNORECASE,
)


def classify(message: str) -> RefusalKind:
    """The kind of refusal a `FailedCreate` message reports.

    `exceeded quota` is ResourceQuota admission finding no room; its other refusal, `failed
    quota: ... must specify`, is a template without the requests the quota counts, which is
    the template's fault and so a policy refusal.
    """
    if "exceeded quota" in message:
        return RefusalKind.QUOTA
    if _UNAVAILABLE.search(message):
        return RefusalKind.UNAVAILABLE
    return RefusalKind.POLICY


def answer(message: str) -> str:
    """The API server's answer in a `FailedCreate` message: without the recorder's and the
    controller's prefixes, and without the generated pod name, which differs every try."""
    for prefix in _PREFIXES:
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return _POD_NAME.sub("pods ", message, count=1).strip()


def latest(events: Iterable[Mapping[str, Any]], *, since: datetime | None) -> Refusal | None:
    """The most recent `FailedCreate` refusal among a Job's events, ignoring those last seen
    before `since` (the Job's start: a refusal from before it was last resumed is history)."""
    newest: tuple[datetime, str] | None = None
    for event in events:
        if event.get("reason") != FAILED_CREATE:
            continue
        at = event_time(event)
        if at is None or (since is not None and at < since):
            continue
        if newest is None or at >= newest[0]:
            newest = (at, str(event.get("message") or ""))
    if newest is None:
        return None
    text = answer(newest[1])
    return Refusal(classify(text), text, newest[0])


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an event was last seen: core/v1's `lastTimestamp`, else the events.k8s.io fields
    (`series.lastObservedTime`, `eventTime`), else `firstTimestamp`."""
    series = event.get("series") or {}
    for raw in (
        event.get("lastTimestamp"),
        series.get("lastObservedTime"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
    ):
        if raw:
            return parse_time(str(raw))
    return None


def parse_time(raw: str) -> datetime | None:
    """An RFC 3339 time as the API server writes it (`Z`, optional fraction), in UTC."""
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
