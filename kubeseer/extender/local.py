"""`kubeseer extender` as a child process on loopback, next to a local control plane.

The end-to-end tests and the benchmark run the extender exactly as a deployment does, as its
own process behind the CLI, so that what they measure includes the HTTP hop and the process's
own watch caches. kube-scheduler needs the extender's URL before it starts, and the extender
needs the cluster's kubeconfig: pick the port first (`free_port`), start the cluster with
`url_for(port)`, then start this process.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubeseer.devcluster import process

__all__ = ["ExtenderProcess", "ExtenderStartError", "free_port", "url_for"]

_POLL_S = 0.1
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$"
)


class ExtenderStartError(RuntimeError):
    """The extender exited or did not become ready in time (the log says why)."""


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def url_for(port: int) -> str:
    """The `urlPrefix` of an extender listening on loopback `port`."""
    return f"http://127.0.0.1:{port}"


class ExtenderProcess:
    """One `kubeseer extender` child, killed with this process if it dies.

    Args:
        kubeconfig: the cluster to watch.
        port: loopback port to serve on.
        log: file receiving the extender's output.
    """

    def __init__(self, kubeconfig: Path, port: int, log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.port = port
        self.log = log
        self._child: tuple[subprocess.Popen[bytes], process.ProcessRecord] | None = None

    @property
    def url(self) -> str:
        """The `urlPrefix` to give kube-scheduler."""
        return url_for(self.port)

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the child; return once its caches have synced (`/healthz` answers 200)."""
        argv = [
            sys.executable,
            "-m",
            "kubeseer.cli",
            "extender",
            f"--listen=127.0.0.1:{self.port}",
            f"--kubeconfig={self.kubeconfig}",
        ]
        child, record = process.spawn("extender", argv, self.log, die_with_parent=True)
        self._child = (child, record)
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if child.poll() is not None:
                raise ExtenderStartError(
                    f"the extender exited with status {child.returncode}:\n"
                    + process.log_tail(self.log)
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ExtenderStartError(f"{self.url}/healthz not ready within {timeout_s:g} s")
            time.sleep(_POLL_S)

    def healthy(self) -> bool:
        """Whether `/healthz` answers 200 (caches synced)."""
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the extender's `/metrics`, None when absent."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        wanted = {f'{k}="{v}"' for k, v in labels.items()}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or match["name"] != name:
                continue
            have = set((match["labels"] or "").split(",")) - {""}
            if wanted <= have:
                return float(match["value"])
        return None

    def cpu_seconds(self) -> float:
        """User plus system CPU time the child has used so far, from /proc."""
        if self._child is None:
            raise ExtenderStartError("the extender process was not started")
        stat = Path(f"/proc/{self._child[0].pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM the child's process group, SIGKILL if it lingers; idempotent."""
        if self._child is None:
            return
        child, record = self._child
        process.stop([record], [child])
        self._child = None

    def __enter__(self) -> ExtenderProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
