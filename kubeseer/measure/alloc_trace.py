"""Record the order in which a step's tensor storages are created and released.

The caching-allocator model (`caching_allocator`) needs the sequence of allocations and frees a
job makes on the GPU. A `TorchDispatchMode` sees every ATen operator below autograd (the
backward pass and the optimiser included), so every storage an operator creates is seen as it
is created. Releases are found through C++ weak references to the storages
(`StorageWeakRef`): a storage is free exactly when its last tensor, view or autograd saved
variable lets go of it, whatever Python still holds. A weak reference on the Python storage
object would fire too early (a view keeps the storage alive without keeping that object).
Expired storages are collected whenever an operator has created a storage, before that
allocation is recorded: the allocator model only depends on the order of allocations and frees,
and every free between two allocations is then ordered between them, as on the GPU's single
stream. Storages that exist before the step (weights, buffers, the batch) live for the whole job
and are not polled.

The cuBLAS workspace is not a tensor but PyTorch allocates it through the caching allocator
(`CublasHandlePool.cpp`), once per cuBLAS handle and stream, when the handle first runs a
matrix multiply; handles are per thread and the autograd engine runs a CUDA backward on its own
thread, so a training step holds two. The recorder inserts them where they happen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kubeseer.measure import caching_allocator

__all__ = ["CUBLAS_OPERATORS", "Recorder"]

CUBLAS_OPERATORS: Final = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "_addmm_activation"}
)
"""ATen operators that run cuBLAS (and so create a handle's workspace on first use)."""


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode is untyped
    """Collects `caching_allocator` events while active.

    Args:
        cublas_workspace_bytes: the workspace one cuBLAS handle allocates (0 to leave it out).

    Use `track(tensors)` first for storages that exist before the step (weights, buffers,
    optimiser state, the batch), in the order the job created them; then run the step under
    `with recorder:`; `close()` collects the frees still pending and returns the events.
    """

    def __init__(self, *, cublas_workspace_bytes: int = 0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cublas_workspace_bytes = cublas_workspace_bytes
        self.events: list[caching_allocator.Event] = []
        self._live: dict[int, tuple[StorageWeakRef, int, int]] = {}
        self._pinned: set[int] = set()
        self._next_key = 0
        self._workspace_threads: set[str] = set()

    def _allocate(self, size: int) -> int:
        key = self._next_key
        self._next_key += 1
        self.events.append(caching_allocator.Alloc(key, size))
        return key

    def _see(self, tensor: torch.Tensor, *, pin: bool = False) -> None:
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        cdata = storage._cdata
        if cdata in self._pinned:
            return
        if pin:
            if size:
                self._pinned.add(cdata)
                self._allocate(size)
            return
        known = self._live.get(cdata)
        if known is not None:
            ref, known_size, key = known
            if not torch.UntypedStorage._expired(ref.cdata) and known_size == size:
                return
            self.events.append(caching_allocator.Free(key))
            del self._live[cdata]
        if size == 0:
            # The CUDA allocator hands out no block for an empty storage.
            return
        self.collect_frees()
        ref = StorageWeakRef(storage)  # type: ignore[no-untyped-call]  # untyped in torch
        self._live[cdata] = (ref, size, self._allocate(size))

    def collect_frees(self) -> None:
        """Record a `Free` for every tracked storage nothing holds any more."""
        gone = torch.UntypedStorage._expired
        expired = [cdata for cdata, (ref, _, _) in self._live.items() if gone(ref.cdata)]
        for cdata in expired:
            self.events.append(caching_allocator.Free(self._live.pop(cdata)[2]))

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Record storages that exist before the step and live through it (weights, buffers,
        the batch), as allocations in the given order."""
        for tensor in tensors:
            self._see(tensor, pin=True)

    def _cublas_workspace(self) -> None:
        thread = "backward" if torch._C._current_autograd_node() is not None else "main"
        if self.cublas_workspace_bytes and thread not in self._workspace_threads:
            self._workspace_threads.add(thread)
            # Held by the handle for the life of the process: never freed.
            self.collect_frees()
            self._allocate(self.cublas_workspace_bytes)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func.overloadpacket.__name__ in CUBLAS_OPERATORS:
            self._cublas_workspace()
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._see(value)
        return out

    def close(self) -> list[caching_allocator.Event]:
        """The events so far, after collecting pending frees."""
        self.collect_frees()
        return self.events
