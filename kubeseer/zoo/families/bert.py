"""A BERT-style encoder (Devlin et al., 2019) with its masked-language-model head.

Arch keys: ``layers``, ``hidden``, ``heads``, ``ffn``, ``max_positions`` (length of the
learned position table), ``type_vocab`` (segment embeddings). Input: ``seq_len`` (at most
``max_positions``), ``vocab_size``.

The model maps token ids ``(B, S)`` to vocabulary logits ``(B, S, V)``; the decoder shares
the word-embedding matrix, as in BERT. `bert-base` has exactly Hugging Face's
``BertForMaskedLM`` (bert-base-uncased) 109,514,298 parameters.
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
class BertConfig:
    shape: transformer.EncoderShape
    max_positions: int
    type_vocab: int
    tokens: base.TokenInput


def parse(spec: ModelSpec) -> BertConfig:
    arch = base.Fields(spec.arch, "arch")
    config = BertConfig(
        shape=transformer.parse_shape(arch),
        max_positions=arch.integer("max_positions", hi=65536),
        type_vocab=arch.integer("type_vocab", hi=16),
        tokens=base.token_input(spec),
    )
    arch.done()
    base.require_within_positions(config.tokens, config.max_positions)
    return config


class Bert(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.shape.hidden
        self.word = nn.Embedding(config.tokens.vocab_size, hidden)
        self.position = nn.Embedding(config.max_positions, hidden)
        self.token_type = nn.Embedding(config.type_vocab, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.encoder = transformer.stack(
            config.shape, pre_norm=False, causal=False, activation=nn.GELU, eps=1e-12, dropout=0.1
        )
        self.transform = nn.Sequential(
            nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12)
        )
        self.decoder_bias = nn.Parameter(torch.zeros(config.tokens.vocab_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        # Every token is in segment 0, so the segment embedding is one broadcast row.
        embedded = self.word(input_ids) + self.position.weight[:seq] + self.token_type.weight[0]
        hidden = self.encoder(self.dropout(self.embedding_norm(embedded)))
        return functional.linear(self.transform(hidden), self.word.weight, self.decoder_bias)


def build(spec: ModelSpec) -> nn.Module:
    return Bert(parse(spec))


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
        "type_vocab": 2,
    }
    return ModelSpec("bert", arch, {"seq_len": seq_len, "vocab_size": vocab})


def _standard(layers: int, hidden: int, heads: int) -> base.ArchInput:
    arch = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn": 4 * hidden,
        "max_positions": 512,
        "type_vocab": 2,
    }
    return arch, {"seq_len": 128, "vocab_size": 30522}


FAMILY: Final = base.Family(
    name="bert",
    task=base.Task.MASKED_LM,
    check=check,
    build=build,
    sample=sample,
    standard={
        "bert-base": _standard(12, 768, 12),
        "bert-large": _standard(24, 1024, 16),
    },
)
