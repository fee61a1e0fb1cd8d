"""Devices and GPU processes -> the node's DLJob pods (cgroups, DRA claims, ownership)."""

from kubeseer.profiler import attribution, cgroup, nvml

GIB = 1 << 30
GPU = "GPU-5f1e1c3e-8a57-4f52-9a1b-0c6a8b2d3e4f"
PARENT = "GPU-0e8d2a3b-6c4f-4b1a-8e2d-9f7c6b5a4d3e"
MIG = "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"
WHOLE = nvml.GpuDevice(
    GPU, GPU, 0, "NVIDIA H100 80GB HBM3", None, None, 80 * GIB, nvml.SmSource.GPM
)
SLICE = nvml.GpuDevice(
    MIG, PARENT, 1, "NVIDIA A100-SXM4-80GB", "1g.10gb", 9, 9856 << 20, nvml.SmSource.UNAVAILABLE
)
CID = "8c1c2f6a0b5e3d7f9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b"


def pod(
    name, uid, *, dljob="resnet", attempt=0, owner=None, phase="Running", claims=(), labels=None
):
    owner = owner or {"apiVersion": "kubeseer.io/v1alpha1", "kind": "DLJob", "name": dljob}
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "labels": labels
            if labels is not None
            else {"kubeseer.io/dljob": dljob, "kubeseer.io/attempt": str(attempt)},
            "ownerReferences": [{**owner, "uid": "u", "controller": True}],
        },
        "spec": {"containers": [{"name": "train", "image": "x"}]},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "train", "containerID": f"containerd://{CID}"}],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": c} for c in claims],
        },
    }


def test_a_dljob_pod_is_read_with_its_attempt_containers_and_claims():
    info = attribution.pod_info(pod("resnet-1", "p1", attempt=1, claims=("resnet-1-gpu-x7k2p",)))
    assert (info.dljob, info.attempt, info.phase) == ("resnet", 1, "Running")
    assert info.containers == {CID: "train"}
    assert info.claims == ("resnet-1-gpu-x7k2p",)


def test_a_job_pod_of_the_dljob_attempt_counts_as_owned():
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "resnet-2"}
    assert (
        attribution.pod_info(pod("resnet-2-abcde", "p", attempt=2, owner=owner)).dljob == "resnet"
    )


def test_a_pod_that_only_copies_the_label_is_not_a_dljob_pod():
    stranger = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d4f"}
    assert attribution.pod_info(pod("web-5d4f-x", "p", owner=stranger)).dljob is None
    other_job = {"apiVersion": "batch/v1", "kind": "Job", "name": "someone-else"}
    assert attribution.pod_info(pod("x", "p", owner=other_job)).dljob is None


def sample(device, processes, used=None, sm=None):
    return nvml.DeviceSample(device, used, processes, sm)


def test_process_memory_is_summed_per_pod_and_sm_activity_goes_to_a_sole_holder():
    pods = {"p1": attribution.pod_info(pod("resnet-0", "p1"))}
    refs = {10: cgroup.ContainerRef("p1", CID), 11: cgroup.ContainerRef("p1", CID)}
    found = attribution.attribute(
        [
            sample(
                WHOLE, (nvml.ProcessUsage(10, GIB), nvml.ProcessUsage(11, 2 * GIB)), 4 * GIB, 55.0
            )
        ],
        pods,
        refs.get,
        {},
    )
    (reading,) = found.readings
    assert reading.memory_bytes == 3 * GIB
    assert reading.memory_source is attribution.Source.PROCESSES
    assert (reading.sm_percent, reading.sm_source) == (55.0, "gpm-sm-activity")
    assert reading.processes == 2
    assert found.unattributed_processes == 0


def test_a_shared_device_gives_each_pod_its_processes_and_nobody_its_sm_activity():
    pods = {
        "p1": attribution.pod_info(pod("resnet-0", "p1")),
        "p2": attribution.pod_info(pod("web", "p2", labels={})),
    }
    refs = {10: cgroup.ContainerRef("p1", CID), 20: cgroup.ContainerRef("p2", None)}
    found = attribution.attribute(
        [
            sample(
                WHOLE, (nvml.ProcessUsage(10, GIB), nvml.ProcessUsage(20, 5 * GIB)), 6 * GIB, 90.0
            )
        ],
        pods,
        refs.get,
        {},
    )
    (reading,) = found.readings  # only the DLJob pod is reported
    assert reading.memory_bytes == GIB
    assert (reading.sm_percent, reading.sm_source) == (None, attribution.SHARED)


def test_processes_of_no_known_pod_are_counted_apart():
    found = attribution.attribute(
        [sample(WHOLE, (nvml.ProcessUsage(1, GIB),), GIB)], {}, lambda _pid: None, {}
    )
    assert found.readings == ()
    assert found.unattributed_processes == 1


def slice_for(node="node-a"):
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-8xq2v"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": GPU},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                },
                {
                    "name": "gpu-1-mig-9-0-1",
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": MIG},
                        "parentUUID": {"string": PARENT},
                        "profile": {"string": "1g.10gb"},
                    },
                    "capacity": {"memory": {"value": "9856Mi"}},
                },
            ],
        },
    }


def claim(name, device):
    return {
        "metadata": {"name": name, "namespace": "team-a"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "node-a",
                            "device": device,
                        }
                    ]
                }
            }
        },
    }


def test_a_dra_claim_gives_its_pod_the_device_before_any_process_runs():
    info = attribution.pod_info(pod("resnet-0", "p1", claims=("resnet-0-gpu-x7k2p",)))
    owners = attribution.claimed_devices(
        [info],
        {("team-a", "resnet-0-gpu-x7k2p"): claim("resnet-0-gpu-x7k2p", "gpu-1-mig-9-0-1")},
        [slice_for()],
        [WHOLE, SLICE],
    )
    assert owners == {MIG: ["p1"]}
    # NVML cannot list the processes: the device's own used memory stands in for its only holder.
    found = attribution.attribute(
        [sample(SLICE, None, used=3 * GIB)], {"p1": info}, lambda _pid: None, owners
    )
    (reading,) = found.readings
    assert (reading.memory_bytes, reading.memory_source) == (3 * GIB, attribution.Source.DEVICE)
    assert reading.sm_source == "unavailable"


def test_a_v1beta1_slice_with_basic_devices_and_qualified_attributes_is_read():
    legacy = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-a"},
            "devices": [
                {"name": "gpu-0", "basic": {"attributes": {"gpu.nvidia.com/uuid": {"string": GPU}}}}
            ],
        }
    }
    assert attribution.slice_device_uuids([legacy]) == {("gpu.nvidia.com", "node-a", "gpu-0"): GPU}


def test_a_legacy_mig_identifier_is_matched_by_gpu_uuid_and_instance_id():
    assert attribution.match_device(f"MIG-{PARENT}/9/0", [WHOLE, SLICE]) is SLICE
    assert attribution.match_device(f"MIG-{PARENT}/3/0", [WHOLE, SLICE]) is None
    assert attribution.match_device(GPU, [WHOLE, SLICE]) is WHOLE


def test_a_finished_pod_gets_no_more_readings_from_a_claim_not_yet_released():
    info = attribution.pod_info(pod("resnet-0", "p1", phase="Succeeded"))
    found = attribution.attribute(
        [sample(WHOLE, (), used=GIB)], {"p1": info}, lambda _p: None, {GPU: ["p1"]}
    )
    assert found.readings == ()
