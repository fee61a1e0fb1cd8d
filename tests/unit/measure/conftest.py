import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kubeseer.measure import plans, records

REPO = Path(__file__).resolve().parents[3]
TINY_PLAN = REPO / "plans" / "tiny.yaml"


@pytest.fixture(autouse=True, scope="package")
def single_intra_op_thread() -> Iterator[None]:
    """Measure on one thread, as the harness does by default, and restore the default after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="package")
def tiny_plan_path() -> Path:
    return TINY_PLAN


@pytest.fixture(scope="package")
def tiny_plan() -> plans.Plan:
    return plans.load_plan(TINY_PLAN)


@pytest.fixture(scope="package")
def tiny_expansion(tiny_plan: plans.Plan) -> plans.Expansion:
    return plans.expand(tiny_plan)


def _make_record(**changes) -> records.Record:
    device = records.DeviceDescriptor(
        kind=records.DeviceKind.CUDA,
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 * 2**30,
        sm_count=108,
        cores=None,
        mig_profile="1g.10gb",
        driver_version="560.35.03",
        cuda_version="13.0",
        torch_version="2.13.0",
    )
    record = records.Record(
        schema_version=records.SCHEMA_VERSION,
        config_hash="0123456789abcdef",
        family="mlp",
        spec_json='{"arch":{},"family":"mlp","input":{}}',
        batch_size=8,
        mode="train",
        precision="bf16",
        optimizer="adam",
        device=device,
        label_source=records.LabelSource.MEASURED,
        status=records.Status.OK,
        plan="tiny",
        flops=12_345,
        params=678,
        warmup_iterations=5,
        timed_iterations=30,
        step_time_mean_s=0.012,
        step_time_median_s=0.011,
        step_time_p95_s=0.02,
        step_cpu_time_median_s=None,
        memory_bytes=1_500_000_000,
        context_bytes=500_000_000,
        allocator_peak_allocated_bytes=900_000_000,
        allocator_peak_reserved_bytes=1_000_000_000,
        rss_baseline_bytes=None,
        rss_peak_delta_bytes=None,
        sm_util_mean_percent=61.5,
        sm_util_peak_percent=93.0,
        utilisation_source="gpm-sm-activity",
        utilisation_samples=40,
        energy_j=12.5,
        threads=None,
        started_at="2026-11-22T03:00:00+00:00",
        finished_at="2026-11-22T03:00:05+00:00",
    )
    return dataclasses.replace(record, **changes)


@pytest.fixture
def make_record():
    """A factory for a complete, valid GPU record; keyword arguments replace fields."""
    return _make_record
