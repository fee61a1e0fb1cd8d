"""The watch-fed cache: what each node holds as pods come, go and finish; assumed decisions."""

from __future__ import annotations

import copy

from extender_fixtures import gpu_pod, node_objects

from kubeseer.extender import cache, nodes, pods

GPU = "nvidia.com/gpu"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def filled(clock: Clock | None = None) -> cache.ClusterCache:
    state = cache.ClusterCache(assume_ttl_s=30.0, clock=clock or Clock())
    state.replace_nodes(node_objects().values())
    return state


def used(state: cache.ClusterCache, node: str, *, with_assumed: bool = False) -> dict[str, int]:
    ((_, situation),), _ = state.candidates([node], with_assumed=with_assumed)
    return dict(situation.used)


def test_bound_pods_hold_their_units_on_their_node():
    state = filled()
    state.replace_pods([gpu_pod("a", node="h100-whole"), gpu_pod("b", node="h100-whole", units=1)])
    assert used(state, "h100-whole") == {GPU: 2}
    assert used(state, "a100-1g") == {}
    assert state.counts() == (6, 2)


def test_unknown_names_come_back_as_missing():
    found, missing = filled().candidates(["a100-1g", "ghost"], with_assumed=False)
    assert [name for name, _ in found] == ["a100-1g"]
    assert missing == ["ghost"]


def test_a_pod_that_finishes_or_is_deleted_releases_its_units():
    state = filled()
    state.apply_pod("ADDED", gpu_pod("a", node="h100-whole"))
    state.apply_pod("ADDED", gpu_pod("b", node="h100-whole"))
    state.apply_pod("MODIFIED", gpu_pod("a", node="h100-whole", phase="Succeeded"))
    assert used(state, "h100-whole") == {GPU: 1}
    state.apply_pod("DELETED", gpu_pod("b", node="h100-whole", phase="Running"))
    assert used(state, "h100-whole") == {}
    assert state.counts()[1] == 0


def test_a_repeated_event_does_not_count_twice():
    state = filled()
    for _ in range(3):
        state.apply_pod("MODIFIED", gpu_pod("a", node="a100-3g", phase="Running"))
    assert used(state, "a100-3g") == {GPU: 1}


def test_pods_without_gpus_or_without_a_node_hold_nothing():
    state = filled()
    cpu_only = gpu_pod("cpu", node="cpu-0")
    cpu_only["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    state.replace_pods([cpu_only, gpu_pod("pending")])
    assert state.counts()[1] == 0


def test_a_fresh_list_replaces_everything():
    state = filled()
    state.apply_pod("ADDED", gpu_pod("a", node="h100-whole"))
    state.replace_pods([gpu_pod("b", node="a100-3g")])
    assert used(state, "h100-whole") == {}
    assert used(state, "a100-3g") == {GPU: 1}


def test_a_node_event_updates_and_a_delete_forgets():
    state = filled()
    node = copy.deepcopy(node_objects()["h100-whole"])
    node["status"]["allocatable"][GPU] = "1"
    state.apply_node("MODIFIED", node)
    ((_, situation),), _ = state.candidates(["h100-whole"], with_assumed=False)
    assert situation.devices[GPU].allocatable == 1
    state.apply_node("DELETED", node)
    assert state.candidates(["h100-whole"], with_assumed=False) == ([], ["h100-whole"])


def test_an_assumed_pod_counts_for_scoring_only_until_the_watch_sees_it():
    clock = Clock()
    state = filled(clock)
    pod = gpu_pod("a")
    state.assume(pods.read(pod), "h100-whole")
    assert used(state, "h100-whole") == {}, "the filter never counts assumptions"
    assert used(state, "h100-whole", with_assumed=True) == {GPU: 1}
    state.apply_pod("ADDED", gpu_pod("a", node="h100-whole"))
    assert used(state, "h100-whole", with_assumed=True) == {GPU: 1}, "not twice"


def test_an_assumption_the_watch_never_confirms_expires():
    clock = Clock()
    state = filled(clock)
    state.assume(pods.read(gpu_pod("a")), "h100-whole")
    clock.now = 29.0
    assert used(state, "h100-whole", with_assumed=True) == {GPU: 1}
    clock.now = 30.0
    assert used(state, "h100-whole", with_assumed=True) == {}


def test_a_pod_bound_elsewhere_drops_its_assumption():
    state = filled()
    state.assume(pods.read(gpu_pod("a")), "h100-whole")
    state.apply_pod("ADDED", gpu_pod("a", node="a100-3g"))
    assert used(state, "h100-whole", with_assumed=True) == {}
    assert used(state, "a100-3g", with_assumed=True) == {GPU: 1}


def test_a_malformed_pod_from_the_watch_is_skipped():
    state = filled()
    bad = gpu_pod("a", node="h100-whole")
    bad["spec"]["containers"][0]["resources"]["limits"][GPU] = "half"
    bad["spec"]["containers"][0]["resources"]["requests"][GPU] = "half"
    state.apply_pod("ADDED", bad)
    assert state.counts()[1] == 0


def test_nodes_in_the_same_situation_share_one_object():
    """A call decides once per situation: two idle nodes of one kind are one situation, and
    stop being one as soon as a pod holds a unit of one of them."""
    state = filled()
    (_, a), (_, b) = state.candidates(["a100-mixed-a", "a100-mixed-b"], with_assumed=False)[0]
    assert a is b
    state.apply_pod("ADDED", gpu_pod("a", resource="nvidia.com/mig-1g.10gb", node="a100-mixed-b"))
    (_, a), (_, b) = state.candidates(["a100-mixed-a", "a100-mixed-b"], with_assumed=False)[0]
    assert a is not b
    assert dict(b.used) == {"nvidia.com/mig-1g.10gb": 1}
    state.apply_pod("DELETED", gpu_pod("a", resource="nvidia.com/mig-1g.10gb", node="a100-mixed-b"))
    (_, a), (_, b) = state.candidates(["a100-mixed-a", "a100-mixed-b"], with_assumed=False)[0]
    assert a is b


def test_a_heartbeat_that_changes_nothing_read_is_not_read_again(monkeypatch):
    """A thousand KWOK nodes send about 45 status heartbeats a second; reading each node again
    would compete with the scheduler's calls for the interpreter."""
    state = filled()
    reads = []
    real = nodes.from_node
    monkeypatch.setattr(nodes, "from_node", lambda obj: reads.append(1) or real(obj))
    node = copy.deepcopy(node_objects()["h100-whole"])
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "x"}]
    state.apply_node("MODIFIED", node)
    assert reads == []
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "40000"
    state.apply_node("MODIFIED", node)
    assert reads == [1]
    ((_, relabelled),), _ = state.candidates(["h100-whole"], with_assumed=False)
    assert relabelled.devices[GPU].memory_bytes == 40000 << 20
