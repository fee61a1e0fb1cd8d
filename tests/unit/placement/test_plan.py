from __future__ import annotations

import pytest
from placement_cases import GIB, build, node, pod, prediction, shipped_prediction

from kubeseer.placement import catalogue, plan, slowdown

H100 = catalogue.model_by_key("H100-80GB-SXM")
A100_80 = catalogue.model_by_key("A100-80GB")
A100_40 = catalogue.model_by_key("A100-40GB")


def names(rows):
    return [(r.candidate.gpu.key, r.candidate.profile.name or "whole") for r in rows]


def share_held(profile: catalogue.Profile) -> float:
    """The rule, written out again: the scarcer of compute slices of 7 and memory slices of 8."""
    if profile.name is None:
        return 1.0
    return max(profile.compute_slices / 7, profile.memory_slices / 8)


def test_share_held_is_the_scarcer_of_compute_and_memory_slices():
    assert H100.profile("1g.10gb").share_held == pytest.approx(1 / 7)
    assert H100.profile("1g.20gb").share_held == pytest.approx(2 / 8)
    assert H100.profile("3g.40gb").share_held == pytest.approx(4 / 8)
    assert H100.profile("4g.40gb").share_held == pytest.approx(4 / 7)
    assert H100.profile("7g.80gb").share_held == H100.whole.share_held == 1.0


def test_without_evidence_the_ladder_is_ordered_by_share_held_smallest_slice_first():
    rows = plan.build(
        shipped_prediction(upper_bytes=5 * GIB), plan.from_catalogue([H100]), max_slowdown=2.0
    ).ladder
    assert names(rows) == [
        ("H100-80GB-SXM", "1g.10gb"),
        ("H100-80GB-SXM", "1g.20gb"),
        ("H100-80GB-SXM", "2g.20gb"),
        ("H100-80GB-SXM", "3g.40gb"),
        ("H100-80GB-SXM", "4g.40gb"),
        ("H100-80GB-SXM", "7g.80gb"),  # same cost as the whole GPU, less memory: first
        ("H100-80GB-SXM", "whole"),
    ]
    assert [r.rank for r in rows] == list(range(1, 8))
    assert all(r.slowdown.evidence is slowdown.Evidence.NONE for r in rows)
    assert all(r.step_time_s is None for r in rows)
    assert [r.cost for r in rows] == pytest.approx([0.05 * share_held(p) for p in _h100_all()])


def _h100_all() -> list[catalogue.Profile]:
    return [*H100.profiles, H100.whole]


@pytest.mark.parametrize("util", [5, 25, 50, 90, 100])
@pytest.mark.parametrize("max_slowdown", [1.0, 2.0, 4.0])
def test_with_learned_utilisation_the_order_is_gpu_time_per_step_times_share_held(
    util, max_slowdown
):
    step = 0.04
    pred = prediction(
        upper_bytes=5 * GIB, sm_util=util, label_device="NVIDIA-H100-80GB-HBM3", step_time_s=step
    )
    made = plan.build(pred, plan.from_catalogue([H100]), max_slowdown=max_slowdown)
    # Recompute from the equation: slowdown max(1, u/s), cost share_held x step x slowdown.
    expected = []
    for p in _h100_all():
        factor = max(1.0, util / 100 / p.compute_share)
        if factor <= max_slowdown:
            cost = share_held(p) * step * factor
            expected.append((cost, p.usable_memory_bytes, p.compute_share, p.name or "whole"))
    expected.sort()
    assert [n for _, n in names(made.ladder)] == [e[3] for e in expected]
    assert [r.cost for r in made.ladder] == pytest.approx([e[0] for e in expected])
    for r in made.ladder:
        assert r.slowdown.evidence is slowdown.Evidence.LEARNED
        assert r.step_time_s == pytest.approx(step * r.slowdown.factor)


def test_a_prediction_that_carries_its_work_is_placed_by_the_derived_slowdown_by_default():
    from dataclasses import replace

    from kubeseer.prediction import StepWork

    # A compute-bound step (a ResNet-50 training step at batch 256 is about 3e12 FLOPs): the
    # law puts the small slices far beyond 2x, so they are too slow, not the first rung.
    busy = replace(
        shipped_prediction(upper_bytes=5 * GIB),
        work=StepWork(flops=3e13, bytes_moved=5e10, kernels=500),
    )
    made = plan.build(busy, plan.from_catalogue([H100]), max_slowdown=2.0)
    by_profile = {r.candidate.profile.name or "whole": r for r in made.rows}
    assert by_profile["1g.10gb"].verdict is plan.Verdict.TOO_SLOW
    assert by_profile["1g.10gb"].slowdown.evidence is slowdown.Evidence.DERIVED
    assert all(r.slowdown.factor is not None and r.slowdown.factor <= 2.0 for r in made.ladder)
    assert names(made.ladder)[0] != ("H100-80GB-SXM", "1g.10gb")


def test_equal_cost_across_products_goes_to_less_usable_memory():
    made = plan.build(
        shipped_prediction(upper_bytes=9 * GIB),
        plan.from_catalogue([H100, A100_80, A100_40]),
        max_slowdown=2.0,
    )
    # 1g.10gb holds 1/7 of an A100-80GB (9.50 GiB) and of an H100 (9.75 GiB); A100-40GB's
    # 1g.10gb holds 2/8 of it (two memory slices).
    assert names(made.ladder[:3]) == [
        ("A100-80GB", "1g.10gb"),
        ("H100-80GB-SXM", "1g.10gb"),
        ("A100-40GB", "1g.10gb"),
    ]


def test_rows_that_do_not_fit_say_why_and_have_no_rank():
    pred = prediction(upper_bytes=10 * GIB, sm_util=100, label_device="NVIDIA-H100-80GB-HBM3")
    made = plan.build(pred, plan.from_catalogue([H100]), max_slowdown=2.0, allow_whole_gpu=False)
    by_name = {r.candidate.profile.name or "whole": r for r in made.rows}
    assert by_name["1g.10gb"].verdict is plan.Verdict.TOO_SMALL
    assert by_name["1g.10gb"].margin_bytes == 9.75 * GIB - 10 * GIB
    assert "0.25 GiB short" in by_name["1g.10gb"].note
    assert by_name["3g.40gb"].verdict is plan.Verdict.TOO_SLOW  # 60 of 132 SMs: 2.2x
    assert "≈2.20x" in by_name["3g.40gb"].note
    assert by_name["whole"].verdict is plan.Verdict.WHOLE_GPU_NOT_ALLOWED
    assert names(made.ladder) == [("H100-80GB-SXM", "7g.80gb")]
    assert all(r.rank is None for r in made.rows if not r.fits)
    assert made.chosen is None


def test_cluster_rows_count_free_units_and_refuse_kinds_with_too_few_for_the_replicas():
    inv = build(
        [
            node("h", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7}),
        ],
        [pod("h", {"nvidia.com/mig-1g.10gb": 3})],
    )
    candidates = plan.from_inventory(inv, [H100])
    made = plan.build(shipped_prediction(upper_bytes=GIB), candidates, max_slowdown=2.0, replicas=4)
    mig, whole = (
        next(r for r in made.rows if r.candidate.resource == res)
        for res in (
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/gpu",
        )
    )
    assert (mig.candidate.free, mig.candidate.allocatable, mig.verdict) == (4, 7, plan.Verdict.FITS)
    assert whole.verdict is plan.Verdict.TOO_FEW
    assert "2 in the cluster, the job needs 4 at once" in whole.note


def test_a_larger_need_than_the_bound_replaces_it():
    made = plan.build(
        shipped_prediction(upper_bytes=GIB),
        plan.from_catalogue([H100]),
        max_slowdown=2.0,
        need_bytes=15 * GIB,
        need_basis="escalation",
    )
    assert made.need_bytes == 15 * GIB and made.need_basis == "escalation"
    assert names(made.ladder)[0] == ("H100-80GB-SXM", "1g.20gb")


def test_choosing_marks_one_row_and_the_status_rows_carry_every_field():
    made = plan.build(
        shipped_prediction(upper_bytes=3 * GIB), plan.from_catalogue([A100_40]), max_slowdown=2.0
    )
    chosen = made.with_choice(made.ladder[1], "chosen: test")
    assert chosen.chosen == chosen.ladder[1] and chosen.chosen.note == "chosen: test"
    rows = plan.status_rows(chosen)
    assert [r["chosen"] for r in rows].count(True) == 1
    first = rows[0]
    assert first == {
        "gpuProduct": "A100-40GB",
        "productLabel": "NVIDIA-A100-SXM4-40GB",
        "profile": "1g.5gb",
        "resource": "nvidia.com/mig-1g.5gb",
        "usableMemoryMiB": 4864,
        "fits": True,
        "marginMiB": 4864 - 3 * 1024,
        "slowdown": None,
        "slowdownEvidence": "no evidence",
        "stepTimeSeconds": None,
        "shareHeld": round(1 / 7, 4),
        "cost": pytest.approx(0.05 / 7),
        "rank": 1,
        "free": None,
        "chosen": False,
        "note": "holds the need with 1.75 GiB to spare",
    }
    other = plan.build(
        shipped_prediction(upper_bytes=GIB), plan.from_catalogue([H100]), max_slowdown=2.0
    )
    with pytest.raises(ValueError):
        made.with_choice(other.rows[0], "")
