import pytest
import torch
from torch_geometric.data import Data

from kubeseer.predictor import splits


def samples(configs_per_family=10, families=("resnet", "vit", "mlp"), batches=(1, 8, 32)):
    out = []
    for family in families:
        for c in range(configs_per_family):
            for b in batches:
                out.append(
                    Data(
                        x=torch.zeros(1, 1),
                        family=family,
                        config_hash=f"{family}{c}",
                        job_batch_size=b,
                    )
                )
    return out


def hashes(part):
    return {s.config_hash for s in part}


def test_random_split_is_two_one_one_over_configurations():
    split = splits.random_split(samples(), seed=0)
    # 30 configurations: 15 train, 7 validation (4 early stopping + 3 calibration), 8 test.
    assert [len(hashes(p)) for p in (split.train, split.val, split.calibration, split.test)] == [
        15,
        4,
        3,
        8,
    ]
    assert len(split.train) == 45  # every batch size of a configuration goes with it


def test_no_configuration_sits_in_two_parts():
    split = splits.random_split(samples(), seed=3)
    parts = [hashes(p) for p in (split.train, split.val, split.calibration, split.test)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not parts[i] & parts[j]


def test_same_seed_same_split_other_seed_other_split():
    a, b, c = (splits.random_split(samples(), seed=s) for s in (1, 1, 2))
    assert hashes(a.test) == hashes(b.test)
    assert hashes(a.test) != hashes(c.test)


def test_split_does_not_depend_on_sample_order():
    data = samples()
    assert hashes(splits.random_split(data, 5).test) == hashes(
        splits.random_split(data[::-1], 5).test
    )


def test_family_split_holds_out_exactly_one_family():
    split = splits.family_split(samples(), "vit", seed=0)
    assert {s.family for s in split.test} == {"vit"}
    assert all(s.family != "vit" for s in split.train + split.val + split.calibration)
    assert len(hashes(split.train)) == 15
    assert "held out: vit" in split.describe()


def test_family_split_rejects_an_unknown_family():
    with pytest.raises(splits.SplitError, match="no samples of family 'gpt'"):
        splits.family_split(samples(), "gpt", seed=0)


def test_make_split_needs_the_family_to_hold_out():
    with pytest.raises(splits.SplitError, match="family to hold out"):
        splits.make_split(samples(), "family", 0)
    assert splits.make_split(samples(), "family", 0, "mlp").held_out_family == "mlp"


def test_too_few_configurations_is_an_error():
    with pytest.raises(splits.SplitError, match="at least 8"):
        splits.random_split(samples(configs_per_family=2, families=("a",)), 0)


def labelled(configs_per_family=10, rare_every=5):
    """`samples()` with two label columns; the second only on every `rare_every`-th config."""
    out = samples(configs_per_family)
    for s in out:
        rare = int(s.config_hash[-1]) % rare_every == 0
        s.y_mask = torch.tensor([[True, rare]])
    return out


def labelled_configs(part, column):
    return {s.config_hash for s in part if bool(s.y_mask[0, column])}


def test_ensure_calibration_moves_rare_configurations_from_training_only():
    split = splits.random_split(labelled(40), seed=0)
    before = len(labelled_configs(split.calibration, 1))
    topped = splits.ensure_calibration(split, ["common", "rare"], 5)
    assert before < 5 <= len(labelled_configs(topped.calibration, 1))
    assert topped.moved == (("rare", 5 - before),)
    assert "moved from train to calibration" in topped.describe()
    # only training configurations move, whole, and test and early stopping are untouched
    gained = hashes(topped.calibration) - hashes(split.calibration)
    assert gained <= hashes(split.train) and not gained & hashes(topped.train)
    assert len(topped.calibration) - len(split.calibration) == 3 * len(gained)
    assert topped.test == split.test and topped.val == split.val


def test_ensure_calibration_leaves_a_split_with_enough_alone():
    split = splits.random_split(labelled(40), seed=0)  # 4 rare calibration configurations
    assert splits.ensure_calibration(split, ["common", "rare"], 4) is split


def test_ensure_calibration_refuses_to_empty_training_of_a_metric():
    split = splits.random_split(labelled(10), seed=0)  # rare: 5 in training, none in calibration
    with pytest.raises(splits.SplitError, match=r"rare: .* needs 5 in calibration and training"):
        splits.ensure_calibration(split, ["common", "rare"], 5)
    assert len(labelled_configs(splits.ensure_calibration(split, ["c", "r"], 3).train, 1)) == 2
    # a fine-tune on a few observations keeps them to learn from instead
    kept = splits.ensure_calibration(split, ["common", "rare"], 5, short_ok=True)
    assert [metric for metric, _ in kept.moved] == ["common"]


def draw(family="llama", configs=6):
    """A family's training draw: samples of configurations every split trains on."""
    out = samples(configs_per_family=configs, families=(family,))
    return out, hashes(out)


@pytest.mark.parametrize(
    "make",
    [
        lambda d, only: splits.random_split(d, 0, only),
        lambda d, only: splits.family_split(d, "vit", 0, only),
        lambda d, only: splits.make_split(d, "family", 0, "vit", only),
    ],
    ids=["random", "family", "make_split"],
)
def test_a_training_draw_is_trained_on_in_every_split_and_moves_no_other_sample(make):
    without = make(samples(), ())
    extra, only = draw()
    with_draw = make((samples() + extra)[::-1], only)
    assert hashes(with_draw.train) == hashes(without.train) | only
    for part in ("val", "calibration", "test"):
        assert hashes(getattr(with_draw, part)) == hashes(getattr(without, part))
    assert with_draw.training_only == only


def test_a_training_draw_never_moves_into_calibration():
    data, extra = labelled(10), labelled(10)
    for s in extra:
        s.config_hash = f"draw-{s.config_hash}"
    split = splits.random_split(data + extra, 0, hashes(extra))
    topped = splits.ensure_calibration(split, ["common", "rare"], 3)
    assert topped.moved and not hashes(topped.calibration) & hashes(extra)
    assert hashes(extra) <= hashes(topped.train)


def test_a_training_configuration_also_held_out_is_refused():
    split = splits.random_split(samples(), seed=0)
    clash, _ = draw(family="resnet", configs=10)
    with pytest.raises(splits.SplitError, match="training-only configurations also outside"):
        splits.trained_also_on(split, clash)
