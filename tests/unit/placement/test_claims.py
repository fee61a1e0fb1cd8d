from __future__ import annotations

import re

import pytest
from placement_cases import GIB, shipped_prediction

from kubeseer.placement import catalogue, claims, plan

H100 = catalogue.model_by_key("H100-80GB-SXM")
A100_40 = catalogue.model_by_key("A100-40GB")
PRODUCT = (
    "device.attributes['gpu.nvidia.com'].productName in "
    "['NVIDIA H100 80GB HBM3', 'NVIDIA H100-SXM5-80GB']"
)


def memory(op: str, quantity: str) -> str:
    return f"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{quantity}')) {op} 0"


def sms(limit: int) -> str:
    return f"device.capacity['gpu.nvidia.com'].multiprocessors.compareTo(quantity('{limit}')) <= 0"


def min_sms(limit: int) -> str:
    return f"device.capacity['gpu.nvidia.com'].multiprocessors.compareTo(quantity('{limit}')) >= 0"


def h100_plan(upper_gib: float) -> plan.Plan:
    return plan.build(
        shipped_prediction(upper_bytes=upper_gib * GIB),
        plan.from_catalogue([H100]),
        max_slowdown=2.0,
    )


def test_the_ladder_becomes_first_available_rungs_selected_by_product_and_usable_memory():
    template = claims.build_claim_template(h100_plan(18), "job-0", "ml", labels={"a": "b"})
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["metadata"] == {"name": "job-0", "namespace": "ml", "labels": {"a": "b"}}
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "gpu"
    rungs = request["firstAvailable"]
    assert [r["name"] for r in rungs] == [
        "r1-h100-80gb-sxm-1g-20gb",
        "r2-h100-80gb-sxm-2g-20gb",
        "r3-h100-80gb-sxm-3g-40gb",
        "r4-h100-80gb-sxm-4g-40gb",
        "r5-h100-80gb-sxm-7g-80gb",
        "r6-h100-80gb-sxm-whole",
    ]
    assert [r["deviceClassName"] for r in rungs] == ["mig.nvidia.com"] * 5 + ["gpu.nvidia.com"]
    assert all(r["allocationMode"] == "ExactCount" and r["count"] == 1 for r in rungs)
    need = memory(">=", "18432Mi")
    # 1g.20gb: at least the need, below the next MIG size (3g.40gb's 40448 MiB), 26 SMs: not
    # more (a costlier device) and not fewer (a slower one than the plan judged).
    assert [s["cel"]["expression"] for s in rungs[0]["selectors"]] == [
        PRODUCT,
        need,
        memory("<", "40448Mi"),
        sms(26),
        min_sms(26),
    ]
    assert [s["cel"]["expression"] for s in rungs[1]["selectors"]][3:] == [sms(32), min_sms(32)]
    # 7g.80gb is the largest MIG size: no memory ceiling.
    assert [s["cel"]["expression"] for s in rungs[4]["selectors"]] == [
        PRODUCT,
        need,
        sms(132),
        min_sms(132),
    ]
    assert [s["cel"]["expression"] for s in rungs[5]["selectors"]] == [PRODUCT, need]
    for rung in rungs:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rung["name"])
        assert "profile" not in str(rung["selectors"])


def test_the_need_is_rounded_up_to_a_whole_mebibyte():
    template = claims.build_claim_template(h100_plan(0.5 + 1 / 3 / 1024), "j", "ns")
    first = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    assert first["selectors"][1]["cel"]["expression"] == memory(">=", "513Mi")


def test_at_most_eight_rungs_are_kept_cheapest_first():
    many = plan.build(
        shipped_prediction(upper_bytes=GIB), plan.from_catalogue(catalogue.MODELS), max_slowdown=2
    )
    assert len(many.ladder) > claims.MAX_RUNGS
    rungs = claims.build_claim_template(many, "j", "ns")["spec"]["spec"]["devices"]["requests"][0][
        "firstAvailable"
    ]
    assert len(rungs) == claims.MAX_RUNGS
    assert [r["name"].split("-", 1)[0] for r in rungs] == [f"r{i}" for i in range(1, 9)]


def test_two_labels_of_one_gpu_model_give_one_rung():
    a = plan.Candidate(
        gpu=A100_40,
        product_label="NVIDIA-A100-SXM4-40GB",
        profile=A100_40.whole,
        usable_memory_bytes=A100_40.whole.usable_memory_bytes,
        compute_share=1.0,
    )
    b = plan.Candidate(**{**a.__dict__, "product_label": "NVIDIA-A100-PCIE-40GB"})
    two = plan.build(shipped_prediction(upper_bytes=GIB), [a, b], max_slowdown=2.0)
    assert len(two.ladder) == 2
    rungs = claims.build_claim_template(two, "j", "ns")["spec"]["spec"]["devices"]["requests"][0][
        "firstAvailable"
    ]
    assert len(rungs) == 1


def test_a_plan_without_a_fitting_rung_has_no_claim():
    with pytest.raises(ValueError, match="nothing to claim"):
        claims.build_claim_template(h100_plan(200), "j", "ns")
