"""Parametrised model families in plain torch, the data source of kubeseer's predictor.

Only torch and the standard library are imported here, because the measurement harness runs
this package on bare GPU images; ONNX export lives in `kubeseer.zoo.export`.

Names are resolved on first use, so that `kubeseer --help` (which imports the zoo's command
module) and readers of `ModelSpec` JSON do not pay torch's multi-second import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from kubeseer.zoo.models import build_model, example_batch, parameter_count, training_loss
    from kubeseer.zoo.registry import STANDARD_SPECS, standard_spec
    from kubeseer.zoo.sampling import SamplerExhaustedError, sample_specs
    from kubeseer.zoo.spec import FAMILIES, SIZE_CLASSES, InvalidSpecError, ModelSpec, SizeClass

_HOME: Final[dict[str, str]] = {
    "FAMILIES": "spec",
    "SIZE_CLASSES": "spec",
    "SizeClass": "spec",
    "InvalidSpecError": "spec",
    "ModelSpec": "spec",
    "STANDARD_SPECS": "registry",
    "standard_spec": "registry",
    "SamplerExhaustedError": "sampling",
    "sample_specs": "sampling",
    "build_model": "models",
    "example_batch": "models",
    "parameter_count": "models",
    "training_loss": "models",
}

__all__ = [
    "FAMILIES",
    "SIZE_CLASSES",
    "STANDARD_SPECS",
    "InvalidSpecError",
    "ModelSpec",
    "SamplerExhaustedError",
    "SizeClass",
    "build_model",
    "example_batch",
    "parameter_count",
    "sample_specs",
    "standard_spec",
    "training_loss",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
