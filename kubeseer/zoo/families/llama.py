"""A Llama-style causal decoder (Touvron et al., 2023; Llama 2 and 3 as Hugging Face runs them).

Arch keys: ``layers``, ``hidden``, ``heads``, ``kv_heads`` (grouped-query attention: each key
and value head serves ``heads / kv_heads`` query heads), ``ffn`` (the SwiGLU width),
``max_positions`` (the context window), ``tie_embeddings`` (Llama 3.2's 1B and 3B share the
token embedding with the output projection; the 7B and larger models do not). Input:
``seq_len`` (at most ``max_positions``), ``vocab_size``.

What differs from the GPT family, and why each part is written the way Hugging Face's
``LlamaForCausalLM`` (eager and ``sdpa`` attention) writes it:

* **RMSNorm in fp32.** The input is cast to fp32, normalised by its root mean square, cast
  back and scaled, so under autocast the norm keeps an fp32 copy of its input as the
  reference implementation does.
* **Rotary position embeddings** (Su et al., 2021): the cosines and sines of every position
  are computed in fp32 on each forward pass and applied to queries and keys by rotating their
  halves, so no position table is a parameter.
* **Grouped-query attention through scaled-dot-product attention.** Keys and values are
  repeated to the query heads (``repeat_kv``: an expand and a copy) and handed to
  ``scaled_dot_product_attention`` with ``is_causal``: this family is what a Llama job runs,
  so a GPU runs a fused kernel here, where the GPT family writes its attention out.
* **SwiGLU feed-forward**: ``down(silu(gate(x)) * up(x))``; no biases anywhere, no dropout.

`llama-2-7b` has exactly Llama 2 7B's 6,738,415,616 parameters, `llama-3-8b` Llama 3 8B's
8,030,261,248.
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

NORM_EPS: Final = 1e-5
ROPE_THETA: Final = 10000.0


@dataclass(frozen=True)
class LlamaConfig:
    shape: transformer.EncoderShape
    kv_heads: int
    max_positions: int
    tie_embeddings: bool
    tokens: base.TokenInput

    @property
    def head_dim(self) -> int:
        return self.shape.hidden // self.shape.heads


def parse(spec: ModelSpec) -> LlamaConfig:
    arch = base.Fields(spec.arch, "arch")
    config = LlamaConfig(
        shape=transformer.parse_shape(arch),
        kv_heads=arch.integer("kv_heads", hi=256),
        max_positions=arch.integer("max_positions", hi=1 << 20),
        tie_embeddings=arch.flag("tie_embeddings"),
        tokens=base.token_input(spec),
    )
    arch.done()
    base.require(
        config.shape.heads % config.kv_heads == 0,
        f"arch.heads: {config.shape.heads} is not a multiple of arch.kv_heads={config.kv_heads}",
    )
    base.require(
        config.head_dim % 2 == 0,
        f"arch.hidden / arch.heads = {config.head_dim} must be even (rotary embeddings)",
    )
    base.require_within_positions(config.tokens, config.max_positions)
    return config


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, the input's precision restored before scaling."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return self.weight * x.to(dtype)


def rotary_tables(
    seq: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines of every position's rotation angles, each ``(seq, head_dim)`` in fp32."""
    inverse = 1.0 / ROPE_THETA ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Queries or keys ``(B, H, S, D)`` rotated by position: ``x cos + rotate_half(x) sin``."""
    first, second = x.chunk(2, dim=-1)
    half_turned = torch.cat((-second, first), dim=-1)
    return x * cos.to(x.dtype) + half_turned * sin.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions, causal, through SDPA.

    Shapes: ``(B, S, hidden) -> (B, S, hidden)``; keys and values ``(B, kv_heads, S, D)``
    repeated to ``(B, heads, S, D)`` before attending.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, self.heads, self.kv_heads = config.shape.hidden, config.shape.heads, config.kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], heads, self.head_dim).transpose(1, 2)

    def _repeat(self, x: torch.Tensor) -> torch.Tensor:
        groups = self.heads // self.kv_heads
        if groups == 1:
            return x
        batch, kv_heads, seq, dim = x.shape
        expanded = x[:, :, None].expand(batch, kv_heads, groups, seq, dim)
        return expanded.reshape(batch, kv_heads * groups, seq, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = rotate(self._split(self.q_proj(x), self.heads), cos, sin)
        k = rotate(self._split(self.k_proj(x), self.kv_heads), cos, sin)
        v = self._split(self.v_proj(x), self.kv_heads)
        out = functional.scaled_dot_product_attention(
            q, self._repeat(k), self._repeat(v), is_causal=True
        )
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).flatten(2))
        return projected


class Mlp(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Layer(nn.Module):
    """One pre-norm decoder layer: attention then the SwiGLU feed-forward, each residual."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.shape.hidden)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.shape.hidden)
        self.mlp = Mlp(config.shape.hidden, config.shape.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.shape.hidden
        self.embed_tokens = nn.Embedding(config.tokens.vocab_size, hidden)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.shape.layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = (
            None
            if config.tie_embeddings
            else nn.Linear(hidden, config.tokens.vocab_size, bias=False)
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_tables(input_ids.shape[1], self.config.head_dim, input_ids.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return functional.linear(self.norm(x), head)


def build(spec: ModelSpec) -> nn.Module:
    return Llama(parse(spec))


def check(spec: ModelSpec) -> None:
    parse(spec)


@dataclass(frozen=True)
class Ranges:
    """Sampler ranges of one size class: pairs are inclusive ranges, other tuples choices."""

    layers: tuple[int, int]
    heads: tuple[int, ...]
    head_dim: tuple[int, ...]
    groups: tuple[int, ...]
    ffn_ratio: tuple[float, float]
    seq_len: tuple[int, ...]
    vocab_size: tuple[int, int]


RANGES: Final[dict[base.SizeClass, Ranges]] = {
    "tiny": Ranges((1, 3), (2, 3, 4), (8, 16), (1, 2), (2.0, 3.0), (16, 32, 64), (256, 4096)),
    "small": Ranges((2, 4), (2, 4, 8), (16, 32), (1, 2, 4), (2.0, 3.0), (64, 128), (1024, 8192)),
    "medium": Ranges(
        (8, 24), (8, 12, 16), (64, 128), (1, 2, 4), (2.5, 3.5), (512, 1024, 2048), (32000, 50304)
    ),
    "large": Ranges(
        (16, 40),
        (16, 24, 32, 40),
        (128,),
        (1, 4, 8),
        (2.6, 3.5),
        (2048, 4096, 8192),
        (32000, 128256),
    ),
}
"""tiny and small run on a CPU core; medium is about 0.06-1.7 B parameters, large 1-17 B with
sequences up to 8k (docs/zoo.md)."""


def sample(rng: random.Random, size: base.SizeClass) -> ModelSpec:
    r = RANGES[size]
    heads = rng.choice(r.heads)
    hidden = heads * rng.choice(r.head_dim)
    groups = rng.choice([g for g in r.groups if heads % g == 0])
    seq_len = rng.choice(r.seq_len)
    arch = {
        "layers": rng.randint(*r.layers),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": heads // groups,
        "ffn": base.round_to(hidden * rng.uniform(*r.ffn_ratio), 256 if hidden >= 2048 else 16),
        "max_positions": max(seq_len, rng.choice((1, 2)) * 2 ** (seq_len - 1).bit_length()),
        "tie_embeddings": rng.random() < 0.25,
    }
    inputs = {"seq_len": seq_len, "vocab_size": base.round_to(rng.randint(*r.vocab_size), 64)}
    return ModelSpec("llama", arch, inputs)


def _standard(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    context: int,
    vocab: int,
    *,
    tied: bool = False,
) -> base.ArchInput:
    arch = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn": ffn,
        "max_positions": context,
        "tie_embeddings": tied,
    }
    return arch, {"seq_len": context, "vocab_size": vocab}


FAMILY: Final = base.Family(
    name="llama",
    task=base.Task.CAUSAL_LM,
    check=check,
    build=build,
    sample=sample,
    standard={
        "tinyllama-1.1b": _standard(22, 2048, 32, 4, 5632, 2048, 32000),
        "llama-3.2-1b": _standard(16, 2048, 32, 8, 8192, 8192, 128256, tied=True),
        "llama-3.2-3b": _standard(28, 3072, 24, 8, 8192, 8192, 128256, tied=True),
        "llama-2-7b": _standard(32, 4096, 32, 32, 11008, 4096, 32000),
        "llama-3-8b": _standard(32, 4096, 32, 8, 14336, 8192, 128256),
        "llama-2-13b": _standard(40, 5120, 40, 40, 13824, 4096, 32000),
    },
)
