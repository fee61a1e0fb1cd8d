"""`kubeseer demo` (what `make demo` runs) and `kubeseer demo --chart`, as a user runs them.

The demo starts its own local control plane, places the sample DLJobs, profiles each GPU node
with a real `kubeseer profiler` fed by the NVML stand-in, and prints each job's prediction
against the observation the operator recorded. Without a GPU the observed memory must be the
derivation for the job's own model (and the output must say so), never the prediction; and
nothing the demo started may outlive it.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import yaml

from kubeseer import demo_truth, resources
from kubeseer.devcluster import binaries

pytestmark = pytest.mark.e2e

MIB = 1 << 20
JOBS = ("mlp-infer-small", "mlp-train-replicas", "mlp-train-slice", "mlp-train-whole-gpu")


def run_demo(tmp_path: Path, *flags: str) -> str:
    """The demo's output; its scratch files under `tmp_path`, no KUBECONFIG (its own cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(COLUMNS="250", TMPDIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "kubeseer.cli", "demo", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def rows(output: str, title: str) -> dict[str, list[str]]:
    """The rows of the table titled `title`, by their first cell."""
    table = output[output.index(title) :]
    found = {}
    for line in table.splitlines()[1:]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        found[cells[0]] = cells
    return found


def mib(text: str) -> int:
    return int(text.replace(",", ""))


def derived_need(job: str, gpu: str) -> int:
    """What the derivation says the job needs at least, on that GPU's runtime (MiB)."""
    config_map, dljob = list(
        yaml.safe_load_all((resources.path("examples") / f"{job}.yaml").read_text())
    )
    model = onnx.load_from_string(base64.b64decode(config_map["binaryData"]["model.onnx"]))
    derived = demo_truth.derive(model, dljob["spec"], gpu, 1 << 40)
    return round(derived.required_bytes / MIB)


def left_running(*paths: str) -> list[str]:
    """Command lines of live processes that mention any of `paths`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(p in command for p in paths) and str(os.getpid()) != entry.name:
            found.append(command)
    return found


@pytest.mark.parametrize("flags", [(), ("--chart",)], ids=["demo", "chart"])
def test_the_demo_shows_each_job_predicted_against_a_derived_observation_then_tears_down(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    binaries.build()  # the demo's own first step; built here so a cold build is not its output
    output = run_demo(tmp_path, *flags)

    assert "the observed memory below is DERIVED, not measured" in output
    assert "label source derived-allocator-replay" in output
    table = rows(output, "Prediction against observation")
    assert sorted(table) == sorted(JOBS)
    for job, (_, gpu, predicted, observed, error, within, runs_in, record) in table.items():
        point, upper = (mib(v) for v in predicted.split(" / "))
        # The observation is the derivation for the job's own model on its GPU, through the
        # profiler (status.observed) and the operator (its store), not the prediction.
        assert mib(runs_in) == derived_need(job, gpu), job
        assert mib(runs_in) <= mib(observed), job
        assert mib(observed) != point, job
        # the table shows the point rounded to a MiB; the error is computed before rounding
        shown = float(error.rstrip("%")) / 100
        lowest, highest = ((point + d - mib(observed)) / mib(observed) for d in (-0.5, 0.5))
        assert lowest - 0.0005 <= shown <= highest + 0.0005, (job, error)
        assert within == ("yes" if mib(observed) <= upper else "NO"), job
        assert record == f"succeeded, {observed} observed", job
    assert "source nvml-standin; SM activity unavailable" in output.replace("\n", " ")
    feedback = output[output.index("The operator's feedback metrics") :]
    assert re.search(r"observations_total\s+│ outcome=succeeded\s+│ 4\b", feedback)

    cluster_dir = re.search(r"logs in (\S+)", output)
    assert cluster_dir is not None
    assert left_running(cluster_dir.group(1), str(tmp_path)) == []
