"""The predictor: ONNX graph -> PerfGraph -> SeerNet-Multi -> `kubeseer.prediction.Prediction`.

Knows nothing of Kubernetes. Import the modules you need (`from kubeseer.predictor import
extract`); this package initialiser imports nothing, so that extracting graphs never pays for
torch-geometric and the models never pay for onnx. The public names of each module are listed in
docs/internals.md.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`kubeseer.predictor.Predictor`, imported on first use (it pulls in torch-geometric)."""
    if name == "Predictor":
        from kubeseer.predictor import api

        return api.Predictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
