"""Filter and prioritize as pure functions: reasons a user reads, best fit, deterministic scores."""

from __future__ import annotations

import pytest
from extender_fixtures import GIB, gpu_pod, node_objects

from kubeseer.extender import decide, nodes, pods
from kubeseer.operator import workload

NODES = {name: nodes.from_node(obj) for name, obj in node_objects().items()}


def candidate(name: str, **used: int) -> decide.Candidate:
    """A fixture node with `used` units held (keyword `gpu` for nvidia.com/gpu, `mig_2g_20gb`
    for nvidia.com/mig-2g.20gb)."""
    held = {_resource(k): v for k, v in used.items()}
    return decide.Candidate(name, decide.situation(NODES[name], held))


def _resource(key: str) -> str:
    if key == "gpu":
        return "nvidia.com/gpu"
    return "nvidia.com/mig-" + key.removeprefix("mig_").replace("_", ".", 1).replace("_", "")


def demand(**kwargs) -> pods.Demand:
    return pods.read(gpu_pod(**kwargs))


def test_resource_helper_names_mig_resources():
    assert _resource("mig_2g_20gb") == "nvidia.com/mig-2g.20gb"


def test_a_device_that_holds_the_prediction_passes():
    assert decide.judge(demand(predicted=9 * GIB), candidate("a100-1g")) == []


def test_a_slice_below_the_prediction_fails_naming_the_gfd_label_and_both_figures():
    (rejection,) = decide.judge(demand(predicted=12 * GIB), candidate("a100-1g"))
    assert rejection.reason is decide.Reason.MEMORY_BELOW_PREDICTION
    assert rejection.unresolvable
    assert rejection.message == (
        "kubeseer: one nvidia.com/gpu (1g.10gb on A100-80GB) holds 9.50 GiB "
        "(nvidia.com/gpu.memory), less than the predicted peak 12.00 GiB "
        f"({workload.ANNOTATION_PREDICTED_MEMORY})"
    )


def test_memory_is_the_label_value_not_the_profile_name():
    # 1g.10gb is named 10 GB; the label says 9728 MiB (9.5 GiB), so 9.6 GiB does not fit.
    (rejection,) = decide.judge(demand(predicted=int(9.6 * GIB)), candidate("a100-1g"))
    assert rejection.reason is decide.Reason.MEMORY_BELOW_PREDICTION


def test_mixed_strategy_reads_the_profile_memory_label():
    pod = demand(resource="nvidia.com/mig-2g.20gb", predicted=20 * GIB)
    (rejection,) = decide.judge(pod, candidate("a100-mixed-a"))
    assert "(nvidia.com/mig-2g.20gb.memory)" in rejection.message
    assert "holds 19.50 GiB" in rejection.message


def test_a_full_node_fails_with_a_resolvable_reason():
    (rejection,) = decide.judge(demand(), candidate("h100-whole", gpu=2))
    assert rejection.reason is decide.Reason.NO_FREE_CAPACITY
    assert not rejection.unresolvable
    assert rejection.message == "kubeseer: 0 of 2 nvidia.com/gpu free, the pod needs 1"


def test_a_product_outside_the_allowed_list_fails():
    pod = demand(annotations={pods.ANNOTATION_GPU_PRODUCTS: "H100-80GB-SXM"})
    assert pod.allowed_models == ("H100-80GB-SXM",)
    (rejection,) = decide.judge(pod, candidate("a100-3g"))
    assert rejection.reason is decide.Reason.PRODUCT_NOT_ALLOWED
    assert rejection.message == (
        "kubeseer: GPU product A100-80GB is not among the allowed products (H100-80GB-SXM)"
    )
    assert decide.judge(pod, candidate("h100-whole")) == []


def test_every_reason_is_reported_together():
    pod = demand(predicted=50 * GIB, annotations={pods.ANNOTATION_GPU_PRODUCTS: "H100-NVL"})
    reasons = {r.reason for r in decide.judge(pod, candidate("a100-3g", gpu=4))}
    assert reasons == {
        decide.Reason.PRODUCT_NOT_ALLOWED,
        decide.Reason.MEMORY_BELOW_PREDICTION,
        decide.Reason.NO_FREE_CAPACITY,
    }


def test_a_node_whose_gpus_cannot_be_read_fails_unresolvably():
    broken = nodes.NodeGpus(name="odd", devices={}, problem="unknown GPU product 'Tesla-K80'")
    (rejection,) = decide.judge(demand(), decide.Candidate("odd", decide.situation(broken, {})))
    assert rejection.reason is decide.Reason.NO_GPU_INFO
    assert rejection.unresolvable
    assert "Tesla-K80" in rejection.message


def test_messages_never_name_the_node_so_the_scheduler_can_count_them():
    pod = demand(predicted=90 * GIB, annotations={pods.ANNOTATION_GPU_PRODUCTS: "H100-NVL"})
    seen = 0
    for name in NODES:
        for rejection in decide.judge(pod, candidate(name, gpu=2)):
            assert name not in rejection.message
            seen += 1
    assert seen >= 8


def test_best_fit_prefers_the_smallest_device_that_holds_the_job():
    names = ["h100-whole", "a100-3g", "a100-1g"]
    small = dict(decide.scores(demand(predicted=8 * GIB), [candidate(n) for n in names]))
    assert small["a100-1g"] == 10
    assert small["a100-3g"] > small["h100-whole"]
    medium = dict(decide.scores(demand(predicted=30 * GIB), [candidate(n) for n in names]))
    assert medium == {"a100-3g": 10, "h100-whole": 5, "a100-1g": 0}


def test_a_kubeseer_pod_without_a_prediction_still_gets_the_smallest_device():
    pod = demand(predicted=None, annotations={pods.ANNOTATION_GPU_PRODUCTS: "A100-80GB"})
    assert pod.kubeseer and pod.predicted_memory_bytes is None
    cands = [candidate("a100-3g"), candidate("a100-1g")]
    assert dict(decide.scores(pod, cands)) == {"a100-3g": 5, "a100-1g": 10}


def test_identical_nodes_consolidate_on_the_fuller_one():
    pod = demand(resource="nvidia.com/mig-1g.10gb", predicted=8 * GIB)
    scored = dict(
        decide.scores(pod, [candidate("a100-mixed-a"), candidate("a100-mixed-b", mig_2g_20gb=1)])
    )
    assert scored == {"a100-mixed-a": 5, "a100-mixed-b": 10}


def test_equal_costs_are_broken_by_node_name_every_time():
    pod = demand(resource="nvidia.com/mig-1g.10gb", predicted=8 * GIB)
    forward = decide.scores(pod, [candidate("a100-mixed-a"), candidate("a100-mixed-b")])
    backward = decide.scores(pod, [candidate("a100-mixed-b"), candidate("a100-mixed-a")])
    assert dict(forward) == dict(backward) == {"a100-mixed-a": 10, "a100-mixed-b": 9}
    assert [n for n, _ in backward] == ["a100-mixed-b", "a100-mixed-a"], "answer in input order"


def test_exactly_one_node_gets_the_top_score():
    pod = demand(resource="nvidia.com/mig-1g.10gb", predicted=1 * GIB)
    many = [candidate("a100-mixed-a"), candidate("a100-mixed-b")] * 3
    top = [n for n, s in decide.scores(pod, many) if s == 10]
    assert set(top) == {"a100-mixed-a"}


def test_a_node_that_fails_the_filter_scores_zero():
    scored = dict(decide.scores(demand(predicted=30 * GIB), [candidate("a100-1g")]))
    assert scored == {"a100-1g": 0}


def test_multi_unit_requests_keep_the_emptier_node_whole():
    pod = demand(units=2, predicted=60 * GIB)
    h100 = candidate("h100-whole")
    assert decide.cost(pod, h100)[2] == 0, "both GPUs taken, nothing left free"


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [(5 * GIB, "a100-1g"), (20 * GIB, "a100-3g"), (41 * GIB, "h100-whole")],
)
def test_the_winner_is_the_tightest_fit(predicted, expected):
    names = ["a100-1g", "a100-3g", "h100-whole"]
    scored = decide.scores(demand(predicted=predicted), [candidate(n) for n in names])
    assert [n for n, s in scored if s == 10] == [expected]


def test_scores_descend_with_cost_groups():
    pod = demand(predicted=1 * GIB)
    cands = [candidate(n) for n in ("h100-whole", "a100-3g", "a100-1g", "cpu-0")]
    assert dict(decide.scores(pod, cands)) == {
        "a100-1g": 10,
        "a100-3g": 6,
        "h100-whole": 3,
        "cpu-0": 0,
    }
