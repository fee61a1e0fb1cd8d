"""Multi-layer perceptrons on flat feature vectors.

Arch keys: ``hidden`` (widths of the hidden layers), ``activation`` ("relu" | "gelu" |
"tanh"), ``norm`` ("none" | "batch" | "layer", after each hidden linear layer),
``num_classes``. Input: ``features``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from kubeseer.zoo.families import base
from kubeseer.zoo.spec import ModelSpec

_ACTIVATIONS: Final[dict[str, type[nn.Module]]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
}
_NORMS: Final = ("none", "batch", "layer")


@dataclass(frozen=True)
class MLPConfig:
    hidden: tuple[int, ...]
    activation: str
    norm: str
    num_classes: int
    features: int


def parse(spec: ModelSpec) -> MLPConfig:
    arch = base.Fields(spec.arch, "arch")
    inputs = base.Fields(spec.input, "input")
    config = MLPConfig(
        hidden=arch.integers("hidden", hi=65536, min_len=0),
        activation=arch.choice("activation", tuple(_ACTIVATIONS)),
        norm=arch.choice("norm", _NORMS),
        num_classes=arch.integer("num_classes", hi=100_000),
        features=inputs.integer("features", hi=1_000_000),
    )
    arch.done()
    inputs.done()
    base.require(len(config.hidden) <= 64, "arch.hidden: at most 64 hidden layers")
    return config


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        width = config.features
        for hidden in config.hidden:
            layers.append(nn.Linear(width, hidden))
            if config.norm == "batch":
                layers.append(nn.BatchNorm1d(hidden))
            elif config.norm == "layer":
                layers.append(nn.LayerNorm(hidden))
            layers.append(_ACTIVATIONS[config.activation]())
            width = hidden
        layers.append(nn.Linear(width, config.num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def build(spec: ModelSpec) -> nn.Module:
    return MLP(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive)."""

    features: tuple[int, int]
    layers: tuple[int, int]
    width: tuple[int, int]
    num_classes: tuple[int, ...]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((8, 256), (1, 3), (16, 512), (2, 10, 100)),
    "small": Ranges((64, 1024), (1, 4), (128, 2048), (2, 10, 100, 1000)),
    "medium": Ranges((256, 4096), (2, 6), (512, 8192), (10, 100, 1000)),
    "large": Ranges((1024, 16384), (3, 8), (2048, 8192), (1000, 10000)),
}


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    arch = {
        "hidden": [base.round_to(rng.randint(*r.width), 16) for _ in range(rng.randint(*r.layers))],
        "activation": rng.choice(tuple(_ACTIVATIONS)),
        "norm": rng.choice(_NORMS),
        "num_classes": rng.choice(r.num_classes),
    }
    return ModelSpec("mlp", arch, {"features": rng.randint(*r.features)})


FAMILY: Final = base.Family(
    name="mlp",
    task=base.Task.FEATURE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample,
    standard={
        "mlp-mnist": (
            {"hidden": [512, 256], "activation": "relu", "norm": "none", "num_classes": 10},
            {"features": 784},
        )
    },
)
