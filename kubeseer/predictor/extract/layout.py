"""Mapping tensor shapes of any rank onto PerfSeer's (batch, channel, height, width)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

# Operators that lay their tensors out channel-first (N, C, spatial...): a rank-3 tensor next
# to one of them is (N, C, L), anywhere else a transformer's (B, T, C).
CHANNEL_FIRST_OPS: Final[frozenset[str]] = frozenset(
    {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "MaxPool",
     "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
     "BatchNormalization", "InstanceNormalization", "GroupNormalization", "LRN", "MaxUnpool",
     "DepthToSpace", "SpaceToDepth"}
)  # fmt: skip


def bchw(shape: Sequence[int], *, channel_first: bool) -> tuple[int, int, int, int]:
    """Map a tensor shape of any rank onto PerfSeer's (batch, channel, height, width).

    The product of the four always equals the element count. Rank 0 is (1, 1, 1, 1); rank 1 is
    one sample of features (1, C, 1, 1); rank 2 is (B, C, 1, 1); rank 3 is (B, C, L, 1) when
    channel-first (Conv1d), else a transformer's (B, T, C) -> (B, C, T, 1); rank >= 4 keeps
    B, C and W and folds every middle axis into H.
    """
    rank = len(shape)
    if rank == 0:
        return 1, 1, 1, 1
    if rank == 1:
        return 1, shape[0], 1, 1
    if rank == 2:
        return shape[0], shape[1], 1, 1
    if rank == 3:
        if channel_first:
            return shape[0], shape[1], shape[2], 1
        return shape[0], shape[2], shape[1], 1
    return shape[0], shape[1], math.prod(shape[2:-1]), shape[-1]


def fold_spatial(values: Sequence[int]) -> tuple[int, int]:
    """Per-axis values of a kernel, stride or dilation as (H, W), like `bchw` folds axes."""
    if not values:
        return 0, 0
    if len(values) == 1:
        return values[0], 1
    return math.prod(values[:-1]), values[-1]


def fold_pads(per_axis: Sequence[int]) -> tuple[int, int]:
    if not per_axis:
        return 0, 0
    if len(per_axis) == 1:
        return per_axis[0], 0
    return sum(per_axis[:-1]), per_axis[-1]
