from __future__ import annotations

import itertools
from collections import Counter

import pytest
from placement_cases import (
    GIB,
    MIB,
    a100_40_mixed,
    build,
    devcluster_nodes,
    node,
    pod,
    prediction,
    shipped_prediction,
    unlearned_prediction,
)

from kubeseer.placement import catalogue, inventory, policy, slowdown

AUTO = policy.Request()
H100 = "NVIDIA-H100-80GB-HBM3"
A100_80 = "NVIDIA-A100-SXM4-80GB"
PRODUCT = inventory.PRODUCT_LABEL


def h100_mixed(name: str = "h100", **counts: int):
    """An H100-80GB node in MIG strategy `mixed`; keyword names use `_` for `.`."""
    return node(name, H100, {f"nvidia.com/mig-{k.replace('_', '.')}": v for k, v in counts.items()})


H100_ALL = h100_mixed(
    **{"1g_10gb": 1, "1g_20gb": 1, "2g_20gb": 1, "3g_40gb": 1, "4g_40gb": 1, "7g_80gb": 1}
)

# DIPPM, Table 5 (A100-40GB): model, batch size, predicted MB, DIPPM's MIG, measured MB.
DIPPM_TABLE_5 = [
    ("densenet121", 8, 2865, "1g.5gb", 3272),
    ("densenet121", 32, 5952, "2g.10gb", 6294),
    ("swin_base_patch4", 2, 2873, "1g.5gb", 2944),
    ("swin_base_patch4", 16, 6736, "2g.10gb", 6156),
    ("convnext_base", 4, 4771, "1g.5gb", 1652),
    ("convnext_base", 128, 26439, "7g.40gb", 30996),
]


@pytest.mark.parametrize(("model", "batch", "predicted_mb", "mig", "_measured"), DIPPM_TABLE_5)
def test_dippm_policy_reproduces_the_papers_published_profiles(
    model, batch, predicted_mb, mig, _measured
):
    pred = prediction(upper_bytes=predicted_mb * MIB)
    placed = policy.choose(
        pred, build([a100_40_mixed()]), policy.Request(policy=policy.PolicyName.DIPPM)
    )
    assert placed.profile == mig, f"{model} batch {batch}"
    assert placed.resource == f"nvidia.com/mig-{mig}"
    assert "DIPPM rule" in placed.reason


# With the measured memory as the upper bound and light SM use, `auto` picks the smallest slice
# that really holds it: 1g.10gb (same 9.6 GiB as 2g.10gb, half the SMs) where DIPPM takes 2g.10gb.
AUTO_ON_MEASURED = {
    ("densenet121", 8): "1g.5gb",
    ("densenet121", 32): "1g.10gb",
    ("swin_base_patch4", 2): "1g.5gb",
    ("swin_base_patch4", 16): "1g.10gb",
    ("convnext_base", 4): "1g.5gb",
    ("convnext_base", 128): "7g.40gb",
}


@pytest.mark.parametrize(("model", "batch", "_predicted", "_mig", "measured_mb"), DIPPM_TABLE_5)
def test_auto_policy_on_dippms_measured_memory_picks_the_smallest_slice_that_holds_it(
    model, batch, _predicted, _mig, measured_mb
):
    pred = prediction(upper_bytes=measured_mb * MIB, sm_util=10)
    placed = policy.choose(pred, build([a100_40_mixed()]), AUTO)
    assert placed.profile == AUTO_ON_MEASURED[(model, batch)]
    assert placed.usable_memory_bytes >= measured_mb * MIB


def test_dippm_rule_compares_nominal_size_so_it_picks_a_slice_too_small_to_hold_the_job():
    # 4.9 GiB is below the nominal 5 GB of 1g.5gb but above its 4.75 GiB usable memory.
    pred = prediction(upper_bytes=4.9 * GIB)
    inv = build([a100_40_mixed()])
    dippm = policy.choose(pred, inv, policy.Request(policy=policy.PolicyName.DIPPM))
    auto = policy.choose(pred, inv, AUTO)
    assert dippm.profile == "1g.5gb" and dippm.usable_memory_bytes < 4.9 * GIB
    assert auto.profile == "1g.10gb"


@pytest.mark.parametrize(
    ("memory_gib", "expected"),
    [(5.0, "1g.5gb"), (5.001, "2g.10gb"), (10.0, "2g.10gb"), (20.0, "3g.20gb"), (40.0, "7g.40gb")],
)
def test_dippm_thresholds_are_closed_on_the_right(memory_gib, expected):
    profile = policy.dippm_profile(memory_gib * GIB, catalogue.model_by_key("A100-40GB"))
    assert profile is not None and profile.name == expected


def test_dippm_above_the_ladder_is_no_fit_naming_the_prediction():
    pred = prediction(upper_bytes=41 * GIB)
    with pytest.raises(policy.NoFit, match=r"41\.00 GiB maps to no profile") as info:
        policy.choose(
            pred, build([a100_40_mixed()]), policy.Request(policy=policy.PolicyName.DIPPM)
        )
    assert info.value.cause is policy.NoFitCause.NOTHING_FITS


@pytest.mark.parametrize(
    ("upper", "sm_util", "max_slowdown", "expected"),
    [
        # Memory alone: cheapest is the smallest share held that holds the upper bound.
        (5 * GIB, 5, 2.0, "1g.10gb"),
        (9.75 * GIB, 5, 2.0, "1g.10gb"),  # exactly the usable memory: fits
        (9.75 * GIB + 1, 5, 2.0, "1g.20gb"),  # one byte more: 1g.20gb holds 2/8, 2g.20gb 2/7
        (20 * GIB, 5, 2.0, "3g.40gb"),
        # Compute: GPU time per step = share held x max(1, u / compute share).
        (5 * GIB, 24, 2.0, "1g.10gb"),  # 1/7 x 1.98 = 0.283 < 2g.20gb's 2/7 x 1.0
        (5 * GIB, 25, 2.0, "2g.20gb"),  # 1g.10gb is 2.06x: too slow; 2g 0.295 < 1g.20gb 0.317
        (5 * GIB, 45, 2.0, "3g.40gb"),  # 3g: 4/8 x 1.0 = 0.50 < 2g: 2/7 x 1.86 = 0.53
        (5 * GIB, 90, 2.0, "3g.40gb"),  # 3g: 0.5 x 1.98 = 0.99 < 7g: 1.0
        (5 * GIB, 100, 2.0, "7g.80gb"),  # 3g (2.2x) and 4g (2.06x) are too slow
        (5 * GIB, 100, 1.0, "7g.80gb"),  # no slowdown allowed at full use: all SMs
        (79.25 * GIB, 5, 2.0, "7g.80gb"),
    ],
)
def test_auto_picks_the_cheapest_free_profile_within_memory_and_learned_slowdown(
    upper, sm_util, max_slowdown, expected
):
    pred = prediction(upper_bytes=upper, sm_util=sm_util, label_device=H100)
    placed = policy.choose(pred, build([H100_ALL]), policy.Request(max_slowdown=max_slowdown))
    assert placed.profile == expected
    assert placed.predicted_slowdown is not None
    assert placed.predicted_slowdown <= max_slowdown
    assert placed.slowdown_evidence is slowdown.Evidence.LEARNED
    assert placed.gpu_product == "H100-80GB-SXM"
    assert placed.cost_rank == 1


def test_the_default_dljob_lands_on_the_smallest_slice_that_holds_its_memory():
    # Issue 17: the shipped checkpoint's 100 % utilisation is a stand-in, not evidence; with
    # maxSlowdown 2 it sent a 0.6 GiB inference job to a whole 80 GB GPU.
    pred = shipped_prediction(upper_bytes=0.6 * GIB)
    inv = build(devcluster_nodes())
    placed = policy.choose(pred, inv, AUTO)
    assert (placed.gpu_product, placed.profile) == ("A100-40GB", "1g.5gb")
    assert placed.predicted_slowdown is None
    assert placed.slowdown_evidence is slowdown.Evidence.NONE
    assert "no evidence of a slowdown" in placed.reason
    # allowWholeGPU: false no longer fails it with NoFit.
    no_whole = policy.choose(pred, inv, policy.Request(allow_whole_gpu=False))
    assert no_whole.profile == "1g.5gb"


def test_the_docs_example_lands_on_1g_10gb_of_an_h100_without_evidence():
    pred = unlearned_prediction(upper_bytes=2.5 * GIB, label_device="NVIDIA H100 80GB HBM3")
    placed = policy.choose(pred, build([H100_ALL]), AUTO)
    assert placed.resource == "nvidia.com/mig-1g.10gb"


def test_evidence_still_keeps_a_busy_job_off_a_small_slice():
    pred = prediction(upper_bytes=0.6 * GIB, sm_util=100, label_device="A100-SXM4-80GB")
    placed = policy.choose(pred, build(devcluster_nodes()), AUTO)
    # Every A100 slice is slower than 2x at 100 % SM use; the H100 is judged on derived grounds.
    assert placed.profile is None
    assert placed.slowdown_evidence in (slowdown.Evidence.LEARNED, slowdown.Evidence.DERIVED)


def test_whole_gpu_only_when_no_mig_profile_fits():
    inv = build([H100_ALL, node("whole", A100_80, {"nvidia.com/gpu": 2})])
    mig = policy.choose(prediction(upper_bytes=39 * GIB), inv, AUTO)
    assert mig.profile == "3g.40gb"
    whole = policy.choose(prediction(upper_bytes=79.5 * GIB), inv, AUTO)
    assert (whole.resource, whole.profile, whole.gpu_product) == (
        "nvidia.com/gpu",
        None,
        "A100-80GB",
    )
    assert "whole GPU on A100-80GB" in whole.reason


def test_cluster_of_only_whole_gpus_gets_the_smallest_one_that_holds_the_job():
    inv = build(
        [
            node("h200", "NVIDIA-H200", {"nvidia.com/gpu": 8}),
            node("a100", "NVIDIA-A100-SXM4-40GB", {"nvidia.com/gpu": 8}),
        ]
    )
    assert policy.choose(prediction(upper_bytes=30 * GIB), inv, AUTO).gpu_product == "A100-40GB"
    assert policy.choose(prediction(upper_bytes=60 * GIB), inv, AUTO).gpu_product == "H200-141GB"


def test_whole_gpus_refused_when_the_dljob_disallows_them():
    inv = build([node("a100", A100_80, {"nvidia.com/gpu": 1})])
    with pytest.raises(policy.NoFit, match=r"whole GPUs not allowed"):
        policy.choose(prediction(upper_bytes=GIB), inv, policy.Request(allow_whole_gpu=False))


def test_gpu_products_restrict_the_choice_even_when_another_product_is_smaller():
    inv = build([a100_40_mixed(), H100_ALL])
    assert policy.choose(prediction(upper_bytes=3 * GIB), inv, AUTO).profile == "1g.5gb"
    placed = policy.choose(
        prediction(upper_bytes=3 * GIB), inv, policy.Request(gpu_products=("H100-80GB-SXM",))
    )
    assert (placed.profile, placed.product_label) == ("1g.10gb", H100)
    assert placed.node_selector == {"nvidia.com/gpu.product": H100}


def test_a_fit_that_is_only_busy_waits_for_the_fitting_kind_with_the_shortest_queue():
    nodes = [h100_mixed("busy", **{"2g_20gb": 3, "3g_40gb": 2})]
    running = [
        pod("busy", {"nvidia.com/mig-2g.20gb": 3}),
        pod("busy", {"nvidia.com/mig-3g.40gb": 2}),
    ]
    pred = shipped_prediction(upper_bytes=10 * GIB)
    # Nothing queued yet: the cheapest rung (2g.20gb, 3 units) takes the wait.
    decision = policy.decide(pred, build(nodes, running), AUTO)
    assert decision.placement.profile == "2g.20gb"
    assert "none is free now, the pod waits for one" in decision.placement.reason
    assert decision.placement.node_hint is None
    # Three pods already wait for 2g.20gb: (3 + 1) / 3 against 3g.40gb's (0 + 1) / 2.
    queued = [pod("", {"nvidia.com/mig-2g.20gb": 3}, node_selector={PRODUCT: H100})]
    waits = policy.decide(pred, build(nodes, running + queued), AUTO)
    assert waits.placement.profile == "3g.40gb"
    assert waits.placement.cost_rank == 2
    assert waits.plan.chosen is not None and waits.plan.chosen.rank == 2


def test_too_big_for_everything_names_the_need_and_the_largest_free_thing():
    inv = build([a100_40_mixed(), node("h100", H100, {"nvidia.com/mig-3g.40gb": 2})])
    with pytest.raises(policy.NoFit) as info:
        policy.choose(prediction(upper_bytes=200 * GIB), inv, AUTO)
    message = str(info.value)
    assert "predicted need 200.00 GiB (upper bound at 95% coverage)" in message
    # H100's 3g.40gb (39.50 GiB) is larger than A100-40GB's 7g.40gb (39.25 GiB).
    assert "largest free: nvidia.com/mig-3g.40gb on H100-80GB-SXM (39.50 GiB usable)" in message
    assert info.value.cause is policy.NoFitCause.NOTHING_FITS
    assert info.value.needed_bytes == 200 * GIB
    assert info.value.plan is not None and not info.value.plan.ladder


def test_a_cluster_without_known_gpus_says_so_and_lists_skipped_nodes():
    inv = build([node("t4", "Tesla-T4", {"nvidia.com/gpu": 1})])
    with pytest.raises(policy.NoFit, match=r"no GPU at all .*skipped nodes: t4 \(unknown GPU"):
        policy.choose(prediction(upper_bytes=GIB), inv, AUTO)


def test_a_gpu_product_the_cluster_lacks_is_its_own_cause_not_no_gpu_free():
    request = policy.Request(gpu_products=("H200-141GB",))
    with pytest.raises(
        policy.NoFit,
        match=r"no H200-141GB at all \(GPUs in the cluster: A100-40GB, A100-80GB, H100-80GB-SXM\)",
    ) as info:
        policy.choose(shipped_prediction(upper_bytes=GIB), build(devcluster_nodes()), request)
    assert info.value.cause is policy.NoFitCause.PRODUCT_ABSENT


def test_a_template_node_selector_no_gpu_node_matches_is_its_own_cause():
    request = policy.Request(node_selector=(("disktype", "nvme"),))
    with pytest.raises(
        policy.NoFit, match=r"nodeSelector \(disktype=nvme\) matches no node"
    ) as info:
        policy.choose(shipped_prediction(upper_bytes=GIB), build(devcluster_nodes()), request)
    assert info.value.cause is policy.NoFitCause.NO_MATCHING_NODE
    assert "gpu-h100-0" in str(info.value)


def test_a_template_node_selector_restricts_placement_to_the_nodes_it_matches():
    nodes = [
        node("plain", H100, {"nvidia.com/mig-1g.10gb": 7}),
        node("fast", A100_80, {"nvidia.com/mig-3g.40gb": 2}, labels={"disktype": "nvme"}),
    ]
    request = policy.Request(node_selector=(("disktype", "nvme"),))
    placed = policy.choose(shipped_prediction(upper_bytes=GIB), build(nodes), request)
    assert (placed.profile, placed.node_hint) == ("3g.40gb", "fast")


def test_replicas_beyond_what_the_cluster_has_of_any_fitting_kind_cannot_run_as_a_whole():
    # Issue 17: replicas 1024 on 6 whole GPUs created 1,024 pods.
    request = policy.Request(replicas=1024)
    with pytest.raises(
        policy.NoFit, match=r"replicas: 1024 .* the most is 9 x nvidia\.com/mig-1g\.5gb"
    ) as info:
        policy.choose(shipped_prediction(upper_bytes=GIB), build(devcluster_nodes()), request)
    assert info.value.cause is policy.NoFitCause.TOO_MANY_REPLICAS
    assert "cannot run as a whole" in str(info.value)


def test_replicas_are_placed_on_one_kind_with_enough_units_for_all_of_them():
    request = policy.Request(replicas=4)
    placed = policy.choose(shipped_prediction(upper_bytes=GIB), build(devcluster_nodes()), request)
    # 1g.5gb (9 of them) holds 4 replicas; the cheaper kinds with fewer units are passed over.
    assert placed.resource == "nvidia.com/mig-1g.5gb"
    busy = build(devcluster_nodes(), [pod("gpu-a100-40-mig-0", {"nvidia.com/mig-1g.5gb": 6})])
    moved = policy.choose(shipped_prediction(upper_bytes=GIB), busy, request)
    assert moved.resource == "nvidia.com/mig-2g.20gb"


def burst(count: int, pred, request=AUTO, nodes=None):
    """Place `count` jobs one after another, each pod pending with its product nodeSelector."""
    nodes = nodes if nodes is not None else devcluster_nodes()
    pending: list = []
    placed = []
    for _ in range(count):
        placement = policy.choose(pred, build(nodes, pending), request)
        pending.append(pod("", {placement.resource: 1}, node_selector=placement.node_selector))
        placed.append(placement)
    return placed


def test_a_burst_spreads_over_everything_free_that_fits_before_anything_waits():
    # Issue 17: 30 DLJobs at once all went to whole H100s (4 ran, 26 waited) while 2 whole
    # A100-80GBs and the slices stayed idle.
    placed = burst(30, shipped_prediction(upper_bytes=3 * GIB))
    kinds = Counter((p.gpu_product, p.resource) for p in placed)
    waiting = [p for p in placed if "wait" in p.reason]
    # 18 slices + 6 whole GPUs are free; 24 jobs take them, 6 wait.
    assert len(waiting) == 6
    assert sum(kinds.values()) == 30
    started = Counter((p.gpu_product, p.resource) for p in placed if p not in waiting)
    assert started == {
        ("A100-40GB", "nvidia.com/mig-1g.5gb"): 9,
        ("A100-80GB", "nvidia.com/mig-1g.10gb"): 2,
        ("A100-40GB", "nvidia.com/mig-2g.10gb"): 1,
        ("A100-80GB", "nvidia.com/mig-2g.20gb"): 4,
        ("A100-40GB", "nvidia.com/mig-3g.20gb"): 1,
        ("A100-80GB", "nvidia.com/mig-3g.40gb"): 1,
        ("H100-80GB-SXM", "nvidia.com/gpu"): 4,
        ("A100-80GB", "nvidia.com/gpu"): 2,
    }
    # The ones that wait are spread over the queues, not piled onto one kind.
    assert len({(p.gpu_product, p.resource) for p in waiting}) >= 3


def test_a_burst_with_a_generous_max_slowdown_does_not_pile_onto_one_slice_kind():
    # Issue 17: with maxSlowdown 10, 17 DLJobs went to the 9 1g.5gb slices.
    pred = prediction(upper_bytes=2 * GIB, sm_util=100, label_device="A100-SXM4-40GB")
    placed = burst(17, pred, policy.Request(max_slowdown=10))
    on_1g5 = [p for p in placed if p.resource == "nvidia.com/mig-1g.5gb"]
    assert len(on_1g5) == 9
    assert all("wait" not in p.reason for p in placed)


def test_pending_pods_are_charged_only_to_the_product_their_selector_allows():
    nodes = [node("h", H100, {"nvidia.com/gpu": 1}), node("a", A100_80, {"nvidia.com/gpu": 1})]
    pinned = [pod("", {"nvidia.com/gpu": 1}, node_selector={PRODUCT: H100})]
    placed = policy.choose(shipped_prediction(upper_bytes=GIB), build(nodes, pinned), AUTO)
    assert placed.gpu_product == "A100-80GB"
    assert "wait" not in placed.reason


def test_pending_pods_keep_the_last_slice_from_being_promised_twice():
    inv = build(
        [h100_mixed("n1", **{"1g_10gb": 1, "3g_40gb": 1})],
        [pod("", {"nvidia.com/mig-1g.10gb": 1})],
    )
    assert policy.choose(prediction(upper_bytes=GIB), inv, AUTO).profile == "3g.40gb"


def test_node_hint_is_the_node_with_the_most_free_units():
    inv = build(
        [h100_mixed("a", **{"1g_10gb": 7}), h100_mixed("b", **{"1g_10gb": 7})],
        [pod("a", {"nvidia.com/mig-1g.10gb": 3})],
    )
    assert policy.choose(prediction(upper_bytes=GIB), inv, AUTO).node_hint == "b"


def test_prediction_calibrated_for_less_coverage_than_requested_is_refused():
    with pytest.raises(policy.CoverageError, match=r"covers 90% .* asks for 95%"):
        policy.choose(prediction(upper_bytes=GIB, coverage=0.90), build([H100_ALL]), AUTO)


def test_the_decision_carries_the_plan_with_the_chosen_row():
    decision = policy.decide(shipped_prediction(upper_bytes=GIB), build(devcluster_nodes()), AUTO)
    chosen = decision.plan.chosen
    assert chosen is not None and chosen.rank == decision.placement.cost_rank == 1
    assert chosen.candidate.resource == decision.placement.resource
    assert chosen.note.startswith("chosen: the cheapest free rung")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": policy.PolicyName.FIXED}, "needs a profile"),
        ({"profile": "1g.10gb"}, "only used with policy 'fixed'"),
        ({"max_slowdown": 0.5}, "maxSlowdown must be a finite number >= 1"),
        ({"max_slowdown": float("inf")}, "maxSlowdown"),
        ({"replicas": 0}, "replicas must be at least 1"),
        ({"coverage": 1.0}, "coverage must be in"),
        (
            {"policy": policy.PolicyName.FIXED, "profile": "gpu", "allow_whole_gpu": False},
            "contradicts allowWholeGPU: false",
        ),
        ({"gpu_products": ("B200",)}, "unknown GPU product 'B200'"),
        (
            {"policy": policy.PolicyName.FIXED, "profile": "1g.5gb", "gpu_products": ("H100-NVL",)},
            "no allowed GPU offers MIG profile '1g.5gb'",
        ),
    ],
)
def test_invalid_placement_requests_are_typed_errors(kwargs, message):
    with pytest.raises((policy.RequestError, catalogue.CatalogueError), match=message):
        policy.Request(**kwargs)


def test_fixed_profile_is_honoured_and_warns_when_the_prediction_exceeds_it():
    request = policy.Request(policy=policy.PolicyName.FIXED, profile="1g.10gb")
    placed = policy.choose(prediction(upper_bytes=12 * GIB), build([H100_ALL]), request)
    assert placed.resource == "nvidia.com/mig-1g.10gb"
    assert "fixed by the DLJob" in placed.reason
    assert "out-of-memory failure is likely" in placed.reason


def test_fixed_profile_that_is_busy_still_places_and_says_the_pod_will_wait():
    inv = build([h100_mixed("n1", **{"2g_20gb": 1})], [pod("n1", {"nvidia.com/mig-2g.20gb": 1})])
    request = policy.Request(policy=policy.PolicyName.FIXED, profile="nvidia.com/mig-2g.20gb")
    placed = policy.choose(prediction(upper_bytes=GIB), inv, request)
    assert placed.profile == "2g.20gb" and placed.node_hint is None
    assert "will wait" in placed.reason


def test_fixed_profile_absent_from_the_cluster_is_no_fit():
    request = policy.Request(policy=policy.PolicyName.FIXED, profile="gpu")
    with pytest.raises(policy.NoFit, match="fixed profile 'gpu' is not offered"):
        policy.choose(prediction(upper_bytes=GIB), build([H100_ALL]), request)


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        ("1g.10gb", "1g.20gb"),  # 9.75 GiB failed: needs 14.63 GiB
        ("2g.20gb", "3g.40gb"),  # 19.63 GiB failed: needs 29.44 GiB
        ("3g.40gb", "7g.80gb"),  # 39.50 GiB failed: needs 59.25 GiB
    ],
)
def test_escalation_holds_at_least_one_and_a_half_times_the_memory_that_failed(start, expected):
    inv = build([H100_ALL])
    request = policy.Request(policy=policy.PolicyName.FIXED, profile=start)
    pred = shipped_prediction(upper_bytes=GIB)
    current = policy.choose(pred, inv, request)
    nxt = policy.escalate(current, inv, AUTO, pred).placement
    assert nxt.profile == expected
    assert nxt.usable_memory_bytes >= policy.ESCALATION_GROWTH * current.usable_memory_bytes
    assert "escalated after running out of memory" in nxt.reason


def test_escalation_on_the_issues_cluster_grows_clearly_every_time():
    # Issue 17: 1g.5gb (4.75) -> 1g.10gb (9.50) -> 2g.10gb (9.62, +1.3 %) -> exhausted, with
    # 2g.20gb, 3g.40gb and whole GPUs free.
    inv = build(devcluster_nodes())
    pred = shipped_prediction(upper_bytes=4 * GIB)
    current = policy.choose(pred, inv, AUTO)
    sizes = [current.usable_memory_bytes]
    for _ in range(3):
        current = policy.escalate(current, inv, AUTO, pred).placement
        sizes.append(current.usable_memory_bytes)
    assert all(b >= 1.5 * a for a, b in itertools.pairwise(sizes))
    assert [s / GIB for s in sizes] == [4.75, 9.5, 19.5, 39.25]


def test_escalation_takes_a_smaller_step_only_when_nothing_is_that_large():
    inv = build(
        [
            node("a", A100_80, {"nvidia.com/gpu": 1}),
            node("n", "NVIDIA-H100-NVL", {"nvidia.com/gpu": 1}),
        ]
    )
    pred = shipped_prediction(upper_bytes=70 * GIB)
    current = policy.choose(pred, inv, AUTO)
    assert current.gpu_product == "A100-80GB"
    nxt = policy.escalate(current, inv, AUTO, pred).placement
    # 93.58 GiB is 1.17x the 80 GiB that failed: less than 1.5x, at least 1.1x.
    assert nxt.gpu_product == "H100-NVL"
    with pytest.raises(policy.NoFit, match=r"holds clearly more than the 93\.58 GiB") as info:
        policy.escalate(nxt, inv, AUTO, pred)
    assert info.value.cause is policy.NoFitCause.NOTHING_FITS


def test_escalation_from_the_largest_slice_does_not_take_a_barely_larger_whole_gpu():
    inv = build([H100_ALL, node("whole", H100, {"nvidia.com/gpu": 1})])
    pred = shipped_prediction(upper_bytes=GIB)
    top = policy.choose(
        pred, inv, policy.Request(policy=policy.PolicyName.FIXED, profile="7g.80gb")
    )
    # The whole GPU's 79.65 GiB is 0.5 % more than 7g.80gb's 79.25 GiB: not worth an attempt.
    with pytest.raises(policy.NoFit, match=r"7g\.80gb on H100-80GB-SXM that ran out of memory"):
        policy.escalate(top, inv, AUTO, pred)


def test_escalation_to_a_busy_kind_waits_for_it_and_respects_whole_gpu_refusal():
    inv = build(
        [h100_mixed("n1", **{"1g_10gb": 1, "1g_20gb": 1, "3g_40gb": 1})],
        [pod("n1", {"nvidia.com/mig-1g.20gb": 1})],
    )
    pred = shipped_prediction(upper_bytes=GIB)
    request = policy.Request(policy=policy.PolicyName.FIXED, profile="1g.10gb")
    current = policy.choose(pred, inv, request)
    assert policy.escalate(current, inv, AUTO, pred).placement.profile == "3g.40gb"
    busy = build(
        [h100_mixed("n1", **{"1g_10gb": 1, "1g_20gb": 1})],
        [pod("n1", {"nvidia.com/mig-1g.20gb": 1})],
    )
    waits = policy.escalate(current, busy, AUTO, pred).placement
    assert waits.profile == "1g.20gb" and "wait" in waits.reason
    whole_only = build([node("w", H100, {"nvidia.com/gpu": 1}), h100_mixed("m", **{"1g_10gb": 1})])
    with pytest.raises(policy.NoFit):
        policy.escalate(current, whole_only, policy.Request(allow_whole_gpu=False), pred)
