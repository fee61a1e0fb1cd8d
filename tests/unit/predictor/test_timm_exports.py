"""Real timm architectures, exported with torch's own (TorchScript) exporter as users export
them, predict at batch 1, 2 and 64.

The exporter leaves dimensions it cannot name as ``unk__N``; at batch 1 a dimension of 1
broadcasts against them without fixing them, so poolformer, mobilevitv2 and crossvit once failed
at batch 1 (and swin at every batch) while batch 2 worked. Models are built with random weights
(nothing is downloaded) and cached without their weight bytes under
``$KUBESEER_CACHE/test-models`` (default ``~/.cache/kubeseer``), so only the first run exports.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import onnx
import pytest
from onnx import external_data_helper

from kubeseer.predictor import errors, extract

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

pytestmark = pytest.mark.slow

# (timm name, image size): the three the issue names, swin's shifted windows, and a CNN.
DYNAMIC = [
    ("poolformer_s24", 224),
    ("mobilevitv2_150", 256),
    ("crossvit_15_dagger_240", 240),
    ("swin_tiny_patch4_window7_224", 224),
    ("efficientnet_b0", 224),
]
# Exported at a fixed batch of 1: CNNs whose flattening reshapes are rebound, and a vision
# transformer whose class token is a constant of batch 1 (refused).
FIXED = [("resnet50", 224), ("poolformer_s24", 224)]
FIXED_REFUSED = [("deit_tiny_patch16_224", 224)]


def cache_dir() -> Path:
    root = Path(os.environ.get("KUBESEER_CACHE") or Path.home() / ".cache" / "kubeseer")
    return root / "test-models" / f"timm-{timm.__version__}-torch-{torch.__version__}"


def exported(name: str, size: int, *, dynamic: bool) -> bytes:
    """The TorchScript export of a timm model (random weights), its weight bytes dropped."""
    path = cache_dir() / f"{name}-{size}-{'dynamic' if dynamic else 'batch1'}.onnx"
    if path.exists():
        return path.read_bytes()
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    buffer = io.BytesIO()
    axes = {"input": {0: "batch"}, "logits": {0: "batch"}} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2 if dynamic else 1, 3, size, size),),
            buffer,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    proto = onnx.load_from_string(buffer.getvalue())
    for tensor in proto.graph.initializer:
        if len(tensor.raw_data) > 4096:  # kept: names, dims, data type (what extraction reads)
            external_data_helper.set_external_data(tensor, location="weights.bin")
            tensor.ClearField("raw_data")
    data = proto.SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(path)
    return data


@pytest.mark.parametrize(("name", "size"), DYNAMIC, ids=[n for n, _ in DYNAMIC])
def test_a_dynamic_export_predicts_at_batch_1_2_and_64(name, size):
    model = exported(name, size, dynamic=True)
    graphs = {batch: extract.from_onnx(model, batch_size=batch) for batch in (1, 2, 64)}
    one = graphs[1]
    for batch, graph in graphs.items():
        assert graph.batch_size == batch
        assert graph.op_types == one.op_types
        # Nearly all the work is per sample (a class token or a mask is not).
        assert graph.flops == pytest.approx(batch * one.flops, rel=1e-4)


@pytest.mark.parametrize(("name", "size"), FIXED, ids=[n for n, _ in FIXED])
def test_a_batch_1_export_is_rebound_to_the_work_of_a_dynamic_one(name, size):
    fixed = exported(name, size, dynamic=False)
    dynamic = exported(name, size, dynamic=True)
    for batch in (2, 64):
        with pytest.warns(errors.FixedBatchWarning):
            rebound = extract.from_onnx(fixed, batch_size=batch)
        reference = extract.from_onnx(dynamic, batch_size=batch)
        assert rebound.flops == pytest.approx(reference.flops, rel=1e-6)
        assert rebound.params == reference.params


@pytest.mark.parametrize(("name", "size"), FIXED_REFUSED, ids=[n for n, _ in FIXED_REFUSED])
def test_a_batch_1_export_that_bakes_the_batch_into_a_constant_is_refused(name, size):
    fixed = exported(name, size, dynamic=False)
    assert extract.from_onnx(fixed, batch_size=1).batch_size == 1
    with pytest.raises(errors.BindingError, match="fixed batch size of 1 and its graph does not"):
        extract.from_onnx(fixed, batch_size=8)
