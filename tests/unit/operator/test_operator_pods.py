"""Classifying pods and Jobs, above all recognising GPU out-of-memory deaths."""

from __future__ import annotations

from typing import Any

import pytest

from kubeseer.operator.pods import PodOutcome, classify_job, classify_pod, is_cuda_oom_message


def pod(phase: str, terminated: dict[str, Any] | None = None, key: str = "state") -> dict:
    status: dict[str, Any] = {"phase": phase}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "main", key: {"terminated": terminated}}]
    return {"status": status}


def test_oomkilled_container_is_an_oom() -> None:
    verdict = classify_pod(pod("Failed", {"reason": "OOMKilled", "exitCode": 137}))
    assert verdict.outcome is PodOutcome.OOM
    assert "main was OOMKilled (exit code 137)" in verdict.message


@pytest.mark.parametrize(
    "message",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: out of memory",
        "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.",
    ],
)
def test_cuda_oom_message_in_the_termination_message_is_an_oom(message: str) -> None:
    verdict = classify_pod(pod("Failed", {"reason": "Error", "exitCode": 1, "message": message}))
    assert verdict.outcome is PodOutcome.OOM
    assert message[:40] in verdict.message


def test_an_oom_in_last_state_counts_while_the_container_restarts() -> None:
    restarting = pod("Running", {"reason": "OOMKilled", "exitCode": 137}, key="lastState")
    assert classify_pod(restarting).outcome is PodOutcome.OOM


def test_other_failures_are_plain_failures_with_the_exit_code() -> None:
    verdict = classify_pod(pod("Failed", {"reason": "Error", "exitCode": 2, "message": "bad arg"}))
    assert verdict.outcome is PodOutcome.FAILED
    assert verdict.message == "container main exited with code 2: bad arg"


@pytest.mark.parametrize(
    ("phase", "outcome"),
    [
        ("Pending", PodOutcome.PENDING),
        ("Running", PodOutcome.RUNNING),
        ("Succeeded", PodOutcome.SUCCEEDED),
        ("Unknown", PodOutcome.PENDING),
    ],
)
def test_phase_maps_to_outcome(phase: str, outcome: PodOutcome) -> None:
    assert classify_pod(pod(phase)).outcome is outcome


def test_host_memory_words_alone_are_not_a_gpu_oom() -> None:
    assert not is_cuda_oom_message("MemoryError: cannot allocate array in numpy")


def job(*conditions: tuple[str, str], ready: int = 0) -> dict:
    return {
        "status": {
            "ready": ready,
            "conditions": [{"type": t, "status": s, "message": f"{t}!"} for t, s in conditions],
        }
    }


def test_job_outcomes_follow_its_conditions() -> None:
    assert classify_job(job(("Complete", "True")), []).outcome is PodOutcome.SUCCEEDED
    assert classify_job(job(("Failed", "True")), []).outcome is PodOutcome.FAILED
    assert classify_job(job(ready=2), []).outcome is PodOutcome.RUNNING
    assert classify_job(job(), []).outcome is PodOutcome.PENDING


def test_a_failed_job_with_an_oomkilled_pod_is_an_oom() -> None:
    oom = pod("Failed", {"reason": "OOMKilled", "exitCode": 137})
    assert classify_job(job(("Failed", "True")), [pod("Failed"), oom]).outcome is PodOutcome.OOM
