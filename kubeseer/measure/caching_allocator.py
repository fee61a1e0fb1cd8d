"""A model of PyTorch's CUDA caching allocator, replaying a recorded allocation trace.

What a GPU must hold for a job is not its peak of live tensors but what the caching allocator
has *reserved* from the driver (`cudaMalloc`ed segments), and that depends on the order in which
tensors of which sizes come and go. This module replays that order through the rules of
`c10/cuda/CUDACachingAllocator.cpp` (PyTorch 2.x, default configuration: one stream, no
`max_split_size_mb`, no expandable segments, no garbage-collection threshold):

* every request is rounded up to a multiple of 512 bytes (`kMinBlockSize`);
* requests up to 1 MiB (`kSmallSize`) come from the *small pool*, whose segments are 2 MiB
  (`kSmallBuffer`); larger ones from the *large pool*, whose segments are 20 MiB
  (`kLargeBuffer`) for requests under 10 MiB (`kMinLargeAlloc`) and the request rounded up to
  2 MiB (`kRoundLarge`) otherwise;
* a request takes the *smallest* free cached block of its pool that holds it (best fit,
  ties by address); a block larger than needed is split when the remainder is at least 512
  bytes (small pool) or more than 1 MiB (large pool);
* a freed block is merged with free neighbours of its segment and cached, never returned to
  the driver;
* when no cached block fits and a new segment would exceed the device (`capacity`), the
  allocator first releases every cached segment that is entirely free, then retries; if that
  fails too the job is out of memory.

`replay(trace)` gives the peaks of allocated and reserved bytes with unlimited memory (what
`torch.cuda.max_memory_allocated` / `max_memory_reserved` report on a large GPU);
`replay(trace, capacity=...)` whether the job runs within a device of that size;
`required_capacity(trace)` the smallest such capacity, which is the allocator's part of the
memory target (docs/dataset.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "Alloc",
    "Event",
    "Free",
    "OutOfMemory",
    "Replay",
    "allocation_size",
    "replay",
    "required_capacity",
    "round_size",
    "smallest_capacity",
]

MIN_BLOCK: Final = 512
SMALL_SIZE: Final = 1 << 20
SMALL_BUFFER: Final = 2 << 20
MIN_LARGE_ALLOC: Final = 10 << 20
ROUND_LARGE: Final = 2 << 20
LARGE_BUFFER: Final = 20 << 20


@dataclass(frozen=True, slots=True)
class Alloc:
    """A tensor storage of `size` bytes comes into existence; `key` names it until its `Free`."""

    key: int
    size: int


@dataclass(frozen=True, slots=True)
class Free:
    """The storage `key` is released."""

    key: int


Event = Alloc | Free


class OutOfMemory(Exception):  # noqa: N818 - the allocator's own name for the outcome
    """The replay needed more than `capacity` bytes at event `index`."""

    def __init__(self, index: int, requested: int, reserved: int, capacity: int) -> None:
        super().__init__(
            f"out of memory at event {index}: {requested} bytes requested with {reserved} "
            f"reserved of {capacity}"
        )
        self.index = index


def round_size(size: int) -> int:
    """The block size a request of `size` bytes occupies (512-byte granularity, minimum 512)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(rounded: int) -> int:
    """The segment `cudaMalloc`ed when no cached block holds a request of `rounded` bytes."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    __slots__ = ("allocated", "next", "offset", "prev", "segment", "size")

    def __init__(self, segment: int, offset: int, size: int) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def sort_key(self) -> tuple[int, int, int]:
        # The allocator orders free blocks by (size, address); segment then offset stands in
        # for the address.
        return (self.size, self.segment, self.offset)


class _Pool:
    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}

    def insert(self, block: _Block) -> None:
        key = block.sort_key()
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = block.sort_key()
        index = bisect.bisect_left(self.keys, key)
        del self.keys[index]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self.keys, (size, -1, -1))
        if index == len(self.keys):
            return None
        block = self.blocks[self.keys[index]]
        self.remove(block)
        return block


@dataclass(frozen=True)
class Replay:
    """What the allocator did over a trace.

    Attributes:
        peak_allocated: largest sum of live blocks (rounded sizes), as
            `torch.cuda.max_memory_allocated`.
        peak_reserved: largest sum of segments, as `torch.cuda.max_memory_reserved`.
        segments: segments reserved at the end.
    """

    peak_allocated: int
    peak_reserved: int
    segments: int


class _Allocator:
    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.segment_sizes: dict[int, int] = {}
        self.segment_pools: dict[int, _Pool] = {}
        self.next_segment = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.live: dict[int, _Block] = {}

    def _new_segment(self, size: int, pool: _Pool) -> _Block:
        segment = self.next_segment
        self.next_segment += 1
        block = _Block(segment, 0, size)
        self.segment_sizes[segment] = size
        self.segment_pools[segment] = pool
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_free_segments(self) -> None:
        for pool in (self.small, self.large):
            for key in list(pool.keys):
                block = pool.blocks[key]
                if block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved -= self.segment_sizes.pop(block.segment)
                    del self.segment_pools[block.segment]

    def malloc(self, key: int, size: int, index: int) -> None:
        rounded = round_size(size)
        pool = self.small if rounded <= SMALL_SIZE else self.large
        block = pool.best_fit(rounded)
        if block is None:
            segment_size = allocation_size(rounded)
            if self.capacity is not None and self.reserved + segment_size > self.capacity:
                self._release_free_segments()
                if self.reserved + segment_size > self.capacity:
                    raise OutOfMemory(index, rounded, self.reserved, self.capacity)
            block = self._new_segment(segment_size, pool)
        remaining = block.size - rounded
        if (pool.small and remaining >= MIN_BLOCK) or (not pool.small and remaining > SMALL_SIZE):
            rest = _Block(block.segment, block.offset + rounded, remaining)
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            pool.insert(rest)
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        block = self.live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        pool = self.segment_pools[block.segment]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                pool.remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        pool.insert(block)


def replay(events: Iterable[Event], *, capacity: int | None = None) -> Replay:
    """Run `events` through the caching allocator.

    A `Free` of a key that is not live, or an `Alloc` of one that is, is a malformed trace.

    Raises:
        OutOfMemory: `capacity` is given and the trace does not fit in it.
        ValueError: malformed trace.
    """
    allocator = _Allocator(capacity)
    for index, event in enumerate(events):
        if isinstance(event, Alloc):
            if event.key in allocator.live:
                raise ValueError(f"event {index}: storage {event.key} allocated twice")
            allocator.malloc(event.key, event.size, index)
        else:
            if event.key not in allocator.live:
                raise ValueError(f"event {index}: storage {event.key} freed but not live")
            allocator.free(event.key)
    return Replay(
        peak_allocated=allocator.peak_allocated,
        peak_reserved=allocator.peak_reserved,
        segments=len(allocator.segment_sizes),
    )


def smallest_capacity(
    runs_within: Callable[[int], bool],
    low: int,
    high: int,
    *,
    granularity: int = ROUND_LARGE,
    tolerance: float = 0.0,
) -> int:
    """The smallest multiple of `granularity` from `low` (rounded down) to `high` (rounded up)
    within which `runs_within` says a job runs, found by bisection to within `tolerance` of
    `high` (0: exactly).

    `high` must be a capacity the job runs in. Running out is taken to be monotone in the
    capacity, true for all but contrived traces. The same search serves this model's replays
    (`required_capacity`) and a real allocator's capped runs (`derived_check`).
    """
    low_units = low // granularity
    high_units = -(-high // granularity)
    step = max(1, math.floor(tolerance * high_units))
    while high_units - low_units >= step:
        middle = (low_units + high_units) // 2
        if runs_within(middle * granularity):
            high_units = middle
        else:
            low_units = middle + 1
    return high_units * granularity


def required_capacity(events: Sequence[Event], *, granularity: int = ROUND_LARGE) -> int:
    """The smallest device capacity (a multiple of `granularity`) the trace runs in.

    Between the allocated peak (no allocator can do with less) and the unlimited replay's
    reserved peak (enough, since a capped allocator only releases more), `smallest_capacity`.
    """
    unlimited = replay(events)

    def runs_within(capacity: int) -> bool:
        try:
            replay(events, capacity=capacity)
        except OutOfMemory:
            return False
        return True

    return smallest_capacity(
        runs_within, unlimited.peak_allocated, unlimited.peak_reserved, granularity=granularity
    )
