"""Derived allocator-peak labels on fake CUDA tensors (works without a GPU)."""

import pytest

from kubeseer import zoo
from kubeseer.measure import collect, fake_cuda, records, steps, storage


def mlp_spec(hidden):
    return zoo.ModelSpec(
        "mlp",
        {"activation": "relu", "hidden": hidden, "norm": "none", "num_classes": 10},
        {"features": 256},
    )


def test_the_peak_holds_the_fp32_weights_input_and_activations():
    spec = mlp_spec([1024])
    batch = 64
    peak = fake_cuda.derive_peak_bytes(steps.Task(spec, batch, "infer", "fp32", "none"))
    weights = 4 * zoo.parameter_count(spec)
    # Input (64 x 256) and the hidden activation (64 x 1024) are live together at least once.
    assert peak >= weights + 4 * batch * (256 + 1024)
    # Nothing in one forward needs more than weights plus every activation at once.
    assert peak <= weights + 4 * batch * (256 + 2 * 1024 + 10) + 8 * 512


def test_the_peak_grows_with_the_batch():
    spec = mlp_spec([512, 512])
    small, large = (
        fake_cuda.derive_peak_bytes(steps.Task(spec, b, "infer", "fp32", "none")) for b in (1, 256)
    )
    assert large > small


@pytest.mark.parametrize(
    ("mode", "precision", "optimizer"),
    [("train", "fp32", "sgd"), ("infer", "fp16", "none"), ("infer", "bf16", "none")],
)
def test_training_and_autocast_cannot_be_derived_without_a_gpu(mode, precision, optimizer):
    task = steps.Task(mlp_spec([32]), 2, mode, precision, optimizer)
    assert not fake_cuda.supported(task)
    with pytest.raises(fake_cuda.UnsupportedTaskError):
        fake_cuda.derive_peak_bytes(task)


def test_fake_rows_are_stored_under_their_own_label_source_and_dataset(
    tmp_path, tiny_plan, tiny_expansion
):
    backend = fake_cuda.FakeCudaBackend("NVIDIA A100-SXM4-80GB")
    summary = collect.run(tiny_plan, backend, tmp_path, expansion=tiny_expansion)
    rows = storage.read_records(summary.dataset)
    assert summary.dataset.name.endswith(records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR.value)
    assert summary.unsupported == sum(not fake_cuda.supported(p.task) for p in tiny_expansion.tasks)
    assert rows and all(
        r.label_source is records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR
        and r.memory_bytes is None
        and r.step_time_median_s is None
        and r.allocator_peak_allocated_bytes > 0
        and r.device.name == "NVIDIA A100-SXM4-80GB"
        for r in rows
    )


def test_an_unknown_gpu_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="NVIDIA H100 80GB HBM3"):
        fake_cuda.FakeCudaBackend("GeForce 256")
