from __future__ import annotations

import pytest
from placement_cases import GIB, MIB, a100_40_mixed, build, node, pod, prediction

from kubeseer.placement import catalogue, policy

AUTO = policy.Request()
H100 = "NVIDIA-H100-80GB-HBM3"
A100_80 = "NVIDIA-A100-SXM4-80GB"


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
    assert info.value.transient is False


@pytest.mark.parametrize(
    ("upper", "sm_util", "max_slowdown", "expected"),
    [
        # Memory alone: smallest usable memory that holds the upper bound.
        (5 * GIB, 5, 2.0, "1g.10gb"),
        (9.75 * GIB, 5, 2.0, "1g.10gb"),  # exactly the usable memory: fits
        (9.75 * GIB + 1, 5, 2.0, "1g.20gb"),  # one byte more: the next size
        (20 * GIB, 5, 2.0, "3g.40gb"),
        # Compute: 1g.10gb has 16/132 = 0.121 of the SMs.
        (5 * GIB, 24, 2.0, "1g.10gb"),  # needs 0.12 -> 1g still within 2x
        (5 * GIB, 25, 2.0, "1g.20gb"),  # needs 0.125 -> 1g.20gb (26 SMs, 0.197)
        (5 * GIB, 45, 2.0, "2g.20gb"),  # needs 0.225 -> 2g (32 SMs, 0.242)
        (5 * GIB, 90, 2.0, "3g.40gb"),  # needs 0.45 -> 3g (60 SMs, 0.455)
        (5 * GIB, 100, 2.0, "7g.80gb"),  # needs 0.5 -> 3g (0.455) and 4g (0.485) are too slow
        (5 * GIB, 100, 1.0, "7g.80gb"),  # no slowdown allowed at full use: the 7g slice (all SMs)
        (79.25 * GIB, 5, 2.0, "7g.80gb"),
    ],
)
def test_auto_picks_the_smallest_free_profile_within_memory_and_slowdown(
    upper, sm_util, max_slowdown, expected
):
    pred = prediction(upper_bytes=upper, sm_util=sm_util)
    placed = policy.choose(pred, build([H100_ALL]), policy.Request(max_slowdown=max_slowdown))
    assert placed.profile == expected
    assert placed.predicted_slowdown <= max_slowdown
    assert placed.gpu_product == "H100-80GB-SXM"


def test_slowdown_model_is_sm_demand_over_compute_share_never_below_one():
    assert policy.slowdown(0.5, 25) == 1.0
    assert policy.slowdown(0.25, 50) == pytest.approx(2.0)
    assert policy.slowdown(0.1, 150) == pytest.approx(10.0)  # utilisation clamps at 100 %
    assert policy.required_compute_share(60, 2.0) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        policy.slowdown(0.0, 10)


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
    assert "no free MIG profile holds it" in whole.reason


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


def test_nothing_free_but_something_would_fit_is_a_transient_no_fit():
    full = h100_mixed("busy", **{"2g_20gb": 3})
    inv = build([full], [pod("busy", {"nvidia.com/mig-2g.20gb": 3})])
    with pytest.raises(policy.NoFit, match="would fit but none is free now") as info:
        policy.choose(prediction(upper_bytes=10 * GIB), inv, AUTO)
    assert info.value.transient is True
    assert info.value.largest_free is None


def test_too_big_for_everything_names_the_need_and_the_largest_free_thing():
    inv = build([a100_40_mixed(), node("h100", H100, {"nvidia.com/mig-3g.40gb": 2})])
    with pytest.raises(policy.NoFit) as info:
        policy.choose(prediction(upper_bytes=200 * GIB), inv, AUTO)
    message = str(info.value)
    assert "predicted need 200.00 GiB (upper bound at 95% coverage)" in message
    # H100's 3g.40gb (39.50 GiB) is larger than A100-40GB's 7g.40gb (39.25 GiB).
    assert "largest free: nvidia.com/mig-3g.40gb on H100-80GB-SXM (39.50 GiB usable)" in message
    assert info.value.transient is False
    assert info.value.needed_bytes == 200 * GIB


def test_empty_cluster_no_fit_says_no_gpu_is_free_and_lists_skipped_nodes():
    inv = build([node("t4", "Tesla-T4", {"nvidia.com/gpu": 1})])
    with pytest.raises(policy.NoFit, match=r"no GPU is free; skipped nodes: t4 \(unknown GPU"):
        policy.choose(prediction(upper_bytes=GIB), inv, AUTO)


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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": policy.PolicyName.FIXED}, "needs a profile"),
        ({"profile": "1g.10gb"}, "only used with policy 'fixed'"),
        ({"max_slowdown": 0.5}, "maxSlowdown must be a finite number >= 1"),
        ({"max_slowdown": float("inf")}, "maxSlowdown"),
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
        ("1g.10gb", "1g.20gb"),  # more memory, more SMs (26 vs 16)
        ("2g.20gb", "3g.40gb"),  # 1g.20gb has as much memory and fewer SMs: skipped
        ("3g.40gb", "7g.80gb"),  # 4g.40gb has the same memory: not larger
    ],
)
def test_escalation_moves_to_the_next_larger_profile_without_losing_compute(start, expected):
    inv = build([H100_ALL])
    request = policy.Request(policy=policy.PolicyName.FIXED, profile=start)
    current = policy.choose(prediction(upper_bytes=GIB), inv, request)
    nxt = policy.escalate(current, inv, AUTO)
    assert nxt.profile == expected
    assert nxt.usable_memory_bytes > current.usable_memory_bytes
    assert "escalated after running out of memory" in nxt.reason


def test_escalation_from_the_largest_slice_goes_to_a_whole_gpu_then_gives_up():
    inv = build([H100_ALL, node("whole", H100, {"nvidia.com/gpu": 1})])
    top = policy.choose(
        prediction(upper_bytes=GIB),
        inv,
        policy.Request(policy=policy.PolicyName.FIXED, profile="7g.80gb"),
    )
    whole = policy.escalate(top, inv, AUTO)
    assert (whole.resource, whole.usable_memory_bytes) == ("nvidia.com/gpu", 81559 * MIB)
    with pytest.raises(policy.NoFit, match=r"no larger GPU than nvidia\.com/gpu") as info:
        policy.escalate(whole, inv, AUTO)
    assert info.value.transient is False
    with pytest.raises(policy.NoFit):
        policy.escalate(top, inv, policy.Request(allow_whole_gpu=False))


def test_escalation_skips_busy_profiles_and_says_when_waiting_would_help():
    inv = build(
        [h100_mixed("n1", **{"1g_10gb": 1, "1g_20gb": 1, "3g_40gb": 1})],
        [pod("n1", {"nvidia.com/mig-1g.20gb": 1})],
    )
    request = policy.Request(policy=policy.PolicyName.FIXED, profile="1g.10gb")
    current = policy.choose(prediction(upper_bytes=GIB), inv, request)
    assert policy.escalate(current, inv, AUTO).profile == "3g.40gb"
    busy = build(
        [h100_mixed("n1", **{"1g_10gb": 1, "1g_20gb": 1})],
        [pod("n1", {"nvidia.com/mig-1g.20gb": 1})],
    )
    with pytest.raises(policy.NoFit) as info:
        policy.escalate(current, busy, AUTO)
    assert info.value.transient is True
