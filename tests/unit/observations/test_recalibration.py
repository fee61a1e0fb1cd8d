"""Online conformal memory margins: the quantile rule, the groups, censoring, checkpoints."""

import math

import numpy as np
import pytest

from kubeseer.observations import recalibration, record

GIB = 1 << 30


def stream(make_observation, ratios, *, family="resnet", product="A100-80GB", start=0, **kw):
    return [
        make_observation(
            f"job-{start + i}",
            family=family,
            gpu_product=product,
            predicted=GIB,
            observed=round(GIB * r),
            **kw,
        )
        for i, r in enumerate(ratios)
    ]


def test_the_margin_is_the_split_conformal_quantile_of_the_jobs_log_ratios(make_observation):
    ratios = np.exp(np.random.default_rng(0).normal(0.05, 0.04, 60))
    cal = recalibration.Recalibrator(min_samples=20)
    cal.observe_all(stream(make_observation, ratios))
    margin = cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.9)
    scores = np.sort(np.log(np.round(GIB * ratios) / GIB))
    expected = scores[math.ceil(61 * 0.9) - 1]  # the ceil((n + 1) c)-th smallest of n = 60
    assert margin is not None and margin.log_margin == pytest.approx(expected)
    assert margin.group == recalibration.Group("A100-80GB", "resnet")
    assert margin.samples == 60


def test_a_group_without_enough_jobs_falls_back_to_a_coarser_one(make_observation):
    cal = recalibration.Recalibrator(min_samples=20)
    cal.observe_all(stream(make_observation, [1.10] * 25, family="resnet", product="A100-80GB"))
    cal.observe_all(
        stream(make_observation, [1.30] * 5, family="resnet", product="H100-80GB", start=100)
    )
    # H100/resnet has 5 jobs: the family across products answers.
    margin = cal.margin("ckpt-1", gpu_product="H100-80GB", family="resnet", coverage=0.95)
    assert margin.group == recalibration.Group(None, "resnet")
    assert margin.factor == pytest.approx(1.30, rel=1e-6)  # the worst of the 30 jobs
    # A family the cluster has not run enough of takes the product's margin, then everything's.
    assert cal.margin("ckpt-1", gpu_product="A100-80GB", family="bert", coverage=0.95).group == (
        recalibration.Group("A100-80GB", None)
    )
    assert cal.margin("ckpt-1", gpu_product="L4", family="bert", coverage=0.95).group == (
        recalibration.Group(None, None)
    )
    # Too few jobs anywhere: the checkpoint's margin stands.
    assert cal.margin("ckpt-2", gpu_product="A100-80GB", family="resnet", coverage=0.95) is None


def test_coverage_needs_enough_jobs_for_a_finite_quantile(make_observation):
    cal = recalibration.Recalibrator(min_samples=5)
    cal.observe_all(stream(make_observation, [1.0] * 10))
    assert cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.8) is not None
    # 95 % needs 19 jobs.
    assert cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.95) is None


def test_an_over_predicting_model_keeps_a_bound_at_the_point(make_observation):
    cal = recalibration.Recalibrator(min_samples=20)
    cal.observe_all(stream(make_observation, [0.8] * 30))
    margin = cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.95)
    assert margin.log_margin == 0.0


def test_a_job_counts_once_with_its_worst_attempt_and_an_oom_as_a_lower_bound(make_observation):
    cal = recalibration.Recalibrator(min_samples=1)
    oom = make_observation(
        "job-x", 0, predicted=GIB, observed=None, outcome=record.Outcome.OOM, limit=2 * GIB
    )
    retry = make_observation("job-x", 1, predicted=GIB, observed=round(2.5 * GIB))
    assert cal.observe(oom) and cal.observe(retry)
    group = recalibration.Group("A100-80GB", "resnet")
    assert cal.samples("ckpt-1", group) == 1
    margin = cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.5)
    assert margin.factor == pytest.approx(2.5)
    # A failed attempt teaches nothing about memory.
    failed = make_observation("job-y", predicted=GIB, outcome=record.Outcome.FAILED)
    assert not cal.observe(failed)


def test_scores_belong_to_the_checkpoint_that_predicted(make_observation):
    cal = recalibration.Recalibrator(min_samples=20)
    cal.observe_all(stream(make_observation, [1.5] * 30, version="ckpt-old"))
    assert cal.margin("ckpt-new", gpu_product="A100-80GB", family="resnet", coverage=0.9) is None


def test_the_window_forgets_old_jobs_so_the_margin_follows_drift(make_observation):
    cal = recalibration.Recalibrator(window=40, min_samples=20)
    cal.observe_all(stream(make_observation, [1.5] * 40))
    cal.observe_all(stream(make_observation, [1.02] * 40, start=1000))
    margin = cal.margin("ckpt-1", gpu_product="A100-80GB", family="resnet", coverage=0.95)
    assert margin.factor == pytest.approx(1.02, rel=1e-6)
    assert margin.samples == 40


def test_groups_leave_out_what_is_unknown():
    assert recalibration.groups_of(None, "bert") == (
        recalibration.Group(None, "bert"),
        recalibration.Group(None, None),
    )
    assert [g.label() for g in recalibration.groups_of("A100-80GB", "bert")] == [
        "A100-80GB/bert",
        "*/bert",
        "A100-80GB/*",
        "*/*",
    ]


def test_the_margin_describes_itself():
    margin = recalibration.Margin(math.log(1.25), recalibration.Group(None, "vit"), 57)
    assert margin.describe() == (
        "memory margin x1.250 recalibrated on the cluster's last 57 jobs of */vit"
    )


def test_a_family_and_a_product_that_both_qualify_give_the_larger_margin(make_observation):
    cal = recalibration.Recalibrator(min_samples=20)
    # resnet is well predicted everywhere; the new H200's runtime adds 8 % to every family.
    cal.observe_all(stream(make_observation, [1.01] * 30, family="resnet", product="A100-80GB"))
    cal.observe_all(stream(make_observation, [1.08] * 30, family="bert", product="H200", start=100))
    margin = cal.margin("ckpt-1", gpu_product="H200", family="resnet", coverage=0.95)
    assert margin.group == recalibration.Group("H200", None)
    assert margin.factor == pytest.approx(1.08, rel=1e-6)
    # And the other way round: a badly predicted family on a well-known GPU.
    margin = cal.margin("ckpt-1", gpu_product="A100-80GB", family="bert", coverage=0.95)
    assert margin.group == recalibration.Group(None, "bert")
