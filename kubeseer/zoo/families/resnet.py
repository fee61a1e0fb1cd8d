"""ResNet (He et al., 2016) and ResNeXt (Xie et al., 2017) in torchvision's v1.5 layout.

Both families share one builder: a ResNeXt is a bottleneck ResNet whose 3x3 convolution is
grouped. Stride sits on the 3x3 convolution (v1.5), so `resnet50` has exactly torchvision's
25,557,032 parameters.

Arch keys: ``block`` ("basic" | "bottleneck"), ``layers`` (blocks per stage), ``widths``
(planes per stage; a bottleneck outputs 4x planes), ``stem_width``, ``groups``,
``width_per_group`` (bottleneck inner width = planes * width_per_group / 64 * groups),
``num_classes``. Input: ``image_size``, ``channels``.
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
class ResNetConfig:
    block: str
    layers: tuple[int, ...]
    widths: tuple[int, ...]
    stem_width: int
    groups: int
    width_per_group: int
    num_classes: int
    image: base.ImageInput

    @property
    def expansion(self) -> int:
        return 4 if self.block == "bottleneck" else 1


def parse(spec: ModelSpec) -> ResNetConfig:
    arch = base.Fields(spec.arch, "arch")
    config = ResNetConfig(
        block=arch.choice("block", ("basic", "bottleneck")),
        layers=arch.integers("layers", lo=1, hi=64),
        widths=arch.integers("widths", lo=1, hi=8192),
        stem_width=arch.integer("stem_width", hi=1024),
        groups=arch.integer("groups", hi=256),
        width_per_group=arch.integer("width_per_group", hi=1024),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    base.require(
        len(config.layers) == len(config.widths),
        f"arch: layers has {len(config.layers)} stages but widths has {len(config.widths)}",
    )
    base.require(len(config.layers) <= 6, "arch.layers: at most 6 stages")
    if config.block == "basic":
        base.require(
            config.groups == 1 and config.width_per_group == 64,
            "arch: a basic block supports only groups=1 and width_per_group=64",
        )
    base.require(
        min(config.widths) * config.width_per_group >= 64,
        "arch: widths * width_per_group / 64 (the bottleneck's per-group width) must be >= 1",
    )
    if spec.family == "resnext":
        base.require(config.block == "bottleneck", "arch.block: ResNeXt uses bottleneck blocks")
        base.require(config.groups >= 2, "arch.groups: ResNeXt needs groups >= 2")
    else:
        base.require(config.groups == 1, "arch.groups: a ResNet has groups=1 (use resnext)")
    return config


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]


class _Block(nn.Module):
    """A basic (3x3, 3x3) or bottleneck (1x1, grouped 3x3, 1x1) residual block."""

    def __init__(self, config: ResNetConfig, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        c_out = planes * config.expansion
        if config.block == "basic":
            layers = [*_conv_bn(c_in, planes, 3, stride), nn.ReLU(), *_conv_bn(planes, c_out, 3, 1)]
        else:
            width = int(planes * (config.width_per_group / 64.0)) * config.groups
            layers = [
                *_conv_bn(c_in, width, 1, 1),
                nn.ReLU(),
                *_conv_bn(width, width, 3, stride, config.groups),
                nn.ReLU(),
                *_conv_bn(width, c_out, 1, 1),
            ]
        self.body = nn.Sequential(*layers)
        self.shortcut: nn.Module = (
            nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.body(x) + self.shortcut(x))
        return out


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = [
            *_conv_bn(config.image.channels, config.stem_width, 7, 2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        c_in = config.stem_width
        for stage, (blocks, planes) in enumerate(zip(config.layers, config.widths, strict=True)):
            for i in range(blocks):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(_Block(config, c_in, planes, stride))
                c_in = planes * config.expansion
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.flatten(self.pool(self.features(x)), 1))
        return out


def build(spec: ModelSpec) -> nn.Module:
    return ResNet(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive)."""

    image_sizes: tuple[int, ...]
    stages: tuple[int, int]
    blocks_per_stage: tuple[int, int]
    base_width: tuple[int, int]
    groups: tuple[int, ...]
    width_per_group: tuple[int, ...]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((32, 40, 48, 56, 64), (2, 4), (1, 2), (8, 24), (2, 4, 8), (2, 4)),
    "small": Ranges((64, 80, 96, 112, 128), (3, 4), (1, 3), (16, 32), (4, 8, 16), (2, 4)),
    "medium": Ranges((128, 160, 192, 224), (4, 4), (1, 6), (32, 64), (8, 16, 32), (4, 8)),
    "large": Ranges((192, 224, 256, 288, 320), (4, 4), (2, 12), (48, 128), (16, 32, 64), (4, 8)),
}


def _sample(family: str, rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    stages = rng.randint(*r.stages)
    block = "bottleneck" if family == "resnext" else rng.choice(("basic", "bottleneck"))
    width = rng.randint(*r.base_width)
    widths = base.width_ladder(rng, width, stages)
    grouped = family == "resnext"
    arch = {
        "block": block,
        "layers": [rng.randint(*r.blocks_per_stage) for _ in range(stages)],
        "widths": widths,
        "stem_width": base.round_to(width * rng.uniform(0.75, 1.5), 8),
        "groups": rng.choice(r.groups) if grouped else 1,
        # At least one channel per group in the narrowest stage.
        "width_per_group": max(rng.choice(r.width_per_group), -(-64 // min(widths)))
        if grouped
        else 64,
        "num_classes": base.cnn_head_classes(rng, size),
    }
    if block == "bottleneck" and not grouped:
        # Wide ResNets widen only the bottleneck's inner convolution.
        arch["width_per_group"] = rng.choice((64, 64, 96, 128))
    image = {"image_size": rng.choice(r.image_sizes), "channels": 3}
    return ModelSpec(family, arch, image)


def sample_resnet(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    return _sample("resnet", rng, size)


def sample_resnext(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    return _sample("resnext", rng, size)


_IMAGENET: Final = {"image_size": 224, "channels": 3}
_WIDTHS: Final = [64, 128, 256, 512]


def _standard(block: str, layers: list[int], groups: int = 1, wpg: int = 64) -> base.ArchInput:
    arch = {
        "block": block,
        "layers": layers,
        "widths": _WIDTHS,
        "stem_width": 64,
        "groups": groups,
        "width_per_group": wpg,
        "num_classes": 1000,
    }
    return arch, dict(_IMAGENET)


RESNET: Final = base.Family(
    name="resnet",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample_resnet,
    standard={
        "resnet18": _standard("basic", [2, 2, 2, 2]),
        "resnet34": _standard("basic", [3, 4, 6, 3]),
        "resnet50": _standard("bottleneck", [3, 4, 6, 3]),
        "resnet101": _standard("bottleneck", [3, 4, 23, 3]),
        "resnet152": _standard("bottleneck", [3, 8, 36, 3]),
        "wide_resnet50_2": _standard("bottleneck", [3, 4, 6, 3], wpg=128),
    },
)

RESNEXT: Final = base.Family(
    name="resnext",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample_resnext,
    standard={
        "resnext50_32x4d": _standard("bottleneck", [3, 4, 6, 3], groups=32, wpg=4),
        "resnext101_32x8d": _standard("bottleneck", [3, 4, 23, 3], groups=32, wpg=8),
    },
)
