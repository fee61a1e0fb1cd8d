"""Running the real operator next to a local cluster: in a thread, or as a child process.

The end-to-end tests, the benchmark and the demo need the operator exactly as deployed, not a
mock. A thread shares the test's process (its predictor function can be injected, its
exceptions surface); a child process can be killed with SIGKILL half-way through and started
again, and its memory can be measured on its own. An operator that waits for another's Lease
is started as a standby: live (serving metrics), not yet ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from kubeseer.operator import main

_POLL_S = 0.1


class OperatorStartError(RuntimeError):
    """The operator did not become ready in time, or died while starting."""


class OperatorThread:
    """`main.run` in a daemon thread, stopped through kopf's stop flag.

    Args:
        operator: a built operator (`main.build`).
        namespaces: served namespaces; empty for the whole cluster.
    """

    def __init__(self, operator: main.Operator, namespaces: Sequence[str] = ()) -> None:
        self.operator = operator
        self.namespaces = tuple(namespaces)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _target(self) -> None:
        try:
            main.run(
                self.operator,
                namespaces=self.namespaces,
                stop_flag=self._stop,
                ready_flag=self._ready,
            )
        except BaseException as e:
            self.error = e
            raise

    def start(self, timeout_s: float = 60.0) -> None:
        """Start, and return once kopf is watching."""
        self._thread = threading.Thread(target=self._target, name="kubeseer-operator", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(_POLL_S):
            if not self._thread.is_alive():
                raise OperatorStartError(f"the operator thread died while starting: {self.error}")
            if time.monotonic() > deadline:
                raise OperatorStartError(f"the operator was not ready within {timeout_s:g} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask kopf to stop and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> OperatorThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class OperatorProcess:
    """`python -m kubeseer.operator run` as a child process.

    Args:
        kubeconfig: the cluster to serve.
        env: `KUBESEER_*` settings on top of this process's environment; `KUBESEER_HEALTH_PORT`
            must be set (readiness is its `/healthz` answering).
        log: file receiving the operator's output.
    """

    def __init__(self, kubeconfig: Path, env: Mapping[str, str], log: Path) -> None:
        if not env.get("KUBESEER_HEALTH_PORT"):
            raise ValueError("OperatorProcess needs KUBESEER_HEALTH_PORT to tell when it is ready")
        self.kubeconfig = kubeconfig
        self.env = dict(env)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0, *, standby: bool = False) -> None:
        """Start the child and return once its `/healthz` answers (it holds the Lease and
        watches), or for a `standby` once its `/metrics` does (it runs, waiting for the Lease)."""
        argv = [
            sys.executable,
            "-m",
            "kubeseer.operator",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT
            )
        url = (
            f"http://127.0.0.1:{self.env['KUBESEER_METRICS_PORT']}/metrics"
            if standby
            else f"http://127.0.0.1:{self.env['KUBESEER_HEALTH_PORT']}/healthz"
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise OperatorStartError(
                    f"the operator exited with status {self.process.returncode}; see {self.log}"
                )
            if self.answers(url):
                return
            if time.monotonic() > deadline:
                raise OperatorStartError(f"{url} did not answer within {timeout_s:g} s")
            time.sleep(_POLL_S)

    @staticmethod
    def answers(url: str) -> bool:
        """Whether `url` answers 200 now."""
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def ready(self) -> bool:
        """Whether the operator holds the Lease and watches (its `/healthz` answers)."""
        return self.answers(f"http://127.0.0.1:{self.env['KUBESEER_HEALTH_PORT']}/healthz")

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self.process is None:
            raise OperatorStartError("the operator process was not started")
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to finish anything (a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def cpu_seconds(self) -> float:
        """User plus system CPU time the child has used so far, from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_bytes(self) -> tuple[int, int]:
        """(resident, peak resident) set size of the child, from /proc."""
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
        return fields["VmRSS"], fields["VmHWM"]

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
