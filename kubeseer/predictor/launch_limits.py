"""Kernel launch limits a step crosses at its batch size: failures no GPU or slice avoids.

A bigger GPU cures an out-of-memory; it does not cure a kernel that cannot launch. Of the
public timm boundaries (a batch that ran, the next that failed), 229 of 1,166 failed at a
kernel limit with memory to spare (`kubeseer.measure.kernel_limits`, which probes them on the
meta device). Two limits, both documented by PyTorch and both still hit by PyTorch 2.9:

- fused attention (FlashAttention-2, the memory-efficient kernel) puts the batch of its
  four-dimensional operands (a window attention's windows folded in) on a CUDA grid axis of at
  most 65,535 blocks: a larger batch fails with "invalid configuration argument";
- PyTorch's native depthwise convolution (``groups`` equal to the input channels, eager NCHW)
  needs 32-bit index math: an input or output of 2^31 elements or more fails with "Expected
  canUse32BitIndexMath" (pytorch/pytorch#80020, #155225; cuDNN takes such convolutions only
  from cuDNN 9.15, pytorch/pytorch#168364).

Both are read off the PerfGraph: the batch of a fused attention's ``Q @ K^T`` output (the
``batch`` of its mapped shape, `attention.fused_kernel` saying which blocks the job fuses) and
a depthwise Conv's input and output elements. `bench/launch_limits.py` checks the reading
against the probes: the same sizes for all 508 architectures, and the same 229 boundaries
put down to a limit. It also shows how far each limit holds at a batch: 62 failed batches
crossed the attention limit and 6 that ran did (masked attention on PyTorch 2.9), so it is a
failure (`Prediction.launch_limits`, which `Predictor.max_batch` stays below); 167 failed
batches crossed the depthwise limit and 197 that ran did, because PyTorch hands many fp16
depthwise convolutions to cuDNN, so it is a risk, said in the prediction's warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from kubeseer.prediction import Attention
from kubeseer.predictor import analytic_memory, attention, perfgraph, schema

__all__ = ["GRID_LIMIT", "INT32_ELEMENTS", "LaunchSizes", "measure"]

GRID_LIMIT: Final = 65_535
"""Blocks a CUDA grid's y and z axes hold: the largest batch a fused attention launches."""

INT32_ELEMENTS: Final = 2**31
"""Elements from which a tensor needs 64-bit indices, which the native depthwise kernel lacks."""

_GROUP: Final = schema.NODE_FEATURES.index("group")
_IN_CHANNELS: Final = schema.NODE_FEATURES.index("in_channels")
_SHAPE_COLUMNS: Final = [
    schema.EDGE_FEATURES.index(name) for name in ("batch", "channels", "height", "width")
]


@dataclass(frozen=True)
class LaunchSizes:
    """The launch sizes of one step at `batch_size`.

    Attributes:
        batch_size: the batch the graph was extracted at.
        attention_batch: the largest batch of a fused attention call (0: none fused).
        depthwise_elements: the largest input or output of a depthwise convolution (0: none).
    """

    batch_size: int
    attention_batch: int
    depthwise_elements: int

    def failures(self) -> tuple[str, ...]:
        """The limits this batch crosses that fail the job on any GPU, said so that a user
        knows what fails and the largest batch that does not."""
        if self.attention_batch <= GRID_LIMIT:
            return ()
        largest = GRID_LIMIT * self.batch_size // self.attention_batch
        return (
            f"batch {self.batch_size} launches fused attention over {self.attention_batch:,} "
            "sequences, above the 65,535 a CUDA grid axis holds: FlashAttention and the "
            f"memory-efficient kernel fail on any GPU; batch {largest} or less stays below it "
            "(or spec.attention: math, which stores the attention matrices)",
        )

    def risks(self) -> tuple[str, ...]:
        """The limits this batch crosses that fail the job unless cuDNN takes the kernel."""
        if self.depthwise_elements < INT32_ELEMENTS:
            return ()
        largest = (INT32_ELEMENTS - 1) * self.batch_size // self.depthwise_elements
        return (
            f"batch {self.batch_size} runs a depthwise convolution over "
            f"{self.depthwise_elements:,} elements, 2^31 or more: PyTorch's native depthwise "
            "kernel fails there on any GPU, and cuDNN takes it only for some fp16 shapes (or "
            f"from cuDNN 9.15 on); batch {largest} or less stays below it",
        )


def measure(
    graph: perfgraph.PerfGraph,
    memory_graph: analytic_memory.MemoryGraph,
    blocks: Sequence[attention.AttentionBlock],
    kernel: Attention,
) -> LaunchSizes:
    """The launch sizes of `graph`'s step when its attention runs `kernel`.

    `memory_graph` is `analytic_memory.from_perfgraph(graph)` (its nodes are the graph's, in
    order) and `blocks` its attention (`analytic_memory.attention_blocks`)."""
    src, dst = graph.edge_index
    shapes = graph.edge_features[:, _SHAPE_COLUMNS]
    edge_elements = np.rint(np.prod(shapes, axis=1)).astype(np.int64)
    attention_batch = 0
    for block in blocks:
        if not attention.fused_kernel(block, kernel):
            continue
        leaving = np.flatnonzero(src == block.scores)
        if leaving.size:
            attention_batch = max(attention_batch, round(shapes[leaving[0], 0]))
    features = graph.node_features
    depthwise = 0
    for node, op_type in enumerate(graph.op_types):
        groups = round(features[node, _GROUP])
        if op_type != "Conv" or groups <= 1 or groups != round(features[node, _IN_CHANNELS]):
            continue
        into, out_of = edge_elements[dst == node], edge_elements[src == node]
        # a graph output has no edge; its size is what the estimator recovered
        output = int(out_of.max()) if out_of.size else memory_graph.nodes[node].output_elements
        depthwise = max(depthwise, int(into.max()) if into.size else 0, output)
    return LaunchSizes(graph.batch_size, attention_batch, depthwise)
