"""The transformer encoder/decoder block shared by the ViT, BERT and GPT families.

Attention is written out as matmul, softmax and matmul instead of calling
``scaled_dot_product_attention``. The exported ONNX graph then shows the ``(B, H, S, S)``
score tensor that the measured run really materialises, so the PerfGraph and the labels
describe the same computation; a fused kernel would make them disagree.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from kubeseer.zoo.families import base


@dataclass(frozen=True)
class EncoderShape:
    """Depth and widths of a transformer stack, shared by every transformer family."""

    layers: int
    hidden: int
    heads: int
    ffn: int


def parse_shape(arch: base.Fields) -> EncoderShape:
    shape = EncoderShape(
        layers=arch.integer("layers", hi=128),
        hidden=arch.integer("hidden", hi=16384),
        heads=arch.integer("heads", hi=256),
        ffn=arch.integer("ffn", hi=65536),
    )
    base.require(
        shape.hidden % shape.heads == 0,
        f"arch.hidden: {shape.hidden} is not a multiple of arch.heads={shape.heads}",
    )
    return shape


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection (GPT-2's ``c_attn``).

    Shapes: ``(B, S, hidden) -> (B, S, hidden)``; the scores are ``(B, heads, S, S)``.
    """

    def __init__(self, hidden: int, heads: int, *, causal: bool, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.causal:
            seq = x.shape[1]
            future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = self.dropout(scores.softmax(-1))
        out: torch.Tensor = self.proj(torch.matmul(weights, v).transpose(1, 2).flatten(2))
        return out


class Block(nn.Module):
    """One transformer layer: attention then a two-layer feed-forward, each residual.

    ``pre_norm`` places LayerNorm before each sub-layer (GPT-2, ViT) instead of after the
    residual sum (BERT).
    """

    def __init__(
        self,
        shape: EncoderShape,
        *,
        pre_norm: bool,
        causal: bool,
        activation: nn.Module,
        eps: float,
        dropout: float,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.norm1 = nn.LayerNorm(shape.hidden, eps=eps)
        self.attention = SelfAttention(shape.hidden, shape.heads, causal=causal, dropout=dropout)
        self.norm2 = nn.LayerNorm(shape.hidden, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(shape.hidden, shape.ffn),
            activation,
            nn.Linear(shape.ffn, shape.hidden),
            nn.Dropout(dropout),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.norm1(x)))
            out: torch.Tensor = x + self.mlp(self.norm2(x))
            return out
        x = self.norm1(x + self.dropout(self.attention(x)))
        out = self.norm2(x + self.mlp(x))
        return out


def stack(
    shape: EncoderShape,
    *,
    pre_norm: bool,
    causal: bool,
    activation: type[nn.Module] | nn.Module,
    eps: float,
    dropout: float,
) -> nn.Sequential:
    return nn.Sequential(
        *(
            Block(
                shape,
                pre_norm=pre_norm,
                causal=causal,
                activation=activation() if isinstance(activation, type) else activation,
                eps=eps,
                dropout=dropout,
            )
            for _ in range(shape.layers)
        )
    )


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class for token models (inclusive)."""

    layers: tuple[int, int]
    heads: tuple[int, int]
    head_dim: tuple[int, ...]
    ffn_ratio: tuple[float, float]
    seq_len: tuple[int, ...]
    vocab_size: tuple[int, int]


TOKEN_RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((1, 3), (1, 4), (8, 16, 32), (2.0, 4.0), (16, 32, 48, 64), (256, 4096)),
    "small": Ranges((2, 4), (2, 6), (16, 32), (2.0, 4.0), (32, 64, 96, 128), (1024, 8192)),
    "medium": Ranges((4, 12), (4, 12), (32, 64), (3.0, 4.0), (128, 256, 384, 512), (8192, 32768)),
    "large": Ranges((12, 24), (12, 20), (64, 80), (4.0, 4.0), (512, 1024, 2048), (30522, 50304)),
}


def sample_shape(rng: random.Random, r: Ranges) -> EncoderShape:
    heads = rng.randint(*r.heads)
    hidden = heads * rng.choice(r.head_dim)
    return EncoderShape(
        layers=rng.randint(*r.layers),
        hidden=hidden,
        heads=heads,
        ffn=base.round_to(hidden * rng.uniform(*r.ffn_ratio), 16),
    )


def sample_tokens(rng: random.Random, r: Ranges) -> tuple[int, int, int]:
    """Sequence length, vocabulary size and a position table at least as long as the sequence."""
    seq_len = rng.choice(r.seq_len)
    vocab = base.round_to(rng.randint(*r.vocab_size), 64)
    max_positions = max(seq_len, rng.choice((1, 2, 4)) * 2 ** (seq_len - 1).bit_length())
    return seq_len, vocab, max_positions
