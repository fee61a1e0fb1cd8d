"""The analytic estimate against what PyTorch itself holds.

A zoo model is exported to ONNX and estimated from its graph alone, then built and stepped on
the CPU while `MemTracker` (the measurement harness's allocator-peak label) follows every
tensor. The estimator's rules are each checked on hand-made graphs in test_analytic_memory;
this checks that together they describe a real training and inference step.
"""

import pytest
import torch

from kubeseer import zoo
from kubeseer.measure import memtrack, steps
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import dataset, prior

# Configurations as the dataset samples them (the "tiny" size class), fixed by the seed.
SPECS = {
    family: zoo.sample_specs(family, 1, seed=0, size="tiny")[0] for family in ("resnext", "vit")
}
BATCH = 8


@pytest.fixture(scope="module")
def graphs():
    return {
        family: dataset.export_perfgraphs(spec.to_json(), [BATCH])[BATCH]
        for family, spec in SPECS.items()
    }


def measured_peak(spec: zoo.ModelSpec, mode: Mode, optimizer: str) -> int:
    torch.manual_seed(0)
    task = steps.Task(spec, BATCH, mode.value, "fp32", optimizer)
    prepared = steps.prepare(task, torch.device("cpu"))
    prepared.step()  # the steady state: the optimiser's state exists, gradients do not
    return memtrack.peak_tensor_bytes(prepared, torch.device("cpu"))


@pytest.mark.parametrize(
    ("family", "mode", "optimizer", "tolerance"),
    [
        # Training, measured when written: within 5.0 %. The estimator before the training
        # walk, the loss and the folded BatchNorms was 25 % under on resnext, 39 % over on vit.
        ("resnext", Mode.TRAIN, "adam", 0.07),
        ("resnext", Mode.TRAIN, "sgd", 0.07),
        ("vit", Mode.TRAIN, "adam", 0.07),
        ("vit", Mode.TRAIN, "sgd", 0.07),
        # Inference, 7 and 16 % under: eager PyTorch keeps tensors bound to Python locals
        # alive (the attention's scaled scores beside its probabilities), which the graph
        # cannot show.
        ("resnext", Mode.INFER, "none", 0.10),
        ("vit", Mode.INFER, "none", 0.20),
    ],
)
def test_the_estimate_is_close_to_the_measured_cpu_peak(graphs, family, mode, optimizer, tolerance):
    terms = prior.breakdown(
        graphs[family], mode, Precision.FP32, optimizer, prior.label_device("cpu")
    )
    # MemTracker follows what the step creates, not the batch made before it.
    estimate = prior.tensor_bytes(terms, with_batch=False)
    assert estimate == pytest.approx(measured_peak(SPECS[family], mode, optimizer), rel=tolerance)
