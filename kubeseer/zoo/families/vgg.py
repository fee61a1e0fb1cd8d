"""VGG (Simonyan and Zisserman, 2015) in torchvision's layout.

Arch keys: ``stages`` (output channels of each 3x3 convolution, grouped by stage; every stage
ends in a 2x2 max-pool), ``batch_norm``, ``pool_size`` (side of the adaptive average pool
before the classifier; 7 in the reference nets), ``classifier`` (hidden fully-connected
widths), ``num_classes``. Input: ``image_size``, ``channels``.

The feature map entering the adaptive pool must be a multiple of ``pool_size``: that keeps
the pool an exact average that every ONNX exporter lowers to a plain ``AveragePool``.
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
class VGGConfig:
    stages: tuple[tuple[int, ...], ...]
    batch_norm: bool
    pool_size: int
    classifier: tuple[int, ...]
    num_classes: int
    image: base.ImageInput


def parse(spec: ModelSpec) -> VGGConfig:
    arch = base.Fields(spec.arch, "arch")
    stages_raw = base.check_list(arch.raw("stages"), "arch.stages")
    stages = []
    for i, stage in enumerate(stages_raw):
        convs = base.check_list(stage, f"arch.stages[{i}]")
        stages.append(
            tuple(base.check_int(c, f"arch.stages[{i}][{j}]", hi=8192) for j, c in enumerate(convs))
        )
    config = VGGConfig(
        stages=tuple(stages),
        batch_norm=arch.flag("batch_norm"),
        pool_size=arch.integer("pool_size", hi=64),
        classifier=arch.integers("classifier", hi=65536, min_len=0),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec),
    )
    arch.done()
    base.require(len(config.stages) <= 7, "arch.stages: at most 7 stages")
    final = config.image.image_size >> len(config.stages)
    base.require(
        final >= config.pool_size and final % config.pool_size == 0,
        f"input.image_size: {config.image.image_size} leaves a {final}x{final} map after "
        f"{len(config.stages)} pools, which is not a multiple of pool_size={config.pool_size}",
    )
    return config


class VGG(nn.Module):
    def __init__(self, config: VGGConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        c_in = config.image.channels
        for stage in config.stages:
            for c_out in stage:
                layers.append(nn.Conv2d(c_in, c_out, 3, padding=1))
                if config.batch_norm:
                    layers.append(nn.BatchNorm2d(c_out))
                layers.append(nn.ReLU())
                c_in = c_out
            layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(config.pool_size)
        head: list[nn.Module] = []
        width = c_in * config.pool_size**2
        for hidden in config.classifier:
            head += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(0.5)]
            width = hidden
        head.append(nn.Linear(width, config.num_classes))
        self.classifier = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(torch.flatten(self.pool(self.features(x)), 1))
        return out


def build(spec: ModelSpec) -> nn.Module:
    return VGG(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class (inclusive)."""

    image_sizes: tuple[int, ...]
    stages: tuple[int, int]
    convs_per_stage: tuple[int, int]
    base_width: tuple[int, int]
    fc_layers: tuple[int, int]
    fc_width: tuple[int, int]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((32, 48, 64), (3, 4), (1, 2), (8, 16), (0, 2), (64, 256)),
    "small": Ranges((64, 96, 128), (4, 5), (1, 2), (12, 24), (1, 2), (128, 1024)),
    "medium": Ranges((128, 160, 192, 224), (5, 5), (1, 3), (32, 64), (1, 2), (512, 4096)),
    "large": Ranges((224, 256, 288, 320), (5, 5), (2, 4), (64, 96), (2, 2), (2048, 4096)),
}


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    n_stages = rng.randint(*r.stages)
    widths = base.width_ladder(rng, rng.randint(*r.base_width), n_stages)
    stages = [[min(w, 1024)] * rng.randint(*r.convs_per_stage) for w in widths]
    image_size = rng.choice(r.image_sizes)
    final = image_size >> n_stages
    pool_size = rng.choice([p for p in range(1, min(final, 7) + 1) if final % p == 0])
    arch = {
        "stages": stages,
        "batch_norm": rng.random() < 0.5,
        "pool_size": pool_size,
        "classifier": [
            base.round_to(rng.uniform(*r.fc_width), 64) for _ in range(rng.randint(*r.fc_layers))
        ],
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("vgg", arch, {"image_size": image_size, "channels": 3})


def _standard(stages: list[list[int]], batch_norm: bool = False) -> base.ArchInput:
    arch = {
        "stages": stages,
        "batch_norm": batch_norm,
        "pool_size": 7,
        "classifier": [4096, 4096],
        "num_classes": 1000,
    }
    return arch, {"image_size": 224, "channels": 3}


_VGG11: Final = [[64], [128], [256, 256], [512, 512], [512, 512]]
_VGG16: Final = [[64, 64], [128, 128], [256] * 3, [512] * 3, [512] * 3]

FAMILY: Final = base.Family(
    name="vgg",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample,
    standard={
        "vgg11": _standard(_VGG11),
        "vgg11_bn": _standard(_VGG11, batch_norm=True),
        "vgg16": _standard(_VGG16),
    },
)
