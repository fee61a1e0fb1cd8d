"""Fixtures shared by the predictor's tests."""

import io
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

TorchScriptExport = Callable[[nn.Module, torch.Tensor], bytes]


@pytest.fixture(scope="session")
def torchscript_onnx() -> TorchScriptExport:
    """Export a module as PyTorch's TorchScript exporter writes it (module paths in the node
    names, batch axis symbolic), the way timm's exports here are made."""

    def export(module: nn.Module, example: torch.Tensor) -> bytes:
        buffer = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module.eval(),
                (example,),
                buffer,
                input_names=["x"],
                dynamic_axes={"x": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        return buffer.getvalue()

    return export


@pytest.fixture(scope="session")
def dynamo_onnx() -> TorchScriptExport:
    """Export a module as ``torch.onnx.export`` does by default from PyTorch 2.9 (dynamo: node
    names without module paths, the paths in each node's metadata), batch axis symbolic."""

    def export(module: nn.Module, example: torch.Tensor) -> bytes:
        batch = torch.export.Dim("batch", min=2, max=4096)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module.eval(),
                (example,),
                dynamic_shapes={"x": {0: batch}},
                dynamo=True,
                verbose=False,
            )
        assert program is not None
        return program.model_proto.SerializeToString()

    return export
