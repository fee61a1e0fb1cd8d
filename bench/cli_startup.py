"""How long does the `kubeseer` command take to start, against the prediction work it does?

Question: `kubeseer --help` and the light commands should answer at once (goal: under 1 s
warm), and `kubeseer predict` should cost little more than its prediction. The peer, measured
in the same run, is the work itself: `Predictor.load()` plus one `predict` of the model, timed
in a process that has already imported everything.

Each command runs as a fresh process from a directory outside the checkout, `--runs` times,
with bytecode kept in a scratch `PYTHONPYCACHEPREFIX` (the tree is untouched) that one run of
the command has filled first:

* cold: kubeseer's own bytecode is removed before every run, so each of its modules is compiled
  from source (a first run after an upgrade; every run where bytecode is not written, as with
  `PYTHONDONTWRITEBYTECODE`); third-party bytecode stays cached;
* warm: all bytecode is cached and the files are in the page cache from the runs before.

`import torch`, `import torch_geometric` and `import onnx` are timed alone the same way, so the
table shows what a command pays for importing them. The medians are printed; `--json` writes
all samples.

    .venv/bin/python bench/cli_startup.py [--runs 5] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

KUBESEER_PACKAGE = Path(__file__).resolve().parents[1] / "kubeseer"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"


def timed(argv: list[str], *, cwd: Path, environ: dict[str, str]) -> float:
    """Wall time of one run, which must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr.decode()}")
    return elapsed


def samples(argv: list[str], runs: int, *, cache: Path, cwd: Path) -> dict[str, list[float]]:
    """`runs` cold and `runs` warm wall times of `argv` (see the module docstring)."""
    environ = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache)}
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    timed(argv, cwd=cwd, environ=environ)  # fills the bytecode cache
    # The prefix mirrors absolute paths: this is where kubeseer's own bytecode goes.
    own = cache / KUBESEER_PACKAGE.relative_to(KUBESEER_PACKAGE.anchor)
    cold = []
    for _ in range(runs):
        shutil.rmtree(own, ignore_errors=True)
        cold.append(timed(argv, cwd=cwd, environ=environ))
    warm = [timed(argv, cwd=cwd, environ=environ) for _ in range(runs)]
    return {"cold": cold, "warm": warm}


def prediction_work(model: Path, batch: int) -> dict[str, float]:
    """The peer: loading the shipped checkpoint and one prediction, in this process."""
    from kubeseer.predictor import api

    api.Predictor.load().predict(model, batch, "infer")  # imports and first-call set-up
    start = time.perf_counter()
    predictor = api.Predictor.load()
    loaded = time.perf_counter()
    predictor.predict(model, batch, "infer")
    done = time.perf_counter()
    return {"load_s": loaded - start, "predict_s": done - loaded, "total_s": done - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=LIGHT, help="ONNX model for `predict`")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print every sample as JSON")
    args = parser.parse_args()
    kubeseer = str(Path(sys.executable).parent / "kubeseer")
    python = sys.executable
    commands = {
        "kubeseer --help": [kubeseer, "--help"],
        "kubeseer graph --help": [kubeseer, "graph", "--help"],
        f"kubeseer predict {args.model.name} --batch {args.batch}": [
            kubeseer,
            "predict",
            str(args.model.resolve()),
            "--batch",
            str(args.batch),
            "--mode",
            "infer",
        ],
        "python -c 'import torch'": [python, "-c", "import torch"],
        "python -c 'import torch_geometric'": [python, "-c", "import torch_geometric"],
        "python -c 'import onnx'": [python, "-c", "import onnx"],
        "python -c pass": [python, "-c", "pass"],
    }
    with (
        tempfile.TemporaryDirectory(prefix="kubeseer-bench-") as outside,
        tempfile.TemporaryDirectory(prefix="kubeseer-pycache-") as cache,
    ):
        results = {
            name: samples(argv, args.runs, cache=Path(cache), cwd=Path(outside))
            for name, argv in commands.items()
        }
    work = prediction_work(args.model, args.batch)
    if args.json:
        print(json.dumps({"commands": results, "prediction_work": work}, indent=2))
        return 0
    print(f"median of {args.runs} runs each, seconds (fresh process, outside the checkout)")
    print(f"{'command':<52} {'cold':>7} {'warm':>7}")
    for name, runs in results.items():
        cold, warm = statistics.median(runs["cold"]), statistics.median(runs["warm"])
        print(f"{name:<52} {cold:>7.3f} {warm:>7.3f}")
    print(
        f"peer, in one process: Predictor.load() {work['load_s']:.3f} s + predict "
        f"{work['predict_s']:.3f} s = {work['total_s']:.3f} s"
    )
    predict_warm = statistics.median(next(r for n, r in results.items() if "predict " in n)["warm"])
    print(f"kubeseer predict (warm) / its prediction work: {predict_warm / work['total_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
