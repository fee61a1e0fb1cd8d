"""The CPU harness end to end: real torch runs in forked children, real labels on disk."""

import json
import os

import pytest

from kubeseer import zoo
from kubeseer.measure import collect, cpu, plans, records, steps, storage


@pytest.fixture(scope="module")
def two_tasks(tiny_expansion):
    """One mlp and one resnet task: enough to interrupt between, cheap to run twice."""
    first = {}
    for planned in tiny_expansion.tasks:
        first.setdefault(planned.task.spec.family, planned)
    return plans.Expansion(tuple(first.values()), ())


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_plan, tiny_expansion):
    root = tmp_path_factory.mktemp("dataset")
    summary = collect.run(
        tiny_plan, cpu.CpuBackend(cpu.CpuSettings()), root, expansion=tiny_expansion
    )
    return summary, storage.read_records(summary.dataset)


def test_every_planned_task_is_measured_once(measured, tiny_expansion):
    summary, rows = measured
    assert summary.measured == len(tiny_expansion.tasks) == len(rows)
    assert {r.key for r in rows} == {p.task.key for p in tiny_expansion.tasks}


def test_labels_are_real_measurements(measured):
    _, rows = measured
    for row in rows:
        assert row.status is records.Status.OK
        assert row.label_source is records.LabelSource.MEASURED
        assert 0 < row.step_time_median_s <= row.step_time_p95_s
        assert row.step_time_mean_s > 0
        # One thread: a step cannot use more CPU time than the wall time it took.
        assert 0 < row.step_cpu_time_median_s <= row.step_time_median_s * 1.05 + 1e-5
        assert row.allocator_peak_allocated_bytes >= 4 * row.params
        assert row.memory_bytes == row.rss_peak_delta_bytes >= 0
        assert row.rss_baseline_bytes > 0
        assert 0 < row.sm_util_mean_percent <= 105
        assert row.utilisation_source == "cpu-process-time"
        assert row.threads == 1
        assert (row.warmup_iterations, row.timed_iterations) == (5, 30)


def test_records_carry_a_spec_that_regenerates_the_model(measured):
    _, rows = measured
    for row in rows:
        spec = zoo.ModelSpec.from_json(row.spec_json)
        assert spec.config_hash() == row.config_hash
        assert zoo.parameter_count(spec) == row.params


def test_the_cpu_descriptor_names_model_memory_and_cores(measured):
    _, rows = measured
    device = rows[0].device
    assert device.kind is records.DeviceKind.CPU
    assert device.name and device.memory_bytes > 2**30 and device.cores >= 1
    assert device.torch_version.startswith("2.")


def test_a_second_run_resumes_and_measures_nothing_new(measured, tiny_plan, tiny_expansion):
    summary, rows = measured
    again = collect.run(
        tiny_plan,
        cpu.CpuBackend(cpu.CpuSettings()),
        summary.dataset.parent,
        expansion=tiny_expansion,
    )
    assert (again.measured, again.skipped) == (0, len(rows))


def test_an_interrupted_run_keeps_what_it_measured_and_resumes(tmp_path, tiny_plan, two_tasks):
    backend = cpu.CpuBackend(cpu.CpuSettings())

    def interrupt(done, total, description):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect.run(
            tiny_plan, backend, tmp_path, expansion=two_tasks, progress=interrupt, flush_every=100
        )
    directory = collect.dataset_directory(tmp_path, backend)
    assert len(storage.read_records(directory)) == 1
    resumed = collect.run(tiny_plan, backend, tmp_path, expansion=two_tasks)
    assert (resumed.skipped, resumed.measured) == (1, 1)
    assert len(storage.read_records(directory)) == 2


def test_shards_split_a_plan_between_collectors_without_overlap(tmp_path, tiny_plan, two_tasks):
    backend = cpu.CpuBackend(cpu.CpuSettings())
    first = collect.run(tiny_plan, backend, tmp_path, expansion=two_tasks, shard=(0, 2))
    second = collect.run(tiny_plan, backend, tmp_path, expansion=two_tasks, shard=(1, 2))
    assert (first.measured, second.measured) == (1, 1)
    rows = storage.read_records(first.dataset)
    assert {r.key for r in rows} == {p.task.key for p in two_tasks.tasks}


def test_running_out_of_a_memory_cap_is_a_censored_row(tmp_path, tiny_plan):
    spec = zoo.sample_specs("resnet", 1, 0, size="tiny")[0]
    task = steps.Task(spec, 8, "train", "fp32", "adam")
    cap = 2 * 2**20
    backend = cpu.CpuBackend(cpu.CpuSettings(memory_cap_bytes=cap))
    flops, params = steps.count_flops_and_params(spec)
    row = backend.measure(plans.PlannedTask(task, flops, params), tiny_plan)
    assert row.status is records.Status.OUT_OF_MEMORY and row.censored
    assert row.memory_bytes == cap
    assert row.step_time_median_s is None and row.sm_util_mean_percent is None


def test_a_failing_task_is_logged_and_the_run_goes_on(tmp_path, tiny_plan, two_tasks, monkeypatch):
    real_prepare = steps.prepare

    def prepare(task, device):
        if task.spec.family == "mlp":
            raise RuntimeError("broken kernel")
        return real_prepare(task, device)

    monkeypatch.setattr(steps, "prepare", prepare)
    backend = cpu.CpuBackend(cpu.CpuSettings())
    summary = collect.run(tiny_plan, backend, tmp_path, expansion=two_tasks)
    assert (summary.failed, summary.measured) == (1, 1)
    (line,) = (summary.dataset / collect.ERROR_LOG).read_text().splitlines()
    assert "broken kernel" in json.loads(line)["error"]
    assert [r.family for r in storage.read_records(summary.dataset)] == ["resnet"]


def test_a_child_that_dies_is_reported_as_a_measurement_error(monkeypatch):
    monkeypatch.setattr(steps, "prepare", lambda task, device: os._exit(3))
    spec = zoo.sample_specs("mlp", 1, 0, size="tiny")[0]
    with pytest.raises(cpu.MeasurementError, match="exit code 3"):
        cpu.measure(steps.Task(spec, 1, "infer", "fp32", "none"), cpu.CpuSettings())


def test_fewer_than_the_minimum_iterations_are_refused():
    with pytest.raises(ValueError, match="30 timed"):
        cpu.CpuSettings(iterations=10)
