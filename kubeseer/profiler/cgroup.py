"""Process -> container -> pod, from the cgroup a process lives in.

NVML names the processes on a GPU by host PID and nothing else. The kubelet puts every
container's processes in a cgroup whose path carries the pod's UID and the container's ID, so
`/proc/<pid>/cgroup` is enough to attribute a PID without asking the container runtime. The
path depends on the cgroup driver and the runtime:

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>`` (guaranteed pods sit
  directly under ``/kubepods``), the same on cgroup v1 (one line per controller) and v2
  (``0::<path>``);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
  underscores>.slice/<runtime prefix><container id>.scope``, with the prefix ``cri-containerd-``
  (containerd), ``crio-`` (CRI-O) or ``docker-`` (Docker through cri-dockerd);
- inside a private cgroup namespace (the default for containers on cgroup v2) another
  container's path is shown relative to the reader's own cgroup (``0::/../../kubepods-...``),
  so the pod and container are searched for anywhere in the path, not from its root.

CRI-O's ``crio-conmon-<id>.scope`` holds the container monitor, not the container, and is not
attributed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class ContainerRef:
    """The pod (by UID) and container (by runtime ID, without the ``containerd://`` scheme)."""

    pod_uid: str
    container_id: str | None


def parse_path(path: str) -> ContainerRef | None:
    """The pod and container a cgroup path names, or None for a path outside any pod."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    for index in range(len(parts) - 1, -1, -1):
        match = _POD.search(parts[index])
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        container = None
        if index + 1 < len(parts):
            found = _CONTAINER.match(parts[index + 1])
            if found is None:
                # Something other than a container under the pod (conmon, the pause sandbox
                # on some runtimes): the process is the pod's, its container unknown.
                return ContainerRef(uid, None) if "conmon" not in parts[index + 1] else None
            container = found.group(1)
        return ContainerRef(uid, container)
    return None


def parse_file(text: str) -> ContainerRef | None:
    """The pod and container of a `/proc/<pid>/cgroup` file (cgroup v1 or v2).

    Each line is ``hierarchy-id:controllers:path``; on v1 every controller line names the same
    pod, on v2 there is one line with hierarchy 0. The first line naming a pod wins, preferring
    one that also names the container.
    """
    best: ContainerRef | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = parse_path(fields[2])
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        best = best or ref
    return best


class ProcReader:
    """Reads `<proc root>/<pid>/cgroup`.

    Args:
        root: the host's `/proc`: `/proc` itself when the agent shares the host PID namespace
            (`hostPID: true`, as NVML reports host PIDs), or where the host's is mounted.
    """

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def container_of(self, pid: int) -> ContainerRef | None:
        """The pod and container of `pid`; None when the process is gone or not in a pod."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return parse_file(text)
