"""DenseNet-BC (Huang et al., 2017) in torchvision's layout.

Arch keys: ``growth_rate``, ``block_config`` (dense layers per block), ``num_init_features``
(stem width), ``bn_size`` (bottleneck width = bn_size * growth_rate), ``num_classes``.
Transitions halve the channels (compression 0.5) and the resolution. Input: ``image_size``,
``channels``.

Every dense layer reads the concatenation of all earlier feature maps of its block, exactly
as torchvision does, so the exported graph carries DenseNet's real activation footprint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from kubeseer.zoo.families import base
from kubeseer.zoo.spec import ModelSpec


@dataclass(frozen=True)
class DenseNetConfig:
    growth_rate: int
    block_config: tuple[int, ...]
    num_init_features: int
    bn_size: int
    num_classes: int
    image: base.ImageInput


def parse(spec: ModelSpec) -> DenseNetConfig:
    arch = base.Fields(spec.arch, "arch")
    config = DenseNetConfig(
        growth_rate=arch.integer("growth_rate", hi=512),
        block_config=arch.integers("block_config", hi=128),
        num_init_features=arch.integer("num_init_features", hi=1024),
        bn_size=arch.integer("bn_size", hi=16),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    base.require(len(config.block_config) <= 6, "arch.block_config: at most 6 blocks")
    return config


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        hidden = bn_size * growth_rate
        self.body = nn.Sequential(
            nn.BatchNorm2d(c_in),
            nn.ReLU(),
            nn.Conv2d(c_in, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, growth_rate, 3, padding=1, bias=False),
        )

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = self.body(torch.cat(features, 1))
        return out


class _DenseBlock(nn.Module):
    def __init__(self, layers: int, c_in: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            _DenseLayer(c_in + i * growth_rate, growth_rate, bn_size) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, config: DenseNetConfig) -> None:
        super().__init__()
        self.config = config
        c = config.num_init_features
        layers: list[nn.Module] = [
            nn.Conv2d(config.image.channels, c, 7, 2, 3, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        for i, n in enumerate(config.block_config):
            layers.append(_DenseBlock(n, c, config.growth_rate, config.bn_size))
            c += n * config.growth_rate
            if i != len(config.block_config) - 1:
                layers += [
                    nn.BatchNorm2d(c),
                    nn.ReLU(),
                    nn.Conv2d(c, c // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2),
                ]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(torch.flatten(self.pool(self.features(x)), 1))
        return out


def _min_side(config: DenseNetConfig) -> int:
    side = (config.image.image_size - 1) // 2 + 1  # 7x7 stride-2 stem
    side = (side - 1) // 2 + 1  # 3x3 stride-2 max-pool
    return side >> (len(config.block_config) - 1)  # one 2x2 average pool per transition


def check(spec: ModelSpec) -> None:
    config = parse(spec)
    base.require(
        _min_side(config) >= 1,
        f"input.image_size: {config.image.image_size} vanishes before the last block",
    )


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive)."""

    image_sizes: tuple[int, ...]
    blocks: tuple[int, int]
    layers_per_block: tuple[int, int]
    growth_rate: tuple[int, int]
    bn_size: tuple[int, ...]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((32, 48, 64), (2, 3), (1, 4), (4, 12), (2, 4)),
    "small": Ranges((64, 96, 128), (3, 4), (2, 8), (8, 16), (2, 4)),
    "medium": Ranges((128, 160, 192, 224), (4, 4), (4, 24), (12, 32), (4,)),
    "large": Ranges((224, 256, 288), (4, 4), (6, 48), (32, 48), (4,)),
}


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    blocks = rng.randint(*r.blocks)
    growth = rng.randint(*r.growth_rate)
    layers = [rng.randint(*r.layers_per_block) for _ in range(blocks)]
    arch = {
        "growth_rate": growth,
        "block_config": layers,
        "num_init_features": base.round_to(2 * growth * rng.uniform(0.75, 1.5), 8),
        "bn_size": rng.choice(r.bn_size),
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("densenet", arch, {"image_size": rng.choice(r.image_sizes), "channels": 3})


def build(spec: ModelSpec) -> nn.Module:
    return DenseNet(parse(spec))


def _standard(growth: int, blocks: list[int], init: int) -> base.ArchInput:
    arch = {
        "growth_rate": growth,
        "block_config": blocks,
        "num_init_features": init,
        "bn_size": 4,
        "num_classes": 1000,
    }
    return arch, {"image_size": 224, "channels": 3}


FAMILY: Final = base.Family(
    name="densenet",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample,
    standard={
        "densenet121": _standard(32, [6, 12, 24, 16], 64),
        "densenet169": _standard(32, [6, 12, 32, 32], 64),
        "densenet201": _standard(32, [6, 12, 48, 32], 64),
    },
)
