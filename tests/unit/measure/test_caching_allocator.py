"""The caching-allocator model against the rules of PyTorch's CUDACachingAllocator.cpp."""

from __future__ import annotations

import pytest

from kubeseer.measure import caching_allocator as ca
from kubeseer.measure.caching_allocator import Alloc, Free

MIB = 1 << 20


def test_requests_round_to_512_byte_blocks():
    assert ca.round_size(1) == 512
    assert ca.round_size(512) == 512
    assert ca.round_size(513) == 1024


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [(512, 2 * MIB), (MIB, 2 * MIB), (MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB),
     (10 * MIB, 10 * MIB), (10 * MIB + 512, 12 * MIB)],
)  # fmt: skip
def test_segment_sizes_follow_the_small_and_large_pools(rounded, segment):
    assert ca.allocation_size(rounded) == segment


def test_small_tensors_share_one_2_mib_segment():
    result = ca.replay([Alloc(i, 1000) for i in range(100)])
    assert result.peak_allocated == 100 * 1024
    assert result.peak_reserved == 2 * MIB


def test_a_mid_sized_tensor_reserves_a_20_mib_segment_and_the_next_one_reuses_it():
    result = ca.replay([Alloc(1, 3 * MIB), Alloc(2, 3 * MIB)])
    assert result.peak_reserved == 20 * MIB
    assert result.segments == 1


def test_freed_blocks_are_cached_not_returned():
    result = ca.replay([Alloc(1, 30 * MIB), Free(1), Alloc(2, 30 * MIB)])
    assert result.peak_reserved == 30 * MIB


def test_a_larger_request_after_a_free_needs_a_new_segment():
    # The freed 30 MiB segment cannot hold 40 MiB: reserved grows to 70 MiB although only
    # 40 MiB are ever live at once -- the gap between allocated and reserved.
    result = ca.replay([Alloc(1, 30 * MIB), Free(1), Alloc(2, 40 * MIB)])
    assert result.peak_allocated == 40 * MIB
    assert result.peak_reserved == 70 * MIB


def test_under_a_capacity_free_segments_are_released_before_giving_up():
    trace = [Alloc(1, 30 * MIB), Free(1), Alloc(2, 40 * MIB)]
    ca.replay(trace, capacity=40 * MIB)
    with pytest.raises(ca.OutOfMemory):
        ca.replay(trace, capacity=38 * MIB)
    assert ca.required_capacity(trace) == 40 * MIB


def test_best_fit_takes_the_smallest_cached_block_that_holds_the_request():
    trace = [
        Alloc(1, 12 * MIB), Alloc(2, 16 * MIB), Free(1), Free(2),
        Alloc(3, 11 * MIB),  # best fit: the 12 MiB segment, not the 16
        Alloc(4, 14 * MIB),  # so this one still fits in the 16 MiB segment
    ]  # fmt: skip
    assert ca.replay(trace).peak_reserved == 28 * MIB


def test_large_blocks_split_only_when_more_than_1_mib_remains():
    # An 11.5 MiB request gets a 12 MiB segment; the 0.5 MiB remainder stays attached to the
    # block (no split), so the block counts as 12 MiB allocated.
    trace = [Alloc(1, 12 * MIB - MIB // 2), Alloc(2, 12 * MIB - MIB // 2)]
    result = ca.replay(trace)
    assert result.peak_allocated == 2 * 12 * MIB
    assert result.peak_reserved == 24 * MIB


def test_neighbouring_free_blocks_merge():
    trace = [Alloc(1, 2 * MIB), Alloc(2, 2 * MIB), Alloc(3, 2 * MIB), Free(1), Free(2),
             Alloc(4, 4 * MIB)]  # fmt: skip
    # All in one 20 MiB segment; after 1 and 2 merge, 4 MiB fits where they were.
    assert ca.replay(trace).peak_reserved == 20 * MIB


def test_malformed_traces_are_refused():
    with pytest.raises(ValueError, match="freed but not live"):
        ca.replay([Free(1)])
    with pytest.raises(ValueError, match="allocated twice"):
        ca.replay([Alloc(1, 1), Alloc(1, 1)])
