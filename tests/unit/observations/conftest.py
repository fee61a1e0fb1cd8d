"""A factory of observations for the observation tests."""

from __future__ import annotations

import dataclasses

import pytest

from kubeseer.observations import record

GIB = 1 << 30
DIGEST = "ab" * 32


def observation(
    uid: str = "3f0c6e1a-0000-4000-8000-000000000001",
    attempt: int = 0,
    *,
    family: str = "resnet",
    gpu_product: str = "A100-80GB",
    predicted: float = 4 * GIB,
    upper: float | None = None,
    observed: int | None = 4 * GIB,
    outcome: record.Outcome = record.Outcome.SUCCEEDED,
    limit: int | None = None,
    version: str = "ckpt-1",
    recorded_at: str = "2026-11-25T12:00:00Z",
    finished_at: str = "2026-11-25T12:00:00Z",
    **overrides: object,
) -> record.Observation:
    made = record.Observation(
        observation_id=record.observation_id(uid, attempt),
        namespace="team-a",
        dljob="job",
        dljob_uid=uid,
        attempt=attempt,
        family=family,
        model_digest=DIGEST,
        model_source="https://models.example/resnet.onnx",
        perfgraph_ref=None,
        inputs_json="{}",
        batch_size=32,
        mode="train",
        precision="fp32",
        optimizer="adam",
        gpu_product=gpu_product,
        gpu_model_name="NVIDIA A100-SXM4-80GB",
        mig_profile="3g.40gb",
        usable_memory_bytes=limit if limit is not None else 40 * GIB,
        predictor_version=version,
        label_device="AMD EPYC",
        coverage=0.95,
        predicted_memory_bytes=predicted,
        predicted_memory_upper_bytes=upper if upper is not None else predicted * 1.05,
        predicted_sm_util_percent=60.0,
        predicted_step_time_s=0.1,
        observed_peak_memory_bytes=observed,
        observed_mean_memory_bytes=observed,
        observed_sm_activity_percent=55.0,
        observed_sm_source="gpm-sm-activity",
        observed_samples=30,
        observed_source="nvml",
        window_start="2026-11-25T11:59:00Z",
        window_end="2026-11-25T12:00:00Z",
        outcome=outcome,
        memory_at_least_bytes=limit if outcome is record.Outcome.OOM else None,
        finished_at=finished_at,
        recorded_at=recorded_at,
    )
    return dataclasses.replace(made, **overrides) if overrides else made


@pytest.fixture
def make_observation():
    return observation
