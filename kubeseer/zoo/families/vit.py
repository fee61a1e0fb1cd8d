"""Vision Transformer (Dosovitskiy et al., 2021) in torchvision's layout.

Arch keys: ``patch_size``, ``layers``, ``hidden``, ``heads``, ``ffn`` (MLP width),
``num_classes``. Input: ``image_size`` (a multiple of ``patch_size``), ``channels``.
`vit_b16` has exactly torchvision's ``vit_b_16`` 86,567,656 parameters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from kubeseer.zoo.families import base, transformer
from kubeseer.zoo.spec import ModelSpec


@dataclass(frozen=True)
class ViTConfig:
    patch_size: int
    shape: transformer.EncoderShape
    num_classes: int
    image: base.ImageInput

    @property
    def tokens(self) -> int:
        return (self.image.image_size // self.patch_size) ** 2 + 1


def parse(spec: ModelSpec) -> ViTConfig:
    arch = base.Fields(spec.arch, "arch")
    config = ViTConfig(
        patch_size=arch.integer("patch_size", hi=256),
        shape=transformer.parse_shape(arch),
        num_classes=arch.integer("num_classes", hi=100_000),
        image=base.image_input(spec, min_size=1),
    )
    arch.done()
    base.require(
        config.image.image_size % config.patch_size == 0,
        f"input.image_size: {config.image.image_size} is not a multiple of "
        f"arch.patch_size={config.patch_size}",
    )
    return config


class ViT(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.shape.hidden
        self.patchify = nn.Conv2d(
            config.image.channels, hidden, config.patch_size, config.patch_size
        )
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.position = nn.Parameter(torch.randn(1, config.tokens, hidden) * 0.02)
        self.encoder = transformer.stack(
            config.shape, pre_norm=True, causal=False, activation=nn.GELU, eps=1e-6, dropout=0.0
        )
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.patchify(x).flatten(2).transpose(1, 2)
        cls = self.class_token.expand(patches.shape[0], -1, -1)
        tokens = torch.cat([cls, patches], 1) + self.position
        out: torch.Tensor = self.head(self.norm(self.encoder(tokens))[:, 0])
        return out


def build(spec: ModelSpec) -> nn.Module:
    return ViT(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Image-side sampler ranges of one size class; the encoder uses `transformer.TOKEN_RANGES`
    without the vocabulary and sequence entries."""

    image_sizes: tuple[int, ...]
    patch_sizes: tuple[int, ...]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((32, 48, 64), (4, 8, 16)),
    "small": Ranges((64, 96, 128), (8, 16)),
    "medium": Ranges((128, 160, 192, 224), (16, 32)),
    "large": Ranges((224, 256, 384), (14, 16, 32)),
}


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    image_size = rng.choice(r.image_sizes)
    patch = rng.choice([p for p in r.patch_sizes if image_size % p == 0])
    shape = transformer.sample_shape(rng, transformer.TOKEN_RANGES[size])
    arch = {
        "patch_size": patch,
        "layers": shape.layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "ffn": shape.ffn,
        "num_classes": base.cnn_head_classes(rng, size),
    }
    return ModelSpec("vit", arch, {"image_size": image_size, "channels": 3})


def _standard(patch: int, layers: int, hidden: int, heads: int, ffn: int) -> base.ArchInput:
    arch = {
        "patch_size": patch,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn": ffn,
        "num_classes": 1000,
    }
    return arch, {"image_size": 224, "channels": 3}


FAMILY: Final = base.Family(
    name="vit",
    task=base.Task.IMAGE_CLASSIFICATION,
    check=check,
    build=build,
    sample=sample,
    standard={
        "vit-b16": _standard(16, 12, 768, 12, 3072),
        "vit-b32": _standard(32, 12, 768, 12, 3072),
        "vit-l16": _standard(16, 24, 1024, 16, 4096),
    },
)
