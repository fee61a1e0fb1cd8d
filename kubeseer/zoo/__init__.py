"""Parametrised model families in plain torch, the data source of kubeseer's predictor.

Only torch and the standard library are imported here, because the measurement harness runs
this package on bare GPU images; ONNX export lives in `kubeseer.zoo.export`.
"""

from kubeseer.zoo.families.base import SIZE_CLASSES, SizeClass
from kubeseer.zoo.models import build_model, example_batch, parameter_count, training_loss
from kubeseer.zoo.registry import STANDARD_SPECS, standard_spec
from kubeseer.zoo.sampling import SamplerExhaustedError, sample_specs
from kubeseer.zoo.spec import FAMILIES, InvalidSpecError, ModelSpec

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
