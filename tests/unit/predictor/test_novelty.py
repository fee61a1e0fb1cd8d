import math

import pytest
import torch

from kubeseer.predictor import novelty


def line(*positions):
    """Embeddings on the first axis of a 2-D space (the second channel constant)."""
    return torch.tensor([[p, 1.0] for p in positions])


def test_distance_is_to_the_kth_nearest_training_embedding():
    training = line(0, 1, 2, 3, 10)
    gate = novelty.NoveltyGate.fit(training, line(*range(19)), neighbours=2, quantile=0.5)
    scale = float(training[:, 0].std(unbiased=False))
    # from 2.5: nearest 2 and 3 (0.5 each), so the second-nearest is 0.5 away
    assert float(gate.distances(line(2.5))[0]) == pytest.approx(0.5 / scale, rel=1e-3)
    # from 10: nearest itself, then 3
    assert float(gate.distances(line(10))[0]) == pytest.approx(7 / scale, rel=1e-3)


def test_threshold_is_the_conformal_quantile_of_the_held_out_distances():
    training = line(0, 1, 2, 3)
    held_out = line(*[0.1 * k for k in range(40)])
    gate = novelty.NoveltyGate.fit(training, held_out, neighbours=1, quantile=0.9)
    distances = gate.distances(held_out).sort().values
    rank = math.ceil((40 + 1) * 0.9)  # 37th smallest of 40
    assert gate.threshold == pytest.approx(float(distances[rank - 1]))
    assert int(gate.novel(held_out).sum()) == 40 - rank


def test_far_embeddings_are_novel_and_held_out_ones_rarely():
    g = torch.Generator().manual_seed(0)
    training = torch.randn(200, 8, generator=g)
    held_out = torch.randn(100, 8, generator=g)
    gate = novelty.NoveltyGate.fit(training, held_out)
    far = training[:3] + 50.0
    assert gate.novel(far).all()
    assert gate.novel(held_out).float().mean() <= 1 - novelty.DEFAULT_QUANTILE


def test_distances_are_scale_free_per_channel():
    """A channel in bytes must not outvote one in percent: each is standardised first."""
    g = torch.Generator().manual_seed(1)
    training = torch.randn(50, 2, generator=g)
    held_out = torch.randn(40, 2, generator=g)
    scaled = torch.tensor([1.0, 1e6])
    plain = novelty.NoveltyGate.fit(training, held_out)
    stretched = novelty.NoveltyGate.fit(training * scaled, held_out * scaled)
    query = torch.randn(10, 2, generator=g)
    torch.testing.assert_close(
        plain.distances(query), stretched.distances(query * scaled), rtol=1e-2, atol=1e-2
    )


def test_round_trips_through_a_dict():
    g = torch.Generator().manual_seed(2)
    gate = novelty.NoveltyGate.fit(torch.randn(30, 4, generator=g), torch.randn(20, 4, generator=g))
    again = novelty.NoveltyGate.from_dict(gate.to_dict())
    query = torch.randn(5, 4, generator=g)
    torch.testing.assert_close(again.distances(query), gate.distances(query))
    assert (again.threshold, again.quantile, again.neighbours) == (
        gate.threshold,
        gate.quantile,
        gate.neighbours,
    )


def test_rejects_what_cannot_place_a_threshold():
    g = torch.Generator().manual_seed(3)
    with pytest.raises(ValueError, match="held-out embeddings"):
        novelty.NoveltyGate.fit(torch.randn(30, 4, generator=g), torch.randn(10, 4, generator=g))
    with pytest.raises(ValueError, match="training embeddings"):
        novelty.NoveltyGate.fit(torch.randn(3, 4, generator=g), torch.randn(30, 4, generator=g))
    with pytest.raises(ValueError, match="quantile"):
        novelty.NoveltyGate.fit(
            torch.randn(30, 4, generator=g), torch.randn(30, 4, generator=g), quantile=1.0
        )


def test_a_mangled_gate_is_refused():
    g = torch.Generator().manual_seed(4)
    data = novelty.NoveltyGate.fit(
        torch.randn(30, 4, generator=g), torch.randn(20, 4, generator=g)
    ).to_dict()
    with pytest.raises(ValueError, match="do not match"):
        novelty.NoveltyGate.from_dict({**data, "mean": torch.zeros(3)})
    with pytest.raises(ValueError, match="not a novelty gate"):
        novelty.NoveltyGate.from_dict({k: v for k, v in data.items() if k != "threshold"})
