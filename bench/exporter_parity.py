"""Does the served prediction depend on which of PyTorch's exporters wrote the ONNX file?

A user's file comes from ``torch.onnx.export``, whose default is the dynamo exporter from
PyTorch 2.9 and TorchScript before. The same network must get the same memory either way: the
GPU runs the network, not the file. For timm architectures whose fp16 inference memory is
derived on torch 2 (`data/derived-gpu-memory-timm`, one derivation each, a seeded sample),
each is exported both ways, and the default checkpoint's served memory for the derived batch is
compared on three files:

* **TorchScript**: the export the checkpoint's timm rows were learned from (module paths in
  node names);
* **dynamo, names only**: the dynamo export with its node metadata stripped, which is how
  kubeseer read every dynamo export before it read module paths from the metadata
  (`kubeseer.predictor.extract.scopes`);
* **dynamo**: the same file as served now.

Reported per file: the served point over the TorchScript file's (the ratio to watch, 1.0 is
exporter-independent), MAPE and the share under the derived memory target (the allocator's
required reservation plus the runtime's context: under is an out-of-memory risk), and the
upper bound's coverage of the target. Training is served too, as a ratio to TorchScript only:
its prior does not read module paths, so what differs is the network's reading of two spellings
of one graph.

    .venv/bin/python bench/exporter_parity.py [--count 24] [--seed 0] [--json PATH]

About a minute an architecture on two cores (two exports, six predictions). The TorchScript
exports come from the timm cache (`kubeseer.predictor.timm_models`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import external_data_helper

from kubeseer.measure import gpu_memory
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import api, timm_models

REPO = Path(__file__).resolve().parents[1]
DERIVATIONS = REPO / "data" / "derived-gpu-memory-timm" / "derivations.jsonl"
RUNTIME = "torch2-cuda12"
GPU = "RTX-4090"
MAX_PARAMS = 150_000_000
FILES = ("torchscript", "dynamo, names only", "dynamo")


@dataclass(frozen=True)
class Job:
    """One derived fp16 inference job: a timm architecture at an image size and a batch."""

    model: str
    img: int
    batch: int
    target_bytes: int


@dataclass(frozen=True)
class Served:
    """The served memory of one job from each file, and training's point from each."""

    job: Job
    infer: dict[str, tuple[float, float]]
    train_point: dict[str, float]


def derived_jobs() -> list[Job]:
    """Every torch 2 inference derivation as a job, one per architecture (its smallest batch)."""
    context = gpu_memory.RUNTIMES[RUNTIME].context_bytes
    smallest: dict[tuple[str, int], Job] = {}
    for line in DERIVATIONS.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("required") is None:
            continue
        model, img, mode, batch, runtime = entry["key"].split("|")
        if mode != "infer" or runtime != RUNTIME:
            continue
        job = Job(model, int(img), int(batch), int(entry["required"]) + context)
        known = smallest.get((model, job.img))
        if known is None or job.batch < known.batch:
            smallest[(model, job.img)] = job
    return sorted(smallest.values(), key=lambda j: (j.model, j.img))


def dynamo_export(model: str, img: int, target: Path) -> tuple[Path, Path]:
    """`model` exported by dynamo with its batch symbolic, weights left out of the file; and
    the same file with its node metadata stripped."""
    import timm

    torch.manual_seed(0)
    network = timm.create_model(model, pretrained=False).eval()
    if sum(p.numel() for p in network.parameters()) > MAX_PARAMS:
        raise ValueError(f"more than {MAX_PARAMS:,} parameters")
    batch = torch.export.Dim("batch", min=2, max=4096)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            network,
            (torch.randn(2, 3, img, img),),
            input_names=["input"],
            dynamic_shapes={"x": {0: batch}},
            dynamo=True,
            verbose=False,
        )
    if program is None:
        raise ValueError("the exporter returned no program")
    proto = program.model_proto
    for tensor in proto.graph.initializer:
        if len(tensor.raw_data) > timm_models.KEPT_INITIALIZER_BYTES:
            external_data_helper.set_external_data(tensor, location="weights.bin")
            tensor.ClearField("raw_data")
    with_paths = target / f"{model}-dynamo.onnx"
    onnx.save(proto, str(with_paths))
    for node in proto.graph.node:
        node.ClearField("metadata_props")
    names_only = target / f"{model}-dynamo-names.onnx"
    onnx.save(proto, str(names_only))
    return with_paths, names_only


def serve(predictor: api.Predictor, job: Job, scratch: Path) -> Served:
    """The default checkpoint's answers for `job` from each of its three files."""
    torchscript = timm_models.export(job.model, job.img)
    dynamo, names_only = dynamo_export(job.model, job.img, scratch)
    files = dict(zip(FILES, (torchscript, names_only, dynamo), strict=True))
    infer: dict[str, tuple[float, float]] = {}
    train: dict[str, float] = {}
    for name, path in files.items():
        served = predictor.predict(str(path), job.batch, Mode.INFER, Precision.FP16, gpu=GPU)
        infer[name] = (served.memory_bytes.point, served.memory_bytes.upper)
        trained = predictor.predict(
            str(path), job.batch, Mode.TRAIN, Precision.FP16, gpu=GPU, optimizer="sgd"
        )
        train[name] = trained.memory_bytes.point
    return Served(job, infer, train)


def _summary(results: Sequence[Served]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in FILES:
        ratios = [r.infer[name][0] / r.infer["torchscript"][0] for r in results]
        errors = [r.infer[name][0] / r.job.target_bytes - 1 for r in results]
        train = [r.train_point[name] / r.train_point["torchscript"] for r in results]
        out[name] = {
            "infer_ratio_median": statistics.median(ratios),
            "infer_ratio_min": min(ratios),
            "infer_ratio_max": max(ratios),
            "infer_mape": 100 * statistics.fmean(abs(e) for e in errors),
            "infer_under_pct": 100 * sum(e < 0 for e in errors) / len(errors),
            "infer_bound_coverage_pct": 100
            * sum(r.infer[name][1] >= r.job.target_bytes for r in results)
            / len(results),
            "train_ratio_median": statistics.median(train),
            "train_ratio_min": min(train),
            "train_ratio_max": max(train),
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=24, help="architectures to serve")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    jobs = derived_jobs()
    random.Random(args.seed).shuffle(jobs)
    predictor = api.Predictor.load()
    results: list[Served] = []
    skipped: dict[str, str] = {}
    print(f"| model | img | batch | target GiB | {' | '.join(FILES)} (point / TorchScript's) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for job in jobs:
        if len(results) == args.count:
            break
        with tempfile.TemporaryDirectory(prefix="kubeseer-parity-") as scratch:
            try:
                served = serve(predictor, job, Path(scratch))
            except Exception as e:  # an architecture an exporter cannot take is left out
                skipped[job.model] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                continue
        results.append(served)
        base = served.infer["torchscript"][0]
        cells = " | ".join(f"{served.infer[name][0] / base:.3f}" for name in FILES)
        print(
            f"| {job.model} | {job.img} | {job.batch} | {job.target_bytes / 2**30:.2f} | {cells} |",
            flush=True,
        )
    summary = _summary(results)
    print(
        "\n| file | infer point / TorchScript's: median (min-max) | infer MAPE % | under "
        "target % | bound covers % | train point / TorchScript's: median (min-max) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in summary.items():
        print(
            f"| {name} | {row['infer_ratio_median']:.3f} ({row['infer_ratio_min']:.3f}-"
            f"{row['infer_ratio_max']:.3f}) | {row['infer_mape']:.1f} | "
            f"{row['infer_under_pct']:.0f} | {row['infer_bound_coverage_pct']:.0f} | "
            f"{row['train_ratio_median']:.3f} ({row['train_ratio_min']:.3f}-"
            f"{row['train_ratio_max']:.3f}) |"
        )
    print(f"\n{len(results)} architectures; {len(skipped)} left out: {skipped}")
    if args.json:
        report: dict[str, Any] = {
            "summary": summary,
            "skipped": skipped,
            "jobs": [
                {
                    "model": r.job.model,
                    "img": r.job.img,
                    "batch": r.job.batch,
                    "target_bytes": r.job.target_bytes,
                    "infer": r.infer,
                    "train_point": r.train_point,
                }
                for r in results
            ],
        }
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
