"""Limits a GPU job can hit long before it runs out of memory.

Public out-of-memory evidence (timm's benchmark retries any `RuntimeError` with a smaller batch)
mixes real out-of-memory failures with failures of kernels that cannot launch at that batch.
Two are checked here, both documented by PyTorch:

- a scaled-dot-product attention call whose batch (the first of its four dimensions;
  windowed attention folds its windows into it) exceeds 65,535. PyTorch's fused kernels
  (FlashAttention-2, memory-efficient) put that batch on a CUDA grid axis limited to 65,535
  blocks, so the launch fails ("invalid configuration argument") with memory to spare. They
  take only four-dimensional operands; a call of another rank runs the math path, which has
  no such limit;
- a depthwise convolution (``groups`` equal to the input channels) whose input or output holds
  2^31 elements or more. PyTorch's native depthwise kernel, which eager NCHW convolutions use,
  requires 32-bit index math and raises "Expected canUse32BitIndexMath(input) &&
  canUse32BitIndexMath(output)" instead of splitting the batch (pytorch/pytorch#80020,
  #155225 with an EfficientNet; cuDNN took over such convolutions only from cuDNN 9.15,
  pytorch/pytorch#168364, after every runtime in the public evidence).

Other tensors of 2^31 elements and more are *not* a limit: PyTorch splits such convolutions
along the batch and indexes elementwise kernels in 64 bits. The largest tensor is recorded
for inspection.

`probe(parts, runtime)` runs one inference forward at batch 1 on the meta device and scales
what it saw by the batch size (all three grow linearly with the batch for the models it is
used on).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, Final

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

from kubeseer.measure import gpu_memory, public_gpu

__all__ = ["GRID_LIMIT", "INT32_ELEMENTS", "Limits", "key", "lookup", "probe", "read"]

INT32_ELEMENTS: Final = 2**31
GRID_LIMIT: Final = 65_535
_CONVOLUTIONS: Final = frozenset({functional.conv1d, functional.conv2d, functional.conv3d})


@dataclass(frozen=True)
class Limits:
    """What one example of a job puts in its largest tensor, its attention batch and its
    largest depthwise-convolution tensor."""

    largest_elements_per_example: int
    attention_batch_per_example: int
    depthwise_elements_per_example: int

    def hit(self, batch_size: int) -> list[str]:
        """Every limit a batch of `batch_size` hits."""
        found = []
        if self.attention_batch_per_example * batch_size > GRID_LIMIT:
            found.append("an attention batch above 65,535")
        if self.depthwise_elements_per_example * batch_size >= INT32_ELEMENTS:
            found.append("a depthwise convolution tensor of 2^31 elements or more")
        return found

    def exceeded(self, batch_size: int) -> str | None:
        """The first limit a batch of `batch_size` hits, or None."""
        return next(iter(self.hit(batch_size)), None)

    def explains(self, ran: int, failed: int) -> str | None:
        """The limit that accounts for a job running at batch `ran` and failing at `failed`:
        one `failed` hits and `ran` does not. A limit already hit at the batch that ran did
        not stop the job there (cuDNN, not the native kernel, took that convolution), so it
        cannot account for the failure; another limit first hit at `failed` still can."""
        already = self.hit(ran)
        return next((limit for limit in self.hit(failed) if limit not in already), None)


def _depthwise_elements(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """The larger of input and output elements when the call is a depthwise convolution."""
    groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)
    source = args[0] if args else kwargs.get("input")
    if not isinstance(source, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0
    if int(groups) <= 1 or source.dim() < 3 or int(groups) != source.shape[1]:
        return 0
    return max(source.numel(), out.numel())


class _Watch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.attention = 0
        self.depthwise = 0

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
            if query.dim() == 4:  # other ranks run the math path, which launches no grid limit
                self.attention = max(self.attention, int(query.shape[0]))
        if func in _CONVOLUTIONS:
            self.depthwise = max(self.depthwise, _depthwise_elements(args, kwargs or {}, out))
        if isinstance(out, torch.Tensor):
            self.largest = max(self.largest, out.numel())
        return out


def probe(parts: gpu_memory.StepParts, runtime: gpu_memory.Runtime) -> Limits:
    """Per-example largest tensor, attention batch and depthwise-convolution tensor of the
    job's forward pass."""
    meta = torch.device("meta")
    with gpu_memory.no_fused_attention(runtime), meta:
        model = parts.build()
    model.eval()
    inputs, _ = parts.batch(1, meta)
    watch = _Watch()
    with torch.no_grad(), watch:
        model(*inputs)
    return Limits(watch.largest, watch.attention, watch.depthwise)


def key(model: str, img_size: int, runtime: str) -> str:
    """The identity of a probe: a timm architecture at an image size under a runtime."""
    return f"{model}|{img_size}|{runtime}"


def read(paths: Sequence[Path]) -> dict[str, Limits | None]:
    """Probes stored as JSON lines (``{"key", "limits"}``, limits null where the architecture
    cannot run on the meta device), later files overriding earlier ones."""
    found: dict[str, Limits | None] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            value = entry.get("limits")
            found[entry["key"]] = None if value is None else Limits(*value)
    return found


def lookup(
    boundaries: Iterable[public_gpu.Boundary], stored: Sequence[Path], cache: Path
) -> dict[str, Limits | None]:
    """The limits of every boundary's job: read from `stored` (the committed file first), the
    architectures not yet probed probed and appended to `cache`."""
    found = read([*stored, cache])
    cache.parent.mkdir(parents=True, exist_ok=True)
    with cache.open("a") as handle:
        for b in boundaries:
            name = key(b.row.model, b.row.img_size, b.row.runtime)
            if name in found:
                continue
            try:
                limits: Limits | None = probe(
                    public_gpu.timm_parts(b.row.model, b.row.img_size),
                    gpu_memory.RUNTIMES[b.row.runtime],
                )
            except Exception:  # a data-dependent operation the meta device cannot run
                limits = None
            found[name] = limits
            value = None if limits is None else list(astuple(limits))
            handle.write(json.dumps({"key": name, "limits": value}) + "\n")
            handle.flush()
    return found
