"""Peak live tensor bytes over one step, from PyTorch's own storage accounting.

CPU has no caching allocator with statistics, and a machine without a GPU has no CUDA
allocator at all, so both the CPU "allocator peak" label and the derived fake-CUDA labels come
from `torch.distributed._tools.mem_tracker.MemTracker`: it follows every tensor storage created
while it is active (parameters, buffers, gradients, optimiser state, activations and
temporaries), rounds CUDA storages the way the caching allocator does (512-byte blocks), and
records the peak of their sum per device.
"""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from kubeseer.measure import steps


def peak_tensor_bytes(prepared: steps.Prepared, device: torch.device) -> int:
    """Peak bytes of live tensor storages on `device` while `prepared.step` runs once.

    Parameters, buffers and optimiser state that already exist count too, so the figure is
    comparable with `torch.cuda.max_memory_allocated` over a steady-state step.
    """
    tracker = MemTracker()
    if prepared.optimizer is None:
        tracker.track_external(prepared.model)
    else:
        tracker.track_external(prepared.model, prepared.optimizer)
    with tracker:
        prepared.step()
    snapshot = tracker.get_tracker_snapshot("peak")
    total = 0
    for dev, breakdown in snapshot.items():
        if dev.type == device.type:
            total += int(breakdown["Total"])
    return total
