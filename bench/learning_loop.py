"""The learning loop from the observation store on: does the default checkpoint learn a family
it never saw from the jobs a cluster ran, and what does that cost the families it knew?

kubeseer's loop (docs/feedback.md): the operator places each DLJob on the default checkpoint's
bound, the profiler reports what the job's process held (NVML), the operator stores that
observation with the job's PerfGraph, `kubeseer dataset pull` turns the store into a measured
dataset, and `kubeseer train --init default` fine-tunes the checkpoint on it. This script runs
that path for the Llama family, which the shipped checkpoint has never trained on
(docs/accuracy.md, "Twenty-ninth session": its training memory is 17 % high there).

* **The cluster**: whole H100 SXM GPUs, and the 96 jobs of `data/llama-training` (24 specs;
  `plans/replay-cuda-llama-train.yaml`) submitted once each. The base checkpoint's bound
  decides: a job whose bound exceeds the GPU is refused and never runs; one that runs and needs
  more than the GPU's usable memory runs out of memory (a censored observation at the usable
  memory); every other job is observed at what NVML reports for its process on a GPU roomier
  than it needs, the CUDA context plus the caching allocator's reserved peak, both from the
  job's derivation (docs/dataset.md). No GPU measured these: the derivation stands in for the
  profiler, at the outermost edge. With `--cluster mig` the H100s are partitioned as well
  (`MIG_LAYOUT`): each job goes to the smallest slice or whole GPU its bound fits, as the
  operator right-sizes, and runs out of memory where its target exceeds that device, so the
  observations and out-of-memory rows are spread over four devices (four pulled datasets). The
  observed reservation is still the roomy device's: on a tight slice the allocator would
  release cached blocks first, so the label errs high, on the safe side.
* **The loop**: those observations, with their PerfGraphs, into a directory store;
  `dataset pull` (the documented runtime context); `kubeseer train --init` twice, the memory
  heads alone (`--tune heads`, what `--tune auto` chooses for observations) and the whole
  network (`--tune network`), which keeps only the metrics the observations label. Each
  learns from every pulled device, as the chart's retraining job does; `heads-one-device`
  learns from the device with the most rows alone (`--device`), what `train` could do before
  it pooled devices.
* **Replay**: the zoo's derived H100 rows (`data/cuda-nvidia-h100-80gb-hbm3-derived-allocator-
  replay`: CNNs, BERT, GPT, 330 configurations), which the base learned from, split in seeded
  halves by configuration. A third fine-tune (`heads+replay`, `kubeseer train --replay`)
  also trains on the first half, as an admin would on the rows the checkpoint shipped with.
* **The score**: each checkpoint's served prediction on the 96 jobs of `data/held-out-llama`
  (24 other specs, as `bench/llama_memory.py` scores them: MAPE, within 10 %, bound coverage,
  placement on the catalogue), and on the other half of the zoo's rows (what the base knew and
  no fine-tune replayed): memory MAPE, bound coverage and bound width per mode, against the
  labels. The ratio to watch is each tuned checkpoint's figure over the base's, measured here
  on the same rows.

    .venv/bin/python bench/learning_loop.py [--ckpt default] [--minutes 5] [--seed 0]
        [--cluster whole|mig] [--arms heads,heads+replay,network,heads-one-device]
        [--keep DIR] [--json PATH]

The Llama exports are `bench/llama_memory.py`'s (cached in ``~/.cache/kubeseer/held-out-llama``;
15-50 minutes cold for each draw); the zoo's graphs come from the graph cache, or are exported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_memory
import numpy as np

from kubeseer import cli
from kubeseer.measure import records, storage
from kubeseer.observations import graphs, pull, record, store
from kubeseer.placement import catalogue
from kubeseer.predictor import api, checkpoint, dataset, errors, extract, inference

REPO = Path(__file__).resolve().parents[1]
OBSERVED = REPO / "data" / "llama-training"
HELD_OUT = REPO / "data" / "held-out-llama"
KNOWN = REPO / "data" / "cuda-nvidia-h100-80gb-hbm3-derived-allocator-replay"
PRODUCT = "H100-80GB-SXM"
GPU_NAME = "NVIDIA H100 80GB HBM3"
DEVICE = "cuda-nvidia-h100-80gb-hbm3"
"""The dataset of the cluster's whole GPUs and of the replayed rows
(`records.DeviceDescriptor.slug`)."""
MIG_LAYOUT = ("1g.10gb", "2g.20gb", "3g.40gb", None)
"""The devices of `--cluster mig`, smallest first: three H100 MIG profiles and the whole GPU."""
REPLAY = "replay"
"""Where the bench writes the half of the zoo's rows a replaying fine-tune trains on."""
MOST_OBSERVED = "most-observed"
"""Stands for the pulled device with the most rows in a fine-tune's flags."""
ARMS: dict[str, tuple[str, ...]] = {
    "heads": ("--tune", "heads"),
    "heads+replay": ("--tune", "heads", "--replay", REPLAY, "--replay-device", DEVICE),
    "network": ("--tune", "network"),
    "heads-one-device": ("--tune", "heads", "--device", MOST_OBSERVED),
}
"""Each fine-tune: its name and the `kubeseer train` flags that make it (REPLAY: the directory
of the replayed half)."""


def devices(cluster: str) -> list[tuple[str | None, int]]:
    """(MIG profile or None for the whole GPU, usable memory) of each device a job can get,
    smallest first (the placement catalogue's figures)."""
    model = catalogue.model_by_key(PRODUCT)
    layout = MIG_LAYOUT if cluster == "mig" else (None,)
    return [
        (name, (model.whole if name is None else model.profile(name)).usable_memory_bytes)
        for name in layout
    ]


def _rows(directory: Path) -> list[records.Record]:
    return [
        r
        for r in dataset.select_records(storage.read_records(directory))
        if r.memory_bytes is not None and not r.censored
    ]


def run_cluster(
    rows: Sequence[records.Record], base: api.Predictor, into: store.Store, cluster: str
) -> dict[str, int]:
    """Each job placed on the smallest device of `cluster` that holds the base's bound and
    observed as the profiler would: what happened to how many jobs."""
    offered = devices(cluster)
    happened = {"observed": 0, "out of memory": 0, "refused": 0}
    for n, r in enumerate(sorted(rows, key=lambda r: (r.config_hash, r.batch_size, r.mode))):
        assert r.memory_bytes is not None and r.context_bytes is not None
        onnx = llama_memory.onnx_for(r)
        digest = hashlib.sha256(onnx.read_bytes()).hexdigest()
        inputs = {"seq": int(json.loads(r.spec_json)["input"]["seq_len"])}
        graph = extract.from_onnx(onnx, batch_size=r.batch_size, inputs=inputs)
        optimizer = llama_memory._optimizer(r)
        made = base.predict(
            graph, r.batch_size, r.mode, r.precision, gpu=llama_memory.GPU, optimizer=optimizer
        )
        fitting = [(p, c) for p, c in offered if made.memory_bytes.upper <= c]
        if not fitting:
            happened["refused"] += 1
            continue
        profile, capacity = fitting[0]
        inputs_json = record.canonical_inputs(inputs)
        ref = store.Store.graph_name(digest, inputs_json, r.batch_size)
        into.put_graph(ref, graphs.to_bytes(graph))
        ran_out = r.memory_bytes > capacity
        happened["out of memory" if ran_out else "observed"] += 1
        held = r.context_bytes + (r.allocator_peak_reserved_bytes or 0)
        uid = f"llama-job-{n}"
        into.put(
            record.Observation(
                observation_id=record.observation_id(uid, 0),
                namespace="bench",
                dljob=f"llama-{n}",
                dljob_uid=uid,
                attempt=0,
                family="llama",
                model_digest=digest,
                model_source=f"file://{onnx.name}",
                perfgraph_ref=ref,
                inputs_json=inputs_json,
                batch_size=r.batch_size,
                mode=r.mode,
                precision=r.precision,
                optimizer=r.optimizer if r.mode == "train" else "none",
                gpu_product=PRODUCT,
                gpu_model_name=GPU_NAME,
                mig_profile=profile,
                usable_memory_bytes=capacity,
                predictor_version="default",
                label_device=base.checkpoint.label_device,
                coverage=base.checkpoint.calibration.coverage,
                predicted_memory_bytes=made.memory_bytes.point,
                predicted_memory_upper_bytes=made.memory_bytes.upper,
                predicted_sm_util_percent=None,
                predicted_step_time_s=None,
                observed_peak_memory_bytes=None if ran_out else held,
                observed_mean_memory_bytes=None if ran_out else held,
                observed_sm_activity_percent=None,
                observed_sm_source=None,
                observed_samples=0 if ran_out else 60,
                observed_source="bench-derived",
                window_start=None,
                window_end=None,
                outcome=record.Outcome.OOM if ran_out else record.Outcome.SUCCEEDED,
                memory_at_least_bytes=capacity if ran_out else None,
                finished_at="2026-12-07T00:00:00Z",
                recorded_at="2026-12-07T00:00:00Z",
            )
        )
    return happened


def halves(rows: Sequence[records.Record]) -> tuple[list[records.Record], list[records.Record]]:
    """The rows of a seeded half of the configurations, and the rest."""
    configurations = sorted({r.config_hash for r in rows})
    random.Random(0).shuffle(configurations)
    first = set(configurations[: len(configurations) // 2])
    return [r for r in rows if r.config_hash in first], [
        r for r in rows if r.config_hash not in first
    ]


def fine_tune(pulled: Path, base: Path, out: Path, flags: Sequence[str], minutes: float) -> None:
    """`kubeseer train --init` on the pulled dataset, as the chart's retraining job runs it."""
    argv = ["train", "--data", str(pulled), "--init", str(base)]
    argv += ["--out", str(out), "--threads", "1", "--time-limit", str(60 * minutes), *flags]
    if cli.main(argv) != 0:
        raise SystemExit(f"kubeseer {' '.join(argv)} failed")


def known_rows(ckpt: checkpoint.Checkpoint, rows: Sequence[records.Record]) -> dict[str, Any]:
    """Memory MAPE, within 10 % and bound coverage per mode on the zoo's derived H100 rows."""
    samples, info = dataset.build_samples(
        rows,
        memory_label=ckpt.memory_label,
        memory_prior=ckpt.normaliser.memory_prior,
        device_aware=ckpt.device_aware,
    )
    predictor = api.Predictor(ckpt)
    points = inference.predict(predictor.model, ckpt.normaliser, samples)
    uppers = ckpt.calibration.upper(points)
    out: dict[str, Any] = {}
    for metric in ("train.memory_bytes", "infer.memory_bytes"):
        have, col = info.metrics.index(metric), ckpt.metrics.index(metric)
        labelled = [k for k, s in enumerate(samples) if bool(s.y_mask[0, have])]
        true = np.array([float(samples[k].y[0, have]) for k in labelled])
        # what a GPU must hold: the label plus the context the checkpoint adds back
        shift = ckpt.runtime_context_bytes
        point = points[labelled, col] + shift
        upper = uppers[labelled, col] + shift
        errors = point / (true + shift) - 1
        out[metric] = {
            "rows": len(labelled),
            "mape": 100 * float(np.mean(np.abs(errors))),
            "within_10": 100 * float(np.mean(np.abs(errors) <= 0.1)),
            "coverage": 100 * float(np.mean(upper >= true + shift)),
            "median_error": 100 * float(statistics.median(errors)),
            "bound_over_point": 100 * float(statistics.median(upper / point - 1)),
        }
    return out


def score(name: str, ckpt: checkpoint.Checkpoint, held_out: Sequence[records.Record]) -> Any:
    """The served prediction on the held-out jobs (`llama_memory.table`); a checkpoint that
    cannot serve one (it predicts no step time) is reported with the predictor's reason."""
    started = time.monotonic()
    try:
        scored = llama_memory.score(held_out, api.Predictor(ckpt))
    except errors.PredictionError as e:
        return {"cannot serve": str(e)}
    found = llama_memory.table(scored)
    found["bound under the target"] = [
        {
            "spec": s.record.config_hash,
            "job": f"{s.record.mode} {s.record.precision} {s.record.optimizer} "
            f"batch {s.record.batch_size}",
            "target_gb": s.target / 1e9,
            "point_gb": s.point / 1e9,
            "bound_gb": s.upper / 1e9,
            "placed_on_gb": (llama_memory.holding(s.upper) or 0) / 1e9,
        }
        for s in scored
        if s.upper < s.target
    ]
    print(f"{name}: held-out Llama scored in {time.monotonic() - started:.0f} s", flush=True)
    return found


def print_tables(results: dict[str, dict[str, Any]]) -> None:
    print(
        "\n| checkpoint | predicts | held-out Llama MAPE / within 10 % (all) | inference | "
        "training | bound coverage (would-be OOMs) | placed (OOM there) | refused, would fit |"
        "\n|---|---|---|---:|---:|---:|---:|---:|"
    )
    for name, found in results.items():
        llama = found["llama"]
        if "cannot serve" in llama:
            print(
                f"| {name} | {', '.join(found['metrics'])} | cannot serve: "
                f"{llama['cannot serve']} | | | | | |"
            )
            continue
        every, bound = llama["all"], llama["all"]["bound"]
        print(
            f"| {name} | {', '.join(found['metrics'])} | {every['point']['mape']:.1f} / "
            f"{every['point']['within_10']:.0f} % | {llama['mode infer']['point']['mape']:.1f} | "
            f"{llama['mode train']['point']['mape']:.1f} | {bound['coverage']:.1f} % "
            f"({bound['would_be_oom']}) | {bound['placed']} ({bound['placed_oom']}) | "
            f"{bound['refused_would_fit']} |"
        )
        for job in llama["bound under the target"]:
            print(f"  {name}, bound under the target: {job}")
    print(
        "\nWhat the base learned from and no fine-tune replayed (half the zoo's derived H100 "
        "configurations), memory MAPE / within 10 % / bound "
        "coverage / median error / median bound over point:\n\n| checkpoint | training (rows) "
        "| inference (rows) |"
        "\n|---|---|---|"
    )
    for name, found in results.items():
        cells = [
            f"{c['mape']:.1f} / {c['within_10']:.0f} % / {c['coverage']:.1f} % / "
            f"{c['median_error']:+.1f} % / +{c['bound_over_point']:.1f} % ({c['rows']})"
            for c in found["known"].values()
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    base = results["base"]["llama"]["all"]["point"]["mape"]
    ratios = [
        f"{name} {found['llama']['all']['point']['mape'] / base:.2f}"
        for name, found in results.items()
        if name != "base" and "all" in found["llama"]
    ]
    print("\nheld-out Llama MAPE over the base's (below 1: the loop learned):", ", ".join(ratios))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", default="default")
    parser.add_argument("--minutes", type=float, default=5.0, help="each fine-tune's time limit")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="write the store, datasets and checkpoints here")
    parser.add_argument(
        "--seed", type=int, default=0, help="each fine-tune's split and batch order"
    )
    parser.add_argument(
        "--arms",
        default="heads,heads+replay,network",
        help=f"fine-tunes to run, of {', '.join(ARMS)}",
    )
    parser.add_argument(
        "--cluster",
        choices=("whole", "mig"),
        default="whole",
        help="whole H100s, or H100s partitioned as MIG_LAYOUT",
    )
    args = parser.parse_args(argv)
    base_path = api.checkpoint_path(args.ckpt)
    base = api.Predictor.load(args.ckpt)
    held_out = _rows(HELD_OUT)
    replayed, known = halves(_rows(KNOWN))
    with tempfile.TemporaryDirectory(prefix="kubeseer-loop-") as tmp:
        work = args.keep or Path(tmp)
        storage.write_part(work / REPLAY / DEVICE, replayed)
        observations = store.open_store(str(work / "store"))
        happened = run_cluster(_rows(OBSERVED), base, observations, args.cluster)
        print("the cluster's jobs:", ", ".join(f"{n} {what}" for what, n in happened.items()))
        pulled = pull.pull(observations, work / "pulled")
        print("\n".join(pull.summarise(pulled)))
        most_observed = max(pulled.rows, key=lambda slug: pulled.rows[slug])
        results: dict[str, dict[str, Any]] = {}
        chosen = {name: (*ARMS[name], "--seed", str(args.seed)) for name in args.arms.split(",")}
        for name, flags in {"base": None, **chosen}.items():
            if flags is None:
                ckpt = base.checkpoint
            else:
                out = work / f"{name}.pt"
                named = {REPLAY: str(work / REPLAY), MOST_OBSERVED: most_observed}
                replay = [named.get(f, f) for f in flags]
                fine_tune(work / "pulled", base_path, out, replay, args.minutes)
                ckpt = checkpoint.load(out)
            results[name] = {
                "metrics": list(ckpt.metrics),
                "llama": score(name, ckpt, held_out),
                "known": known_rows(ckpt, known),
            }
    print_tables(results)
    if args.json is not None:
        found = {"cluster": args.cluster, "jobs": happened, "pulled": pulled.rows}
        args.json.write_text(json.dumps({**found, "results": results}, indent=1))
    served = [r["llama"]["all"]["point"]["mape"] for r in results.values() if "all" in r["llama"]]
    return 0 if all(math.isfinite(m) for m in served) else 1


if __name__ == "__main__":
    sys.exit(main())
