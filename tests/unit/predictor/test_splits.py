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
