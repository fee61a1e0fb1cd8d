"""The GPU check of the derived memory: bisection, the measured row, resuming, the plan.

The device is faked at its outermost edge only: a runner whose `run` replays the job's own
derived allocation trace through the caching-allocator model under the cap it is given, which
is what a capped CUDA allocator is modelled to do. Everything above it (the warm-up, the
bisection, the row, the plan file) is the code a GPU session runs.
"""

import json
from pathlib import Path

import pytest
import timm
from torch import nn

from kubeseer.measure import caching_allocator, derived_check, gpu_memory, public_gpu

REPO = Path(__file__).resolve().parents[3]
PLAN = REPO / "plans" / "derived-check.jsonl"
MIB = 1 << 20


class ReplayRunner:
    """A device that runs each job as the derivation's allocator model says it would."""

    gpu_name = "NVIDIA H200"
    memory_total_bytes = 141 * 2**30

    def __init__(self, context: int = 512 * MIB) -> None:
        self.context = context
        self.caps: list[int | None] = []
        self._traces: dict[str, list[caching_allocator.Event]] = {}

    def context_bytes(self) -> int:
        return self.context

    def trace(self, job: derived_check.CheckJob) -> list[caching_allocator.Event]:
        if job.key not in self._traces:
            parts = public_gpu.timm_parts(job.model, job.img_size)
            self._traces[job.key] = gpu_memory.trace(
                parts, job.gpu_memory_job(), gpu_memory.RUNTIMES["torch2-cuda12-hopper"]
            )
        return self._traces[job.key]

    def run(
        self,
        job: derived_check.CheckJob,
        parts: gpu_memory.StepParts,
        host_model: nn.Module,
        *,
        cap_bytes: int | None = None,
        timed: int = 0,
    ) -> derived_check.Run | None:
        self.caps.append(cap_bytes)
        try:
            replayed = caching_allocator.replay(self.trace(job), capacity=cap_bytes)
        except caching_allocator.OutOfMemory:
            return None
        return derived_check.Run(
            replayed.peak_allocated, replayed.peak_reserved, [0.01 * (i + 1) for i in range(timed)]
        )


def _job(**changes: object) -> derived_check.CheckJob:
    fields: dict[str, object] = {
        "model": "test_convnext",
        "img_size": 160,
        "mode": "infer",
        "batch_size": 32,
        "why": "test",
    }
    fields.update(changes)
    return derived_check.CheckJob(**fields)  # type: ignore[arg-type]


def test_bisection_finds_the_smallest_cap_the_allocator_model_runs_in():
    job = _job()
    events = ReplayRunner().trace(job)
    unlimited = caching_allocator.replay(events)

    def runs_within(cap: int) -> bool:
        try:
            caching_allocator.replay(events, capacity=cap)
        except caching_allocator.OutOfMemory:
            return False
        return True

    found, probes = derived_check.bisect_capacity(
        runs_within, unlimited.peak_allocated, unlimited.peak_reserved, tolerance=0.0
    )
    assert found == caching_allocator.required_capacity(events)
    assert probes and all(p.cap_bytes >= unlimited.peak_allocated // MIB * MIB for p in probes)
    assert all(p.ran == runs_within(p.cap_bytes) for p in probes)


def test_bisection_stops_within_its_tolerance_and_never_returns_below_a_cap_that_failed():
    needed = 3_000 * MIB
    found, probes = derived_check.bisect_capacity(
        lambda cap: cap >= needed, 2_000 * MIB, 4_000 * MIB, tolerance=0.01
    )
    assert needed <= found <= needed + 0.01 * 4_000 * MIB + derived_check.GRANULE
    assert len(probes) <= 8
    assert all(found > p.cap_bytes for p in probes if not p.ran)


def test_a_measured_job_carries_peaks_required_capacity_context_and_median_step():
    runner = ReplayRunner(context=600 * MIB)
    job = _job()
    row = derived_check.check_job(job, runner, timed=3, tolerance=0.0)
    events = runner.trace(job)
    unlimited = caching_allocator.replay(events)
    assert row.error is None
    assert (row.allocated_bytes, row.reserved_bytes) == (
        unlimited.peak_allocated,
        unlimited.peak_reserved,
    )
    assert row.required_bytes == caching_allocator.required_capacity(events)
    assert row.context_bytes == 600 * MIB
    assert row.step_time_s == pytest.approx(0.02)
    assert row.gpu == "NVIDIA H200" and row.key == job.key and row.why == "test"
    # a warm-up and the timed run before the capped probes, all from the same host model
    assert runner.caps[:2] == [None, None] and all(c is not None for c in runner.caps[2:])
    assert json.loads(row.as_json())["required_bytes"] == row.required_bytes


def test_an_architecture_timm_lacks_is_a_row_with_the_error_and_the_plan_goes_on(tmp_path):
    out = tmp_path / "measured.jsonl"
    jobs = [_job(model="no_such_architecture"), _job()]
    assert derived_check.check_plan(jobs, out, ReplayRunner(), timed=1) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert "no_such_architecture" in rows[0]["error"] and rows[0]["required_bytes"] is None
    assert rows[1]["error"] is None and rows[1]["required_bytes"] > 0


def test_a_job_that_does_not_run_uncapped_says_so():
    class Full(ReplayRunner):
        def run(self, *args: object, **kwargs: object) -> None:
            return None

    row = derived_check.check_job(_job(), Full())
    assert row.error == "out of memory without a cap" and row.allocated_bytes is None


def test_a_plan_resumes_where_the_measured_file_stops_and_past_its_deadline_starts_nothing(
    tmp_path,
):
    out = tmp_path / "measured.jsonl"
    first, second = _job(batch_size=8), _job(batch_size=16)
    assert derived_check.check_plan([first], out, ReplayRunner(), timed=1) == 1
    runner = ReplayRunner()
    assert derived_check.check_plan([first, second], out, runner, timed=1) == 1
    assert derived_check.measured_keys(out) == {first.key, second.key}
    assert derived_check.check_plan([_job(batch_size=24)], out, runner, deadline_s=-1) == 0


def test_a_plan_round_trips_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "plan.jsonl"
    jobs = [_job(), _job(mode="train", batch_size=4, steps=2)]
    derived_check.write_plan(jobs, path)
    assert derived_check.read_plan(path) == jobs
    path.write_text(
        path.read_text() + '{"model": "resnet50", "img_size": 224, "mode": "eval", '
        '"batch_size": 8}\n'
    )
    with pytest.raises(ValueError, match=r"plan.jsonl:3: not a check job.*mode"):
        derived_check.read_plan(path)


def test_the_committed_check_plan_names_architectures_this_timm_builds():
    jobs = derived_check.read_plan(PLAN)
    assert len(jobs) >= 24
    assert {job.mode for job in jobs} == {"infer", "train"}
    assert len({job.key for job in jobs}) == len(jobs)
    # the public benchmark's names, some of them deprecated aliases timm still resolves
    assert [job.model for job in jobs if not timm.is_model(job.model)] == []


def test_the_report_derives_each_measured_job_in_its_gpus_runtime(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import derived_vs_gpu

    out = tmp_path / "measured.jsonl"
    jobs = [_job(), _job(model="test_resnet", mode="train", batch_size=4)]
    derived_check.check_plan(jobs, out, ReplayRunner(), timed=1)
    found = derived_vs_gpu.score(out)
    # the fake ran Hopper's trace (32 MiB cuBLAS workspace), so an H200 row derives equal
    for row in found["rows"]:
        assert row["derived_required_bytes"] == row["required_bytes"]
        assert row["derived_reserved_bytes"] == row["reserved_bytes"]
    summary = found["summary"]
    assert summary["all"]["derived below measured"] == "0 of 2"
    assert summary["train"]["required"].startswith("1.000")
    assert "| test_convnext|160|infer|32|3 |" in derived_vs_gpu.job_table(found["rows"])
