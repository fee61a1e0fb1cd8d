import math

import numpy as np
import pytest

from kubeseer.predictor import calibration, conformal


def test_conformal_quantile_uses_the_finite_sample_rank():
    scores = np.arange(1.0, 20.0)  # n = 19: rank ceil(20 * 0.95) = 19 -> the maximum
    assert conformal.conformal_quantile(scores, 0.95) == 19.0
    scores = np.arange(1.0, 40.0)  # n = 39: rank ceil(40 * 0.9) = 36
    assert conformal.conformal_quantile(scores, 0.9) == 36.0


def test_too_few_samples_for_the_coverage_is_an_error():
    with pytest.raises(conformal.CalibrationError, match="need at least 19"):
        conformal.conformal_quantile(np.ones(18), 0.95)


def test_a_short_calibration_covers_each_of_its_scores_when_asked_and_says_how_few():
    true = np.array([[1.0, 1.0], [1.2, 0.0], [1.5, 0.0]])
    mask = np.array([[True, False], [True, False], [True, False]])
    with pytest.raises(conformal.CalibrationError, match="need at least 19"):
        conformal.calibrate(np.ones((3, 2)), true, mask, ["a", "b"], coverage=0.95)
    cal = conformal.calibrate(
        np.ones((3, 2)), true, mask, ["a", "b"], coverage=0.95, short_covers_all=True
    )
    assert cal.margin("a") == pytest.approx(1.5)
    assert cal.margin("b") == 1.0
    assert cal.samples == (3, 0)


def test_margin_is_the_log_ratio_quantile_and_never_negative():
    true = np.array([[100.0, 1.0]] * 20)
    predicted = np.array([[100.0 / 1.1, 2.0]] * 20)  # under by 10 %, over by 2x
    mask = np.ones_like(true, dtype=bool)
    cal = conformal.calibrate(predicted, true, mask, ["a", "b"], coverage=0.9)
    assert cal.margin("a") == pytest.approx(1.1)
    assert cal.margin("b") == 1.0
    np.testing.assert_allclose(cal.upper(np.array([[10.0, 3.0]])), [[11.0, 3.0]])


def test_missing_labels_are_not_calibration_scores():
    true = np.array([[2.0]] * 19 + [[1000.0]])
    predicted = np.ones((20, 1))
    mask = np.array([[True]] * 19 + [[False]])
    cal = conformal.calibrate(predicted, true, mask, ["m"], coverage=0.9)
    assert cal.margin("m") == pytest.approx(2.0)
    assert cal.samples == (19,)


def test_bounds_cover_at_least_the_requested_share_of_fresh_exchangeable_data():
    rng = np.random.default_rng(0)
    truth = np.exp(rng.normal(size=(4000, 1)))
    predicted = truth * np.exp(rng.normal(scale=0.2, size=truth.shape))
    mask = np.ones_like(truth, dtype=bool)
    cal = conformal.calibrate(predicted[:1000], truth[:1000], mask[:1000], ["m"], 0.95)
    covered = (truth[1000:] <= cal.upper(predicted[1000:])).mean()
    assert covered >= 0.93


def test_round_trips_through_a_plain_dict():
    cal = calibration.Calibration(0.95, ("a",), (math.log(1.2),), (40,))
    assert calibration.Calibration.from_dict(cal.to_dict()) == cal


def test_rejects_coverage_outside_zero_one():
    with pytest.raises(conformal.CalibrationError, match="coverage"):
        conformal.conformal_quantile(np.ones(10), 1.0)


def test_grouped_calibration_scores_each_configuration_by_its_worst_sample():
    # 19 configurations with two samples each: one exact, one under-predicted by a growing factor.
    true = np.ones((38, 1))
    predicted = np.ones((38, 1))
    predicted[1::2, 0] = 1 / np.linspace(1.01, 1.19, 19)
    groups = [f"c{i // 2}" for i in range(38)]
    mask = np.ones_like(true, dtype=bool)
    grouped = conformal.calibrate(predicted, true, mask, ["m"], 0.8, groups=groups)
    assert grouped.samples == (19,)
    assert grouped.margin("m") == pytest.approx(1.16)  # rank ceil(20 * 0.8) = 16 of 19 groups
    per_sample = conformal.calibrate(predicted, true, mask, ["m"], 0.8)
    assert per_sample.margin("m") == pytest.approx(1.13)  # rank 32 of 38: 19 zeros, then 13th


def test_grouped_bounds_cover_every_sample_of_a_new_configuration_on_average():
    rng = np.random.default_rng(1)
    covered_all = []
    for _ in range(20):
        configs = 200
        shared = rng.normal(scale=0.3, size=configs)
        groups = np.repeat(np.arange(configs), 5).astype(str)
        errors = np.repeat(shared, 5) + rng.normal(scale=0.05, size=configs * 5)
        truth, predicted = np.ones((configs * 5, 1)), np.exp(-errors)[:, None]
        mask = np.ones_like(truth, dtype=bool)
        half = configs * 5 // 2
        cal = conformal.calibrate(
            predicted[:half], truth[:half], mask[:half], ["m"], 0.9, groups[:half]
        )
        covered = (truth[half:] <= cal.upper(predicted[half:]))[:, 0].reshape(-1, 5)
        covered_all.append(covered.all(axis=1).mean())
    assert np.mean(covered_all) >= 0.9


def test_groups_must_match_the_samples():
    with pytest.raises(conformal.CalibrationError, match="groups"):
        conformal.calibrate(
            np.ones((3, 1)), np.ones((3, 1)), np.ones((3, 1), bool), ["m"], 0.5, ["a"]
        )


MIB = float(1 << 20)


def test_an_offset_calibrates_on_what_the_gpu_holds_not_on_the_label_alone():
    """Reserved memory less a 500 MiB context: a 68 MiB job predicted at 30 MiB is a 2.27x miss
    on the label and 1.07x on what the GPU holds. Without the offset the margin multiplied a
    60 GiB job's bound by 2.27 (the shipped default refused a 62 GiB job on an 80 GiB GPU)."""
    true = np.array([[68 * MIB]] + [[1000 * MIB]] * 19)
    predicted = np.array([[30 * MIB]] + [[1000 * MIB]] * 19)
    mask = np.ones_like(true, dtype=bool)
    label_only = conformal.calibrate(predicted, true, mask, ["infer.memory_bytes"], 0.95)
    held = conformal.calibrate(
        predicted, true, mask, ["infer.memory_bytes"], 0.95, offsets=[500 * MIB]
    )
    assert label_only.margin("infer.memory_bytes") == pytest.approx(68 / 30)
    assert held.margin("infer.memory_bytes") == pytest.approx(568 / 530)
    # the bound still covers every calibration sample, and applies to label + offset
    assert (held.upper(predicted) >= true * (1 - 1e-12)).all()
    point = np.array([[60 * 1024 * MIB]])
    expected = (60 * 1024 * MIB + 500 * MIB) * 568 / 530 - 500 * MIB
    np.testing.assert_allclose(held.upper(point), [[expected]])
    assert held.offset("infer.memory_bytes") == 500 * MIB


def test_offsets_round_trip_and_a_calibration_without_them_still_loads():
    cal = calibration.Calibration(0.95, ("a", "b"), (0.1, 0.2), (20, 20), (5.0, 0.0))
    assert calibration.Calibration.from_dict(cal.to_dict()) == cal
    old = cal.to_dict()
    del old["offsets"]
    loaded = calibration.Calibration.from_dict(old)
    assert loaded.offsets == () and loaded.offset("a") == 0.0
    np.testing.assert_allclose(loaded.upper(np.array([[1.0, 1.0]])), [np.exp([0.1, 0.2])])


def test_offsets_must_match_the_metrics():
    with pytest.raises(conformal.CalibrationError, match="offsets"):
        conformal.calibrate(
            np.ones((20, 1)),
            np.ones((20, 1)),
            np.ones((20, 1), dtype=bool),
            ["m"],
            0.9,
            None,
            [1, 2],
        )


def test_a_censored_margin_puts_the_bound_above_the_floors_it_was_fitted_on():
    floors = np.full(20, 24.0)
    points = 24.0 / np.linspace(1.01, 1.2, 20)  # under the card by 1 % to 20 %
    log_margin = conformal.censored_margin(points, floors, [str(i) for i in range(20)], 0.95)
    assert math.exp(log_margin) == pytest.approx(1.2)
    assert np.all(points * math.exp(log_margin) >= floors * (1 - 1e-12))


def test_a_censored_margin_scores_each_configuration_once_and_is_never_negative():
    points = np.array([30.0] * 19 + [10.0, 30.0])  # one configuration under, at one batch
    floors = np.full(21, 24.0)
    groups = [str(i) for i in range(19)] + ["a", "a"]
    assert math.exp(conformal.censored_margin(points, floors, groups, 0.95)) == pytest.approx(2.4)
    assert conformal.censored_margin(np.full(19, 30.0), np.full(19, 24.0), groups[:19]) == 0.0
    with pytest.raises(conformal.CalibrationError, match="need at least 19"):
        conformal.censored_margin(points[:18], floors[:18], groups[:18])
    with pytest.raises(conformal.CalibrationError, match="20 points, 21 floors"):
        conformal.censored_margin(points[:20], floors, groups)


def test_widening_raises_one_metric_s_margin_and_never_lowers_it():
    cal = calibration.Calibration(0.95, ("a", "b"), (0.1, 0.2), (20, 20))
    wider = cal.widened("a", 0.3).widened("b", 0.05)
    assert wider.log_margins == (0.3, 0.2)
    assert wider.samples == cal.samples


def test_raising_adds_to_one_metric_s_margin_and_refuses_to_lower_it():
    cal = calibration.Calibration(0.95, ("a", "b"), (0.1, 0.2), (20, 20))
    raised = cal.raised("b", 0.3)
    assert raised.log_margins == pytest.approx((0.1, 0.5))
    assert raised.margin("b") == pytest.approx(math.exp(0.5))
    with pytest.raises(ValueError, match="only ever raised"):
        cal.raised("a", -0.01)


def test_a_shift_margin_pools_the_left_out_domains_and_checks_each_on_the_others():
    rng = np.random.default_rng(0)
    # Two domains the model generalises to (excess mostly below 0), one it does not (+0.3).
    excess = {
        "near": list(rng.normal(-0.1, 0.05, 60)),
        "also-near": list(rng.normal(-0.1, 0.05, 60)),
        "far": list(rng.normal(0.3, 0.05, 60)),
    }
    found = conformal.shift_margin(excess, 0.95)
    assert found.configurations == 180
    pooled = np.sort(np.concatenate([np.asarray(v) for v in excess.values()]))
    assert found.log_margin == pooled[math.ceil(181 * 0.95) - 1]
    far = found.per_domain["far"]
    assert far.own_coverage == 0.0
    # the near domains alone give no widening: the far one stays uncovered, and says so
    assert far.others_log_margin == 0.0 and far.widened_coverage == 0.0
    near = found.per_domain["near"]
    assert near.own_coverage == pytest.approx(np.mean(np.asarray(excess["near"]) <= 0))
    assert near.others_log_margin > 0.25 and near.widened_coverage == 1.0


def test_a_shift_margin_needs_two_domains_and_enough_configurations():
    with pytest.raises(conformal.CalibrationError, match="need two"):
        conformal.shift_margin({"only": [0.1] * 40})
    with pytest.raises(conformal.CalibrationError, match="need at least 19"):
        conformal.shift_margin({"a": [0.1] * 5, "b": [0.2] * 5})
    assert conformal.shift_margin({"a": [-0.2] * 20, "b": [-0.1] * 20}).log_margin == 0.0
