"""The PerfGraph feature schema: every node, edge and global feature, in column order.

PerfSeer section 3.1 defines the groups; the exact columns, units and transforms are kubeseer's
and are documented in docs/perfgraph.md. The schema is versioned because every checkpoint and
cached dataset stores the version it was built with: a model trained on version 1 features must
refuse version 2 graphs rather than silently read shifted columns. Bump `SCHEMA_VERSION` on any
change to the lists below or to how a value is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

SCHEMA_VERSION: Final[int] = 1


class Transform(StrEnum):
    """What `perfgraph.to_pyg` applies to a raw feature before a model sees it."""

    LOG1P = "log1p"
    """Non-negative magnitudes spanning many decades (FLOPs, bytes, counts)."""
    IDENTITY = "identity"
    """Values already in a small fixed range (shares, density, flags)."""


@dataclass(frozen=True)
class Feature:
    """One column: its name, the unit of the raw value, and its transform."""

    name: str
    unit: str
    transform: Transform
    description: str


_L = Transform.LOG1P
_I = Transform.IDENTITY

NODE_SCHEMA: Final[tuple[Feature, ...]] = (
    # v^hp: hyper-parameters (0 where the operator has no such parameter)
    Feature("kernel_h", "elements", _L, "kernel extent along H (leading spatial axes folded)"),
    Feature("kernel_w", "elements", _L, "kernel extent along W (last spatial axis)"),
    Feature("stride_h", "elements", _L, "stride along H"),
    Feature("stride_w", "elements", _L, "stride along W"),
    Feature("pad_h", "elements", _L, "padding along H, begin + end"),
    Feature("pad_w", "elements", _L, "padding along W, begin + end"),
    Feature("dilation_h", "elements", _L, "dilation along H"),
    Feature("dilation_w", "elements", _L, "dilation along W"),
    Feature("group", "count", _L, "convolution groups"),
    Feature("in_channels", "elements", _L, "C of the first activation input (edge mapping)"),
    Feature("out_channels", "elements", _L, "C of the first output (edge mapping)"),
    Feature("gemm_m", "elements", _L, "GEMM rows M, batch dimensions included"),
    Feature("gemm_k", "elements", _L, "GEMM reduction length K"),
    Feature("units", "elements", _L, "GEMM columns N (a dense layer's units)"),
    Feature("heads", "count", _L, "attention heads, where inferable"),
    Feature("has_bias", "flag", _I, "1 when a Conv/ConvTranspose/Gemm has a bias input"),
    Feature("num_inputs", "count", _L, "distinct activation (non-constant) inputs"),
    Feature("num_outputs", "count", _L, "outputs"),
    Feature("elem_bytes", "bytes", _L, "bytes per element of the first output"),
    # v^c: computation
    Feature("flops", "FLOP", _L, "floating-point operations at the bound batch size"),
    # v^m: memory access
    Feature("mac_bytes", "bytes", _L, "memory access cost: input + weight + output bytes"),
    Feature("weight_bytes", "bytes", _L, "bytes of the weights the operator reads"),
    # v^a: arithmetic intensity
    Feature("arithmetic_intensity", "FLOP/byte", _L, "flops / mac_bytes"),
    # v^p: proportions of the model totals
    Feature("flops_share", "fraction", _I, "flops / model flops_total"),
    Feature("mac_share", "fraction", _I, "mac_bytes / model mac_total"),
    Feature("weight_share", "fraction", _I, "weight_bytes / model weight_bytes_total"),
)

EDGE_SCHEMA: Final[tuple[Feature, ...]] = (
    # e^sz
    Feature("tensor_bytes", "bytes", _L, "bytes of the tensor the edge carries"),
    # e^sp: (batch, channel, height, width) after the rank mapping in docs/perfgraph.md
    Feature("batch", "elements", _L, "B of the mapped shape"),
    Feature("channels", "elements", _L, "C of the mapped shape"),
    Feature("height", "elements", _L, "H of the mapped shape"),
    Feature("width", "elements", _L, "W of the mapped shape"),
)

GLOBAL_SCHEMA: Final[tuple[Feature, ...]] = (
    # u^gp: graph profile
    Feature("num_nodes", "count", _L, "operators Nv"),
    Feature("num_edges", "count", _L, "edges Ne"),
    Feature("density", "ratio", _I, "Ne / (Nv (Nv - 1)); 0 for a single node"),
    # u^c: computation statistics over nodes
    Feature("flops_total", "FLOP", _L, "sum of node flops"),
    Feature("flops_mean", "FLOP", _L, "mean of node flops"),
    Feature("flops_median", "FLOP", _L, "median of node flops"),
    Feature("flops_max", "FLOP", _L, "max of node flops"),
    # u^m: memory access statistics over nodes and edges
    Feature("mac_total", "bytes", _L, "sum of node mac_bytes"),
    Feature("mac_mean", "bytes", _L, "mean of node mac_bytes"),
    Feature("mac_median", "bytes", _L, "median of node mac_bytes"),
    Feature("mac_max", "bytes", _L, "max of node mac_bytes"),
    Feature("weight_bytes_total", "bytes", _L, "sum of node weight_bytes"),
    Feature("weight_bytes_mean", "bytes", _L, "mean of node weight_bytes"),
    Feature("weight_bytes_median", "bytes", _L, "median of node weight_bytes"),
    Feature("weight_bytes_max", "bytes", _L, "max of node weight_bytes"),
    Feature("edge_bytes_mean", "bytes", _L, "mean tensor_bytes per edge; 0 without edges"),
    # u^a, u^b
    Feature("arithmetic_intensity", "FLOP/byte", _L, "flops_total / mac_total"),
    Feature("batch_size", "samples", _L, "the batch size the graph was extracted at"),
)

NODE_FEATURES: Final[tuple[str, ...]] = tuple(f.name for f in NODE_SCHEMA)
EDGE_FEATURES: Final[tuple[str, ...]] = tuple(f.name for f in EDGE_SCHEMA)
GLOBAL_FEATURES: Final[tuple[str, ...]] = tuple(f.name for f in GLOBAL_SCHEMA)
