"""GoogLeNet / Inception v1 (Szegedy et al., 2015) in torchvision's layout, without the
auxiliary classifiers (they exist only during ImageNet training and are absent from the
released model).

Arch keys: ``stem`` (three widths: 7x7 stride-2 conv, 1x1 conv, 3x3 conv), ``stages`` (lists
of Inception modules, each ``[c1x1, c3x3_reduce, c3x3, cbig_reduce, cbig, pool_proj]``; a
3x3 stride-2 max-pool separates stages), ``big_kernel`` (kernel of the branch the paper draws
as 5x5; torchvision uses 3, which is what its released weights have), ``num_classes``.
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

_MODULE_WIDTH: Final = 6


@dataclass(frozen=True)
class InceptionConfig:
    stem: tuple[int, ...]
    stages: tuple[tuple[tuple[int, ...], ...], ...]
    big_kernel: int
    num_classes: int
    image: base.ImageInput


def _pooled(side: int) -> int:
    """Side after a 3x3 stride-2 ceil-mode max-pool."""
    return -(-(side - 3) // 2) + 1


def _pool_sides(config: InceptionConfig) -> list[int]:
    """Input sides of every max-pool, in order; each must be at least the 3x3 kernel."""
    side = (config.image.image_size - 1) // 2 + 1
    sides = []
    for _ in range(1 + len(config.stages)):
        sides.append(side)
        if side < 3:
            break
        side = _pooled(side)
    return sides


def parse(spec: ModelSpec) -> InceptionConfig:
    arch = base.Fields(spec.arch, "arch")
    stem = arch.integers("stem", hi=4096, min_len=3)
    base.require(len(stem) == 3, "arch.stem: must have 3 widths")
    stages_raw = base.check_list(arch.raw("stages"), "arch.stages")
    stages = []
    for i, stage in enumerate(stages_raw):
        modules = base.check_list(stage, f"arch.stages[{i}]")
        parsed = []
        for j, module in enumerate(modules):
            name = f"arch.stages[{i}][{j}]"
            widths = base.check_list(module, name, min_len=_MODULE_WIDTH)
            base.require(len(widths) == _MODULE_WIDTH, f"{name}: must have 6 widths")
            parsed.append(
                tuple(base.check_int(w, f"{name}[{k}]", hi=4096) for k, w in enumerate(widths))
            )
        stages.append(tuple(parsed))
    config = InceptionConfig(
        stem=stem,
        stages=tuple(stages),
        big_kernel=arch.choice("big_kernel", (3, 5)),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    base.require(len(config.stages) <= 4, "arch.stages: at most 4 stages")
    sides = _pool_sides(config)
    base.require(
        len(sides) == 1 + len(config.stages) and sides[-1] >= 3,
        f"input.image_size: {config.image.image_size} is too small for "
        f"{len(config.stages)} stages (feature map shrinks below the 3x3 pool)",
    )
    return config


def _conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
        nn.BatchNorm2d(c_out, eps=0.001),
        nn.ReLU(),
    )


class _Inception(nn.Module):
    def __init__(self, c_in: int, widths: tuple[int, ...], big_kernel: int) -> None:
        super().__init__()
        c1, c3r, c3, cbr, cb, cp = widths
        self.branch1 = _conv(c_in, c1, 1)
        self.branch2 = nn.Sequential(_conv(c_in, c3r, 1), _conv(c3r, c3, 3))
        self.branch3 = nn.Sequential(_conv(c_in, cbr, 1), _conv(cbr, cb, big_kernel))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _conv(c_in, cp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, config: InceptionConfig) -> None:
        super().__init__()
        self.config = config
        s1, s2, s3 = config.stem
        layers: list[nn.Module] = [
            _conv(config.image.channels, s1, 7, 2),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            _conv(s1, s2, 1),
            _conv(s2, s3, 3),
        ]
        c_in = s3
        for stage in config.stages:
            layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
            for widths in stage:
                layers.append(_Inception(c_in, widths, config.big_kernel))
                c_in = widths[0] + widths[2] + widths[4] + widths[5]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(c_in, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.dropout(torch.flatten(self.pool(self.features(x)), 1)))
        return out


def build(spec: ModelSpec) -> nn.Module:
    return GoogLeNet(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive); widths scale GoogLeNet's tables."""

    image_sizes: tuple[int, ...]
    stages: tuple[int, int]
    modules_per_stage: tuple[int, int]
    width_multiplier: tuple[float, float]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((48, 64), (1, 2), (1, 2), (0.0625, 0.2)),
    "small": Ranges((64, 96, 128), (2, 3), (1, 3), (0.125, 0.4)),
    "medium": Ranges((128, 160, 192, 224), (3, 3), (1, 5), (0.4, 1.0)),
    "large": Ranges((224, 256, 288, 320), (3, 4), (2, 6), (0.75, 2.0)),
}

_STEM: Final = (64, 64, 192)
_GOOGLENET: Final = (
    ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),
    (
        (192, 96, 208, 16, 48, 64),
        (160, 112, 224, 24, 64, 64),
        (128, 128, 256, 24, 64, 64),
        (112, 144, 288, 32, 64, 64),
        (256, 160, 320, 32, 128, 128),
    ),
    ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)),
)
# Reference module widths by stage, cycled when a sampled stage is deeper than GoogLeNet's.
_TEMPLATES: Final = (*_GOOGLENET, _GOOGLENET[-1])


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    width = rng.uniform(*r.width_multiplier)
    stages = []
    for template in _TEMPLATES[: rng.randint(*r.stages)]:
        modules = []
        for j in range(rng.randint(*r.modules_per_stage)):
            reference = template[j % len(template)]
            modules.append(
                [base.round_to(w * width * rng.uniform(0.8, 1.25), 4) for w in reference]
            )
        stages.append(modules)
    arch = {
        "stem": [base.round_to(w * width * rng.uniform(0.8, 1.25), 8) for w in _STEM],
        "stages": stages,
        "big_kernel": rng.choice((3, 5)),
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("inception", arch, {"image_size": rng.choice(r.image_sizes), "channels": 3})


FAMILY: Final = base.Family(
    name="inception",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample,
    standard={
        "googlenet": (
            {
                "stem": list(_STEM),
                "stages": [[list(m) for m in stage] for stage in _GOOGLENET],
                "big_kernel": 3,
                "num_classes": 1000,
            },
            {"image_size": 224, "channels": 3},
        )
    },
)
