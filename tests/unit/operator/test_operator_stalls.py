"""The stall watch: which attempts' Jobs lack pods or wait unschedulable, and when to look."""

from __future__ import annotations

from typing import Any

from kubeseer.operator import stalls, workload

Kind = stalls.StallKind


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(suspend: bool = False, parallelism: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "uid-job",
            "labels": {workload.LABEL_DLJOB: "train", workload.LABEL_ATTEMPT: "0"},
            "ownerReferences": [workload.owner_reference("train", "uid-dljob")],
        },
        "spec": {"suspend": suspend, "parallelism": parallelism},
        "status": status,
    }


def pod(name: str, *, node: str = "", unschedulable: bool = True) -> dict[str, Any]:
    conditions = (
        [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        if unschedulable
        else []
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {workload.LABEL_DLJOB: "train", stalls.JOB_NAME_LABEL: "train-0"},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Pending", "conditions": conditions},
    }


def kinds(watch: stalls.StallWatch[str]) -> list[Kind]:
    return [s.kind for s in watch.due()]


def test_a_job_that_lacks_pods_is_looked_at_after_the_grace_then_ever_less_often() -> None:
    clock = Clock()
    watch: stalls.StallWatch[str] = stalls.StallWatch(0.0, clock)
    watch.observe_job("ADDED", job(startTime="2026-11-25T14:00:00Z"))
    looks = []
    for _ in range(200):
        if kinds(watch) == [Kind.MISSING_PODS]:
            looks.append(clock.now - 100.0)
        clock.now += 1
    assert looks == [5, 15, 35, 75, 135, 195]  # 5 s grace, then 10, 20, 40, 60, 60


def test_a_job_with_its_pods_a_suspended_or_a_finished_one_is_not_looked_at() -> None:
    clock = Clock()
    watch: stalls.StallWatch[str] = stalls.StallWatch(0.0, clock)
    watch.observe_job("ADDED", job(parallelism=2, active=2))
    watch.observe_job(
        "ADDED", {**job(suspend=True), "metadata": {**job()["metadata"], "name": "b"}}
    )
    clock.now += 100
    assert watch.due() == []
    watch.observe_job("MODIFIED", job(parallelism=2, active=1))  # one of two refused
    clock.now += stalls.POD_GRACE_S
    (stall,) = watch.due()
    assert (stall.kind, stall.key, stall.dljob, stall.attempt) == (
        Kind.MISSING_PODS,
        "ml/train-0",
        "train",
        0,
    )
    done = job(conditions=[{"type": "Failed", "status": "True"}])
    watch.observe_job("MODIFIED", done)
    clock.now += 100
    assert watch.due() == []


def test_pods_created_after_a_reported_refusal_are_due_once_as_cleared() -> None:
    clock = Clock()
    watch: stalls.StallWatch[str] = stalls.StallWatch(0.0, clock)
    watch.observe_job("ADDED", job())
    clock.now += stalls.POD_GRACE_S
    assert kinds(watch) == [Kind.MISSING_PODS]
    watch.reported("ml/train-0")
    watch.observe_job("MODIFIED", job(active=1))
    assert kinds(watch) == [Kind.CLEARED]
    assert kinds(watch) == []


def test_every_pod_unschedulable_for_the_wait_makes_the_job_due_for_a_move() -> None:
    clock = Clock()
    watch: stalls.StallWatch[str] = stalls.StallWatch(30.0, clock)
    watch.observe_job("ADDED", job(parallelism=2, active=2))
    watch.observe_pod("ADDED", pod("a"))
    clock.now += 10
    watch.observe_pod("ADDED", pod("b", unschedulable=False))
    clock.now += 30
    assert watch.due() == []  # b is not known to be unschedulable
    watch.observe_pod("MODIFIED", pod("b"))
    clock.now += 29
    assert watch.due() == []
    clock.now += 1
    (stall,) = watch.due()
    assert stall.kind is Kind.UNSCHEDULABLE and stall.waited_s == 30
    clock.now += 5
    assert watch.due() == []  # next look a third of the wait later
    clock.now += 5
    assert kinds(watch) == [Kind.UNSCHEDULABLE]
    watch.observe_pod("MODIFIED", pod("b", node="gpu-0", unschedulable=False))
    assert not watch.unschedulable("ml/train-0")
    clock.now += 100
    assert watch.due() == []


def test_a_job_suspended_to_move_is_due_once_its_controller_has_reset_it() -> None:
    clock = Clock()
    watch: stalls.StallWatch[str] = stalls.StallWatch(30.0, clock)
    watch.observe_job("ADDED", job(active=1, startTime="2026-11-25T14:00:00Z"))
    watch.observe_pod("ADDED", pod("a"))
    watch.moving("ml/train-0", "the move")
    clock.now += 100
    assert watch.due() == []  # not suspended yet, and no second move while one is under way
    watch.observe_job("MODIFIED", job(suspend=True, active=1, startTime="2026-11-25T14:00:00Z"))
    assert watch.due() == []  # its pod and start time are still there
    watch.observe_job("MODIFIED", job(suspend=True))
    assert kinds(watch) == [Kind.SUSPENDED]
    assert watch.take_move("ml/train-0") == "the move"
    assert watch.take_move("ml/train-0") is None


def test_pods_of_other_jobs_are_not_kept() -> None:
    watch: stalls.StallWatch[str] = stalls.StallWatch(30.0, Clock())
    foreign = pod("x")
    del foreign["metadata"]["labels"][workload.LABEL_DLJOB]
    watch.observe_pod("ADDED", foreign)
    assert not watch.unschedulable("ml/train-0")
    watch.observe_pod("ADDED", pod("a"))
    assert watch.unschedulable("ml/train-0")
    watch.observe_pod("DELETED", pod("a"))
    assert not watch.unschedulable("ml/train-0")
