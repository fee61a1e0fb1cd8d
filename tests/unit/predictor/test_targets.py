import dataclasses

import pytest

from kubeseer.predictor import targets


def test_six_metrics_are_mode_by_quantity_in_paper_order():
    assert targets.METRICS == (
        "train.memory_bytes",
        "train.sm_util_percent",
        "train.step_time_s",
        "infer.memory_bytes",
        "infer.sm_util_percent",
        "infer.step_time_s",
    )


def test_every_quantity_has_a_label_column_and_a_definition():
    assert set(targets.LABEL_COLUMNS) == set(targets.QUANTITIES) == set(targets.TARGET_DEFINITIONS)


def test_validate_metrics_returns_canonical_order():
    assert targets.validate_metrics(["infer.step_time_s", "train.memory_bytes"]) == (
        "train.memory_bytes",
        "infer.step_time_s",
    )


@pytest.mark.parametrize("names", [["train.energy"], ["infer.memory_bytes", "infer.memory_bytes"]])
def test_validate_metrics_rejects_unknown_and_duplicates(names):
    with pytest.raises(targets.UnknownMetricError):
        targets.validate_metrics(names)


def test_split_metric_round_trips():
    assert targets.split_metric(targets.metric("infer", "sm_util_percent")) == (
        "infer",
        "sm_util_percent",
    )


def test_precision_and_optimizer_one_hot_match_feature_names():
    assert targets.extra_globals("fp16", "adam") == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert targets.EXTRA_GLOBAL_FEATURES == (
        "precision=fp32",
        "precision=fp16",
        "precision=bf16",
        "optimizer=sgd",
        "optimizer=adam",
    )
    assert targets.extra_globals("fp32", "none")[3:] == [0.0, 0.0]


@pytest.mark.parametrize(("precision", "optimizer"), [("int8", "adam"), ("fp32", "lamb")])
def test_unknown_precision_or_optimizer_is_rejected(precision, optimizer):
    with pytest.raises(ValueError, match="unknown"):
        targets.extra_globals(precision, optimizer)


def test_optimizers_match_the_measurement_harness():
    from kubeseer.measure import records, steps

    assert targets.OPTIMIZERS == steps.OPTIMIZERS
    assert targets.NO_OPTIMIZER == records.NO_OPTIMIZER


def test_cpu_datasets_take_step_time_from_cpu_time_and_say_so():
    assert targets.label_columns("cpu")["step_time_s"] == "step_cpu_time_median_s"
    assert targets.label_columns("cuda")["step_time_s"] == "step_time_median_s"
    assert "CPU time" in targets.definitions("cpu")["step_time_s"]
    assert "NVML" in targets.definitions("cuda")["memory_bytes"]


def test_allocator_memory_label_swaps_only_the_memory_column():
    allocator = targets.MemoryLabel.ALLOCATOR
    for kind in ("cpu", "cuda"):
        columns = targets.label_columns(kind, allocator)
        assert columns["memory_bytes"] == "allocator_peak_allocated_bytes"
        assert {k: v for k, v in columns.items() if k != "memory_bytes"} == {
            k: v for k, v in targets.label_columns(kind).items() if k != "memory_bytes"
        }
        assert "live tensors" in targets.definitions(kind, allocator)["memory_bytes"]
    from kubeseer.measure import records

    assert targets.ALLOCATOR_COLUMN in {f.name for f in dataclasses.fields(records.Record)}


@pytest.mark.parametrize(
    ("device_kind", "source", "counts"),
    [
        ("cuda", "measured", True),
        # The replay's trace places the batch on the device before the first step, as the job
        # does, so its allocated peak includes it (H6's finding).
        ("cuda", "derived-allocator-replay", True),
        ("cuda", "derived-fake-cuda-allocator", False),
        ("cpu", "measured", False),
    ],
)
def test_allocator_peaks_count_the_batch_where_the_trace_holds_it(device_kind, source, counts):
    allocator = targets.MemoryLabel.ALLOCATOR
    assert targets.memory_counts_batch(allocator, device_kind, source) is counts
    assert targets.memory_counts_batch(targets.MemoryLabel.DEVICE, device_kind, source)
