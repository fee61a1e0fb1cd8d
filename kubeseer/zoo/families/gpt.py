"""A GPT-2-style causal decoder (Radford et al., 2019).

Arch keys: ``layers``, ``hidden``, ``heads``, ``ffn``, ``max_positions``. Input: ``seq_len``
(at most ``max_positions``), ``vocab_size``. Pre-norm blocks, a final LayerNorm and an
output projection tied to the token embedding, so `gpt2-small` has exactly GPT-2 small's
124,439,808 parameters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn
from torch.nn import functional

from kubeseer.zoo.families import base, transformer
from kubeseer.zoo.spec import ModelSpec


@dataclass(frozen=True)
class GPTConfig:
    shape: transformer.EncoderShape
    max_positions: int
    tokens: base.TokenInput


def parse(spec: ModelSpec) -> GPTConfig:
    arch = base.Fields(spec.arch, "arch")
    config = GPTConfig(
        shape=transformer.parse_shape(arch),
        max_positions=arch.integer("max_positions", hi=65536),
        tokens=base.token_input(spec),
    )
    arch.done()
    base.require_within_positions(config.tokens, config.max_positions)
    return config


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.shape.hidden
        self.word = nn.Embedding(config.tokens.vocab_size, hidden)
        self.position = nn.Embedding(config.max_positions, hidden)
        self.dropout = nn.Dropout(0.1)
        self.decoder = transformer.stack(
            config.shape,
            pre_norm=True,
            causal=True,
            activation=nn.GELU(approximate="tanh"),
            eps=1e-5,
            dropout=0.1,
        )
        self.norm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        hidden = self.decoder(self.dropout(self.word(input_ids) + self.position.weight[:seq]))
        return functional.linear(self.norm(hidden), self.word.weight)


def build(spec: ModelSpec) -> nn.Module:
    return GPT(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    shape = transformer.sample_shape(rng, transformer.TOKEN_RANGES[size])
    seq_len, vocab, max_positions = transformer.sample_tokens(rng, transformer.TOKEN_RANGES[size])
    arch = {
        "layers": shape.layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "ffn": shape.ffn,
        "max_positions": max_positions,
    }
    return ModelSpec("gpt", arch, {"seq_len": seq_len, "vocab_size": vocab})


def _standard(layers: int, hidden: int, heads: int) -> base.ArchInput:
    arch = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn": 4 * hidden,
        "max_positions": 1024,
    }
    return arch, {"seq_len": 1024, "vocab_size": 50257}


FAMILY: Final = base.Family(
    name="gpt",
    task=base.Task.CAUSAL_LM,
    check=check,
    build=build,
    sample=sample,
    standard={
        "gpt2-small": _standard(12, 768, 12),
        "gpt2-medium": _standard(24, 1024, 16),
    },
)
