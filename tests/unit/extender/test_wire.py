"""The extender protocol's JSON, pinned both ways.

Requests: bodies the real kube-scheduler v1.37.2 sent (recorded by
tests/e2e/test_extender_contract.py into fixtures/*-request.json). Answers: exact bytes, with
the Go field names of `k8s.io/kube-scheduler/extender/v1`. Any change here is an API change.
"""

from __future__ import annotations

import json

import pytest
from extender_fixtures import FIXTURES

from kubeseer.extender import wire

FILTER_REQUEST = (FIXTURES / "filter-request.json").read_bytes()
PRIORITIZE_REQUEST = (FIXTURES / "prioritize-request.json").read_bytes()


@pytest.mark.parametrize("body", [FILTER_REQUEST, PRIORITIZE_REQUEST], ids=["filter", "prioritize"])
def test_reads_what_the_real_scheduler_sends(body: bytes):
    args = wire.parse_args(body)
    assert args["Nodes"] is None, "the stanza is nodeCacheCapable: names only"
    assert sorted(wire.candidate_names(args)) == ["a100-1g", "a100-3g", "h100-whole"]
    pod = args["Pod"]
    assert pod["metadata"]["name"] == "train-resnet50-0"
    assert pod["spec"]["schedulerName"] == "kubeseer-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}


def test_the_recorded_request_uses_exactly_the_go_field_names_in_struct_order():
    assert list(json.loads(FILTER_REQUEST)) == ["Pod", "Nodes", "NodeNames"]
    assert FILTER_REQUEST.startswith(b'{"Pod":{"metadata":{')


def test_filter_answer_by_names_is_pinned():
    args = wire.parse_args(FILTER_REQUEST)
    answer = wire.filter_result(
        args,
        ["a100-1g"],
        {"h100-whole": "kubeseer: 0 of 2 nvidia.com/gpu free, the pod needs 1"},
        {"a100-3g": "kubeseer: GPU product A100-80GB is not among the allowed products (H100-NVL)"},
    )
    assert wire.encode(answer) == (
        b'{"Nodes":null,"NodeNames":["a100-1g"],'
        b'"FailedNodes":{"h100-whole":"kubeseer: 0 of 2 nvidia.com/gpu free, the pod needs 1"},'
        b'"FailedAndUnresolvableNodes":{"a100-3g":"kubeseer: GPU product A100-80GB is not among '
        b'the allowed products (H100-NVL)"},"Error":""}'
    )


def test_no_passing_node_is_an_empty_list_never_null():
    answer = wire.filter_result(wire.parse_args(FILTER_REQUEST), [], {}, {})
    assert json.loads(wire.encode(answer))["NodeNames"] == []


def test_filter_answer_with_full_nodes_echoes_the_objects_that_pass():
    nodes = [
        {"metadata": {"name": n}, "status": {"capacity": {"nvidia.com/gpu": "2"}}} for n in "ab"
    ]
    body = json.dumps(
        {"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": nodes}, "NodeNames": None}
    )
    args = wire.parse_args(body.encode())
    assert wire.candidate_names(args) == ["a", "b"]
    answer = wire.filter_result(args, ["b"], {"a": "full"}, {})
    assert json.loads(wire.encode(answer)) == {
        "Nodes": {"items": [nodes[1]]},
        "NodeNames": None,
        "FailedNodes": {"a": "full"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_error_answer_is_pinned():
    assert wire.encode(wire.error_filter_result("caches not synced")) == (
        b'{"Nodes":null,"NodeNames":null,"FailedNodes":{},"FailedAndUnresolvableNodes":{},'
        b'"Error":"caches not synced"}'
    )


def test_priority_list_is_pinned_and_clamped():
    answer = wire.host_priorities([("a100-1g", 10), ("a100-3g", 12.6), ("h100-whole", -3)])
    assert wire.encode(answer) == (
        b'[{"Host":"a100-1g","Score":10},{"Host":"a100-3g","Score":10},'
        b'{"Host":"h100-whole","Score":0}]'
    )


@pytest.mark.parametrize(
    ("score", "clamped"), [(-1, 0), (0, 0), (4.4, 4), (4.6, 5), (10, 10), (11, 10)]
)
def test_scores_are_clamped_to_the_extender_range(score, clamped):
    assert wire.clamp_score(score) == clamped
    assert wire.MIN_EXTENDER_PRIORITY == 0 and wire.MAX_EXTENDER_PRIORITY == 10


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"NodeNames": ["a"]}', "Pod must be a v1.Pod"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": ["a"]}', "Pod.spec"),
        (b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": "a"}', "list of node names"),
        (b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": [1]}', "list of node names"),
        (b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [{}]}}', "are named"),
        (b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": []}', "NodeList"),
        (b'{"Pod": {"metadata": {}, "spec": {}}}', "exactly one of NodeNames and Nodes"),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": [], "Nodes": {"items": []}}',
            "exactly one",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(body, message):
    with pytest.raises(wire.WireError, match=message):
        wire.parse_args(body)
