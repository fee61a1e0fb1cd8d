"""Limits a GPU job can hit long before it runs out of memory.

Public out-of-memory evidence (timm's benchmark retries any `RuntimeError` with a smaller batch)
mixes real out-of-memory failures with failures of kernels that cannot launch at that batch.
The one checked here: a scaled-dot-product attention call whose batch (all leading dimensions
but the heads; windowed attention multiplies it by the windows) exceeds 65,535. PyTorch's fused
kernels (FlashAttention-2, memory-efficient) put that batch on a CUDA grid axis limited to
65,535 blocks, so the launch fails ("invalid configuration argument") with memory to spare.
Tensors of 2^31 elements and more are *not* counted as a limit: PyTorch splits such
convolutions along the batch and indexes elementwise kernels in 64 bits, and which other
kernels still refuse them is not published; the largest tensor is recorded for inspection.

`probe(parts, runtime)` runs one inference forward at batch 1 on the meta device and scales
what it saw by the batch size (both grow linearly with the batch for the models it is used on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.overrides import TorchFunctionMode

from kubeseer.measure import gpu_memory

__all__ = ["GRID_LIMIT", "INT32_ELEMENTS", "Limits", "probe"]

INT32_ELEMENTS: Final = 2**31
GRID_LIMIT: Final = 65_535


@dataclass(frozen=True)
class Limits:
    """What one example of a job puts in its largest tensor and attention batch."""

    largest_elements_per_example: int
    attention_batch_per_example: int

    def exceeded(self, batch_size: int) -> str | None:
        """Which limit a batch of `batch_size` hits, or None."""
        if self.attention_batch_per_example * batch_size > GRID_LIMIT:
            return "an attention batch above 65,535"
        return None


class _Watch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.attention = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "scaled_dot_product_attention" and args:
            query = args[0]
            leading = 1
            for size in query.shape[:-3]:
                leading *= int(size)
            self.attention = max(self.attention, leading)
        if isinstance(out, torch.Tensor):
            self.largest = max(self.largest, out.numel())
        return out


def probe(parts: gpu_memory.StepParts, runtime: gpu_memory.Runtime) -> Limits:
    """Per-example largest tensor and attention batch of the job's forward pass."""
    meta = torch.device("meta")
    with gpu_memory.no_fused_attention(runtime), meta:
        model = parts.build()
    model.eval()
    inputs, _ = parts.batch(1, meta)
    watch = _Watch()
    with torch.no_grad(), watch:
        model(*inputs)
    return Limits(watch.largest, watch.attention)
