"""MobileNet v1 (Howard et al., 2017) and v2 (Sandler et al., 2018).

v1 arch keys: ``stem`` (channels of the first 3x3 stride-2 convolution), ``blocks`` (rows
``[out_channels, stride]`` of depthwise-separable blocks), ``num_classes``.

v2 arch keys: ``stem``, ``settings`` (rows ``[t, c, n, s]``: expansion, output channels,
repeats, first stride, as in the paper's Table 2), ``last_channel``, ``num_classes``.
Channel counts are stored already rounded to multiples of 8 (torchvision's
``_make_divisible``), so `mobilenet_v2` has exactly torchvision's 3,504,872 parameters.

Input: ``image_size``, ``channels``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from kubeseer.zoo.families import base
from kubeseer.zoo.spec import ModelSpec


def _conv_bn_act(
    c_in: int, c_out: int, kernel: int, stride: int, groups: int, act: type[nn.Module]
) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
        act(),
    ]


@dataclass(frozen=True)
class V1Config:
    stem: int
    blocks: tuple[tuple[int, ...], ...]
    num_classes: int
    image: base.ImageInput


def parse_v1(spec: ModelSpec) -> V1Config:
    arch = base.Fields(spec.arch, "arch")
    config = V1Config(
        stem=arch.integer("stem", hi=4096),
        blocks=arch.rows("blocks", width=2, hi=8192),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    for i, (_, stride) in enumerate(config.blocks):
        base.require(stride in (1, 2), f"arch.blocks[{i}][1]: stride must be 1 or 2")
    return config


class MobileNetV1(nn.Module):
    def __init__(self, config: V1Config) -> None:
        super().__init__()
        self.config = config
        layers = _conv_bn_act(config.image.channels, config.stem, 3, 2, 1, nn.ReLU)
        c_in = config.stem
        for c_out, stride in config.blocks:
            layers += _conv_bn_act(c_in, c_in, 3, stride, c_in, nn.ReLU)
            layers += _conv_bn_act(c_in, c_out, 1, 1, 1, nn.ReLU)
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.flatten(self.pool(self.features(x)), 1))
        return out


@dataclass(frozen=True)
class V2Config:
    stem: int
    settings: tuple[tuple[int, ...], ...]
    last_channel: int
    num_classes: int
    image: base.ImageInput


def parse_v2(spec: ModelSpec) -> V2Config:
    arch = base.Fields(spec.arch, "arch")
    config = V2Config(
        stem=arch.integer("stem", hi=4096),
        settings=arch.rows("settings", width=4, hi=8192),
        last_channel=arch.integer("last_channel", hi=16384),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    for i, (t, _, _, s) in enumerate(config.settings):
        base.require(t <= 16, f"arch.settings[{i}][0]: expansion must be <= 16")
        base.require(s in (1, 2), f"arch.settings[{i}][3]: stride must be 1 or 2")
    return config


class _InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = c_in * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += _conv_bn_act(c_in, hidden, 1, 1, 1, nn.ReLU6)
        layers += _conv_bn_act(hidden, hidden, 3, stride, hidden, nn.ReLU6)
        layers += [nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    def __init__(self, config: V2Config) -> None:
        super().__init__()
        self.config = config
        layers = _conv_bn_act(config.image.channels, config.stem, 3, 2, 1, nn.ReLU6)
        c_in = config.stem
        for t, c, n, s in config.settings:
            for i in range(n):
                layers.append(_InvertedResidual(c_in, c, s if i == 0 else 1, t))
                c_in = c
        layers += _conv_bn_act(c_in, config.last_channel, 1, 1, 1, nn.ReLU6)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Dropout(0.2), nn.Linear(config.last_channel, config.num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(torch.flatten(self.pool(self.features(x)), 1))
        return out


def build_v1(spec: ModelSpec) -> nn.Module:
    return MobileNetV1(parse_v1(spec))


def check_v1(spec: ModelSpec) -> None:
    parse_v1(spec)


def build_v2(spec: ModelSpec) -> nn.Module:
    return MobileNetV2(parse_v2(spec))


def check_v2(spec: ModelSpec) -> None:
    parse_v2(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive); widths scale the reference tables."""

    image_sizes: tuple[int, ...]
    width_multiplier: tuple[float, float]
    depth_multiplier: tuple[float, float]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((32, 48, 64), (0.125, 0.35), (0.25, 0.6)),
    "small": Ranges((64, 96, 128), (0.25, 0.75), (0.4, 1.0)),
    "medium": Ranges((128, 160, 192, 224), (0.5, 1.25), (0.6, 1.5)),
    "large": Ranges((224, 256, 288, 320), (1.0, 2.0), (1.0, 2.0)),
}

# (out_channels, stride, repeats) of MobileNet v1's reference body.
_V1_BODY: Final = ((64, 1, 1), (128, 2, 1), (128, 1, 1), (256, 2, 1), (256, 1, 1), (512, 2, 1),
                   (512, 1, 5), (1024, 2, 1), (1024, 1, 1))  # fmt: skip
_V2_SETTINGS: Final = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
    (6, 320, 1, 1),
)  # fmt: skip


def _scaled_repeats(rng: random.Random, repeats: int, depth: float) -> int:
    return max(1, round(repeats * depth * rng.uniform(0.8, 1.2)))


def sample_v1(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    width = rng.uniform(*r.width_multiplier)
    depth = rng.uniform(*r.depth_multiplier)
    blocks = []
    for c, s, n in _V1_BODY:
        c_out = base.round_to(c * width * rng.uniform(0.8, 1.2), 8)
        blocks += [[c_out, s]] + [[c_out, 1]] * (_scaled_repeats(rng, n, depth) - 1)
    arch = {
        "stem": base.round_to(32 * width, 8),
        "blocks": blocks,
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("mobilenet_v1", arch, {"image_size": rng.choice(r.image_sizes), "channels": 3})


def sample_v2(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    width = rng.uniform(*r.width_multiplier)
    depth = rng.uniform(*r.depth_multiplier)
    settings = [
        [
            t if t == 1 else rng.choice((3, 4, 6, 6)),
            base.round_to(c * width * rng.uniform(0.8, 1.2), 8),
            _scaled_repeats(rng, n, depth),
            s,
        ]
        for t, c, n, s in _V2_SETTINGS
    ]
    arch = {
        "stem": base.round_to(32 * width, 8),
        "settings": settings,
        "last_channel": base.round_to(1280 * max(1.0, width) * rng.uniform(0.5, 1.0), 8),
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("mobilenet_v2", arch, {"image_size": rng.choice(r.image_sizes), "channels": 3})


_IMAGENET: Final = {"image_size": 224, "channels": 3}

V1: Final = base.Family(
    name="mobilenet_v1",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check_v1,
    build=build_v1,
    sample=sample_v1,
    standard={
        "mobilenet_v1": (
            {
                "stem": 32,
                "blocks": [[c, s] for c, s, n in _V1_BODY for _ in range(n)],
                "num_classes": 1000,
            },
            dict(_IMAGENET),
        )
    },
)

V2: Final = base.Family(
    name="mobilenet_v2",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check_v2,
    build=build_v2,
    sample=sample_v2,
    standard={
        "mobilenet_v2": (
            {
                "stem": 32,
                "settings": [list(row) for row in _V2_SETTINGS],
                "last_channel": 1280,
                "num_classes": 1000,
            },
            dict(_IMAGENET),
        )
    },
)
