"""Placement as the operator records it: status.plan, what a slowdown rests on, why nothing fits,
bursts and escalation, through the real reconcile, inventory and policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeseer.operator import dljob, journal, pods
from kubeseer.prediction import Mode, Precision, Prediction

NS = "ml"


class ShippedPredictor:
    """Answers as the shipped checkpoint does: CPU labels and the 100 % utilisation stand-in."""

    def __init__(self, world: Any) -> None:
        self.inner = world.predict_fn

    def cached(self, *args: Any, **kwargs: Any) -> Prediction | None:
        return None

    def predict(
        self,
        model: bytes | Path,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Any,
        attention: Any,
    ) -> Prediction:
        made = self.inner.predict(
            model, batch_size, mode, precision, inputs=inputs, attention=attention
        )
        return replace(
            made,
            sm_util_percent=replace(made.sm_util_percent, point=100.0, upper=100.0),
            label_device="AMD EPYC",
            unlearned=("sm_util_percent",),
        )


def shipped_world(make_world: Any) -> Any:
    world = make_world()
    world.reconciler.predictor.predictor = ShippedPredictor(world)
    return world


def test_every_placement_writes_the_plan_and_what_its_slowdown_rests_on(make_world: Any) -> None:
    world = make_world()  # utilisation 20 % learned on an A100-80GB
    world.reconcile(world.submit())
    status = world.cluster.status("resnet")
    placement, plan = status["placement"], status["plan"]
    assert placement["slowdownEvidence"] == "learned"
    assert placement["costRank"] == 1
    assert plan["needMiB"] == 4096 and plan["rungs"] >= 1
    (chosen,) = [r for r in plan["rows"] if r["chosen"]]
    assert chosen["resource"] == placement["resource"] == "nvidia.com/mig-1g.10gb"
    assert chosen["rank"] == 1 and chosen["note"].startswith("chosen")
    assert {r["slowdownEvidence"] for r in plan["rows"]} == {"learned", "derived"}


def test_the_shipped_checkpoints_stand_in_is_no_evidence_so_the_smallest_slice_is_chosen(
    make_world: Any,
) -> None:
    # Issue 17: the 100 % stand-in needed a compute share of 0.5 at maxSlowdown 2, so a small
    # job took a whole GPU.
    world = shipped_world(make_world)
    world.reconcile(world.submit())
    placement = world.cluster.status("resnet")["placement"]
    assert placement["resource"] == "nvidia.com/mig-1g.10gb"
    assert placement["predictedSlowdown"] is None
    assert placement["slowdownEvidence"] == "no evidence"
    assert world.cluster.status("resnet")["prediction"]["unlearned"] == ["sm_util_percent"]


def test_a_burst_of_dljobs_spreads_over_every_free_device_before_any_waits(
    make_world: Any,
) -> None:
    # 2 x 1g.10gb and a 3g.40gb on the A100-80GB, 2 whole H100s: five free devices.
    world = shipped_world(make_world)
    names = [f"job{i}" for i in range(7)]
    for name in names:
        world.reconcile(world.submit(name))
    placed = [world.cluster.status(n)["placement"] for n in names]
    started = [p["resource"] for p in placed if "waits for one" not in p["reason"]]
    assert sorted(started) == sorted(
        ["nvidia.com/mig-1g.10gb"] * 2 + ["nvidia.com/mig-3g.40gb"] + ["nvidia.com/gpu"] * 2
    )
    waiting = [p for p in placed if "waits for one" in p["reason"]]
    assert len(waiting) == 2


def test_why_nothing_fits_is_its_own_reason_and_the_plan_is_kept(make_world: Any) -> None:
    world = shipped_world(make_world)
    cases = {
        "absent": ({"placement": {"gpuProducts": ["H200-141GB"]}}, "GPUProductNotInCluster"),
        "selector": (
            {
                "template": {
                    "spec": {
                        "nodeSelector": {"disktype": "nvme"},
                        "containers": [{"name": "main", "image": "example.org/infer:1"}],
                    }
                }
            },
            "NoMatchingGPUNode",
        ),
        "replicas": ({"replicas": 1024}, "ReplicasExceedCapacity"),
        "huge": ({"placement": {"allowWholeGPU": False, "maxSlowdown": 2.0}}, "NoFit"),
    }
    world.predict_fn.table[b"resnet-bytes"] = (30.0, 45.0)  # only a whole GPU holds 45 GiB
    for name, (spec, reason) in cases.items():
        ref = world.submit(name, **spec)
        with pytest.raises(journal.DLJobFailedError, match=reason):
            world.reconcile(ref)
        status = world.cluster.status(name)
        assert status["phase"] == "Failed", name
        assert world.condition(name, dljob.ConditionType.PLACED)["reason"] == reason
        assert "plan" in status, name
    assert world.cluster.status("huge")["plan"]["rows"]
    assert not any(r["fits"] for r in world.cluster.status("huge")["plan"]["rows"])


def test_an_escalation_re_plans_for_one_and_a_half_times_the_memory_that_failed(
    make_world: Any,
) -> None:
    world = shipped_world(make_world)
    world.reconcile(world.submit())
    assert world.cluster.status("resnet")["placement"]["usableMemoryMiB"] == 9728
    world.reconciler.observe_workload(
        NS, "resnet", 0, pods.Verdict(pods.PodOutcome.OOM, "OOMKilled")
    )
    status = world.cluster.status("resnet")
    assert status["placement"]["resource"] == "nvidia.com/mig-3g.40gb"
    assert status["plan"]["needMiB"] == 14592  # 1.5 x 9728 MiB
    assert status["plan"]["needBasis"].startswith("1.5x the 9.50 GiB")
