"""MIG geometry: the start slices NVIDIA allows each A100/H100 profile, and packing layouts."""

from __future__ import annotations

import itertools

import pytest

from kubeseer.devcluster.dra import geometry

# `nvidia-smi mig -lgipp` on an H100 80GB HBM3 (and the MIG user guide's A100 table), written
# out again: profile ID -> ({starts}, memory slices).
LGIPP = {
    19: ({0, 1, 2, 3, 4, 5, 6}, 1),
    15: ({0, 2, 4, 6}, 2),
    14: ({0, 2, 4}, 2),
    9: ({0, 4}, 4),
    5: ({0}, 4),
    0: ({0}, 8),
}
SHAPES = {"1g.10gb": (1, 1), "1g.20gb": (1, 2), "2g.20gb": (2, 2), "3g.40gb": (3, 4)}
SHAPES |= {"4g.40gb": (4, 4), "7g.80gb": (7, 8)}


def instance(name: str) -> geometry.Instance:
    return geometry.Instance(name, *SHAPES[name])


@pytest.mark.parametrize("shape", list(SHAPES.values()))
def test_each_profile_starts_only_where_nvidia_smi_lists_its_placements(shape):
    ident = geometry.profile_id(*shape)
    starts, size = LGIPP[ident]
    assert set(geometry.starts(*shape)) == starts
    assert size == shape[1]
    # No placement runs past the GPU's 8 memory slices.
    assert all(start + size <= geometry.MEMORY_SLICES for start in starts)


def test_a_shape_mig_does_not_have_is_refused():
    with pytest.raises(ValueError, match="no MIG profile has 2 compute and 4 memory"):
        geometry.starts(2, 4)


def test_memory_slice_7_is_reachable_only_from_two_slice_profiles_at_6_and_larger_ones():
    reaching = {
        shape
        for shape in SHAPES.values()
        for start in geometry.starts(*shape)
        if 7 in range(start, start + shape[1])
    }
    assert reaching == {(1, 2), (3, 4), (7, 8)}


def test_all_balanced_packs_with_the_3g_at_4_because_two_1g_cannot_follow_it_at_0():
    layout = [instance(n) for n in ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")]
    placed = geometry.pack(layout)
    assert placed is not None
    assert [(p.instance.profile, p.start) for p in placed] == [
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("2g.20gb", 0),
        ("3g.40gb", 4),
    ]


def test_packing_is_refused_over_seven_compute_slices():
    assert geometry.pack([instance("4g.40gb"), instance("2g.20gb"), instance("2g.20gb")]) is None


def test_every_layout_within_the_slice_counts_packs_onto_disjoint_legal_placements():
    """Exhaustive: the inventory's slice counts are the whole rule, which slices.py relies on."""
    shapes = list(SHAPES.items())
    checked = 0
    for counts in itertools.product(range(8), range(5), range(4), range(3), range(2), range(2)):
        chosen = [name for (name, _), n in zip(shapes, counts, strict=True) for _ in range(n)]
        compute = sum(SHAPES[n][0] for n in chosen)
        memory = sum(SHAPES[n][1] for n in chosen)
        if not chosen or compute > 7 or memory > 8:
            continue
        placed = geometry.pack([instance(n) for n in chosen])
        assert placed is not None, chosen
        held = [s for p in placed for s in p.memory_slices]
        assert len(held) == len(set(held)) == memory
        assert all(p.start in geometry.starts(*p.instance.shape) for p in placed)
        checked += 1
    assert checked == 77  # every multiset of profiles one GPU can hold
