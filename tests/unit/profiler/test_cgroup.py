"""Process -> pod and container from /proc/<pid>/cgroup, in each runtime's real path format."""

from pathlib import Path

import pytest

from kubeseer.profiler import cgroup

UID = "4f8a3c41-1d3b-4d0e-9f43-2b7c6a2e8d11"
SYSTEMD_UID = UID.replace("-", "_")
CID = "8c1c2f6a0b5e3d7f9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b"

# cgroup v1 with the cgroupfs driver (Docker through cri-dockerd, or containerd with cgroupfs):
# one line per controller, the same pod directory in each.
V1_CGROUPFS = f"""12:hugetlb:/kubepods/burstable/pod{UID}/{CID}
11:devices:/kubepods/burstable/pod{UID}/{CID}
10:memory:/kubepods/burstable/pod{UID}/{CID}
4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""

# cgroup v1 with the systemd driver and CRI-O.
_CRIO = (
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
    f"crio-{CID}.scope"
)
V1_SYSTEMD_CRIO = f"""11:memory:{_CRIO}
7:pids:{_CRIO}
1:name=systemd:{_CRIO}
"""

# cgroup v2, systemd driver, containerd (the default on current distributions).
V2_CONTAINERD = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
    f"cri-containerd-{CID}.scope\n"
)


@pytest.mark.parametrize(
    "text",
    [
        V1_CGROUPFS,
        V1_SYSTEMD_CRIO,
        V2_CONTAINERD,
        # Guaranteed pods sit directly under kubepods.slice.
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        # Docker with the systemd driver.
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
        # cgroup v2 with the cgroupfs driver.
        f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
        # Read from inside a private cgroup namespace: relative to the reader's own cgroup.
        f"0::/../../kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        # kind and other nested kubelets put kubepods under the kubelet's own slice.
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
    ],
    ids=[
        "v1-cgroupfs",
        "v1-systemd-crio",
        "v2-systemd-containerd",
        "v2-guaranteed",
        "v2-systemd-docker",
        "v2-cgroupfs",
        "v2-private-namespace",
        "v2-kind",
    ],
)
def test_names_the_pod_and_container_in_every_runtime_format(text):
    assert cgroup.parse_file(text) == cgroup.ContainerRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/nvidia-persistenced.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "12:memory:/\n0::/\n",
        # CRI-O's container monitor is in the pod's slice but is not the container.
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/crio-conmon-{CID}.scope\n",
        "",
        "garbage without colons\n",
    ],
)
def test_processes_outside_a_container_of_a_pod_are_not_attributed(text):
    assert cgroup.parse_file(text) is None


def test_a_process_in_the_pod_cgroup_itself_belongs_to_the_pod_without_a_container():
    text = (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice\n"
    )
    assert cgroup.parse_file(text) == cgroup.ContainerRef(UID, None)


def test_reads_the_cgroup_file_under_the_proc_root(tmp_path: Path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V2_CONTAINERD)
    reader = cgroup.ProcReader(tmp_path)
    assert reader.container_of(4242) == cgroup.ContainerRef(UID, CID)
    assert reader.container_of(4243) is None  # the process is gone
