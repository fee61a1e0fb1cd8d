"""Component processes, each in its own process group with its output in a log file.

A process group per component lets teardown signal everything a component may have spawned,
and lets `kubeseer devcluster down` stop a cluster started by another (now exited) process:
it only has the pids from the state file, and checks each still runs the expected binary
before signalling, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TERM_GRACE_S = 10.0
_POLL_S = 0.05


@dataclass(frozen=True)
class ProcessRecord:
    """What the state file keeps about one component process."""

    name: str
    pid: int
    executable: str
    log: str


def spawn(
    name: str, argv: Sequence[str], log: Path, *, die_with_parent: bool
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `argv` in a new session (its own process group), stdout and stderr to `log`.

    With `die_with_parent` the kernel kills the component when this process dies, even by
    SIGKILL, so an interrupted test run cannot leave a control plane behind.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_set_parent_death_signal if die_with_parent else None,
        )
    return child, ProcessRecord(name=name, pid=child.pid, executable=argv[0], log=str(log))


def _set_parent_death_signal() -> None:
    """Runs in the child before exec: ask for SIGKILL when the launching thread exits."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def runs(record: ProcessRecord) -> bool:
    """Whether the recorded pid is alive and still the recorded executable (not a reused pid)."""
    try:
        exe = os.readlink(f"/proc/{record.pid}/exe")
    except OSError:
        return False
    # A binary replaced by a rebuild while running shows as "<path> (deleted)".
    return exe.removesuffix(" (deleted)") == os.path.realpath(record.executable)


def signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    """Send `sig` to the component's process group, if it is still ours."""
    if runs(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, sig)


def stop(
    records: Sequence[ProcessRecord], children: Sequence[subprocess.Popen[bytes]] = ()
) -> list[str]:
    """SIGTERM every group, wait up to `TERM_GRACE_S`, SIGKILL what is left.

    Returns the names that needed SIGKILL. `children` are the processes this process started:
    until reaped their pids cannot be reused, so they are signalled without the executable
    check, and they are reaped here so no zombie keeps a pid (or a leak check) busy.
    """
    own = {child.pid: child for child in children}

    def alive(record: ProcessRecord) -> bool:
        child = own.get(record.pid)
        return child.poll() is None if child is not None else runs(record)

    def send(record: ProcessRecord, sig: signal.Signals) -> None:
        if record.pid in own:
            if alive(record):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pid, sig)
        else:
            signal_group(record, sig)

    for record in records:
        send(record, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and any(alive(r) for r in records):
        time.sleep(_POLL_S)
    killed = []
    for record in records:
        if alive(record):
            killed.append(record.name)
            send(record, signal.SIGKILL)
    for record in records:
        child = own.get(record.pid)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=TERM_GRACE_S)
    return killed


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a component log, for error messages."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
