"""Derived memory-target rows for any zoo task (label source derived-allocator-replay)."""

from kubeseer import zoo
from kubeseer.measure import collect, records, replay_cuda, steps, storage


def test_every_mode_and_precision_is_derived_and_stored_under_its_own_source(
    tmp_path, tiny_plan, tiny_expansion
):
    backend = replay_cuda.ReplayCudaBackend("NVIDIA H100 80GB HBM3")
    summary = collect.run(tiny_plan, backend, tmp_path, expansion=tiny_expansion)
    rows = storage.read_records(summary.dataset)
    assert summary.dataset.name.endswith(records.LabelSource.DERIVED_ALLOCATOR_REPLAY.value)
    assert summary.unsupported == 0
    assert {r.mode for r in rows} == {"infer", "train"}
    runtime = replay_cuda.runtime_for("NVIDIA H100 80GB HBM3")
    for row in rows:
        assert row.label_source is records.LabelSource.DERIVED_ALLOCATOR_REPLAY
        assert row.step_time_median_s is None
        assert row.context_bytes == runtime.context_bytes
        assert row.allocator_peak_allocated_bytes <= row.allocator_peak_reserved_bytes
        assert row.memory_bytes is not None
        assert (
            row.context_bytes
            < row.memory_bytes
            <= (row.context_bytes + row.allocator_peak_reserved_bytes)
        )


def test_adam_needs_more_than_sgd_and_fp16_inference_more_than_fp32():
    spec = zoo.ModelSpec(
        "mlp",
        {"activation": "gelu", "hidden": [2048, 2048], "norm": "layer", "num_classes": 10},
        {"features": 1024},
    )
    runtime = replay_cuda.runtime_for("NVIDIA A100-SXM4-80GB")

    def memory(mode, precision, optimizer):
        task = steps.Task(spec, 64, mode, precision, optimizer)
        return replay_cuda.derive(task, runtime).allocated_peak

    assert memory("train", "fp32", "adam") > memory("train", "fp32", "sgd")
    # Autocast keeps half copies of the weights beside the fp32 ones during inference.
    assert memory("infer", "fp16", "none") > memory("infer", "fp32", "none")
