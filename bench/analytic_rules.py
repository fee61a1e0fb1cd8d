"""Does reading the graph as the GPU runs it bring the analytic memory estimate closer to it?

The analytic estimate (`kubeseer.predictor.analytic_memory`) is every memory prediction's prior
and, far beyond the labels, the figure itself. Four readings of an fp32 ONNX export, in the
same run, against the same derived GPU memory:

* **as written** (`Rules.WRITTEN`, every checkpoint before issue 18's twelfth session): every
  activation at the job's precision, attention stored as exported;
* **as run** (`Rules.RUNTIME`, the twelfth session's): CUDA autocast's widths and per-reader
  casts (`autocast`), and the attention kernel the job runs (`attention`; PyTorch's own choice
  on an SM80+ GPU, or ``written`` for a torch 1.x runtime, which has no SDPA);
* **eagerly** (`Rules.EAGER`, the thirteenth session's and the default): as run, plus what
  eager PyTorch keeps that the graph does not show (module arguments alive until ``forward``
  returns, `eager`; MaxPool's indices; autocast's weight-cast cache under ``no_grad``), SiLU as
  one kernel, and widths promoted over data operands only;
* **with upcasts** (`Rules.UPCAST`, the twenty-eighth session's): eagerly, plus the fp32 copy
  autocast makes of a half-precision activation that an fp32 operator (a LayerNorm after a
  GELU) reads, which training saves in place of the original.

Labels: the live-tensor peak (`allocated`: what the estimate models, no allocator reserve)
less the cuBLAS workspaces the trace holds (one handle's for inference, two for training, where
autograd's backward thread has its own; the estimate keeps workspaces as a runtime constant) of
every derivation without a GPU whose graph is cached: the zoo's H100 rows
(`data/cuda-*-derived-allocator-replay`, fp32/fp16/bf16, train and infer) and timm's
architectures at the public out-of-memory boundaries (`data/derived-gpu-memory-timm`, fp16
autocast). Per group: MAPE, share within 10 %, and the share under-predicted (an estimate
below what the job holds). No model is trained; nothing is fitted.

    .venv/bin/python bench/analytic_rules.py [--json PATH]

Graphs come from the graph cache (`kubeseer train` and `bench/gpu_predictor.py --export` fill
it); rows without a cached graph are counted and left out.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kubeseer.measure import gpu_memory, storage
from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import analytic_memory, dataset, prior, timm_models

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "data" / "cuda-nvidia-h100-80gb-hbm3-derived-allocator-replay"
ZOO_RUNTIME = "torch2-cuda12-hopper"  # the zoo's rows were derived for an H100
TIMM = REPO / "data" / "derived-gpu-memory-timm" / "derivations.jsonl"
TRANSFORMER_NAMES = ("vit", "deit", "swin", "beit", "xcit", "levit", "coat", "twins", "pvt",
                     "cait", "eva", "davit", "maxvit", "maxxvit", "mvit", "crossvit", "volo",
                     "vitamin", "tnt", "nest", "convit", "efficientformer", "poolformer",
                     "gpt", "bert", "llama")  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One derived job: its graph, how it ran, and the live-tensor peak it derived to."""

    group: str
    graph: analytic_memory.MemoryGraph
    mode: Mode
    precision: Precision
    optimizer: str
    attention: Attention
    tensors: int  # the live-tensor peak less the cuBLAS workspaces


def _tensors(allocated: int, mode: str, runtime: str) -> int:
    handles = 2 if mode == "train" else 1
    return allocated - handles * gpu_memory.RUNTIMES[runtime].cublas_workspace_bytes


def _kind(name: str) -> str:
    return "transformer" if any(part in name for part in TRANSFORMER_NAMES) else "cnn"


def zoo_rows(cache: dataset.GraphCache) -> Iterator[Row | None]:
    """The zoo's derived H100 rows (None where the graph is not cached)."""
    for record in storage.read_records(ZOO):
        if record.status != "ok" or not record.allocator_peak_allocated_bytes:
            continue
        graph = cache.get_memory(record.config_hash, record.batch_size)
        if graph is None:
            yield None
            continue
        yield Row(
            group=f"zoo {_kind(record.family)} {record.mode}",
            graph=graph,
            mode=Mode(record.mode),
            precision=Precision(record.precision),
            optimizer=record.optimizer,
            attention=Attention.AUTO,
            tensors=_tensors(int(record.allocator_peak_allocated_bytes), record.mode, ZOO_RUNTIME),
        )


def timm_rows(cache: dataset.GraphCache) -> Iterator[Row | None]:
    """timm's derivations at the public boundaries (None where the graph is not cached)."""
    for line in TIMM.read_text().splitlines():
        entry = json.loads(line)
        if "allocated" not in entry:
            continue
        name, img, mode, batch, runtime = entry["key"].split("|")
        graph = cache.get_memory(timm_models.config_hash(name, int(img)), int(batch))
        if graph is None:
            yield None
            continue
        fused = gpu_memory.RUNTIMES[runtime].fused_attention
        yield Row(
            group=f"timm {_kind(name)} {mode} {runtime}",
            graph=graph,
            mode=Mode(mode),
            precision=Precision.FP16,
            optimizer="sgd" if mode == "train" else "none",
            attention=Attention.AUTO if fused else Attention.WRITTEN,
            tensors=_tensors(int(entry["allocated"]), mode, runtime),
        )


def estimate(row: Row, rules: analytic_memory.Rules) -> int:
    terms = prior.breakdown(
        row.graph,
        row.mode,
        row.precision,
        row.optimizer,
        attention_kernel=row.attention,
        rules=rules,
    )
    return prior.tensor_bytes(terms)


def scores(errors: list[float]) -> dict[str, float]:
    e = np.array(errors)
    return {
        "n": len(e),
        "mape": float(np.mean(np.abs(e)) * 100),
        "within_10": float(np.mean(np.abs(e) <= 0.10) * 100),
        "under": float(np.mean(e < 0) * 100),
        "median_error": float(np.median(e) * 100),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args(argv)
    cache = dataset.GraphCache()
    errors: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    missing = 0
    for row in (*zoo_rows(cache), *timm_rows(cache)):
        if row is None:
            missing += 1
            continue
        for rules in analytic_memory.Rules:
            error = estimate(row, rules) / row.tensors - 1
            for group in (row.group, row.group.split(" ")[0] + " all", "all"):
                errors[(group, rules.value)].append(error)
    table = {f"{g} | {r}": scores(e) for (g, r), e in sorted(errors.items())}
    print(f"{'rows | rules':48s} {'n':>5s} {'MAPE %':>8s} {'<=10 %':>7s} {'under %':>8s} "
          f"{'median %':>9s}")  # fmt: skip
    for name, s in table.items():
        print(
            f"{name:48s} {s['n']:5d} {s['mape']:8.1f} {s['within_10']:7.1f} {s['under']:8.1f} "
            f"{s['median_error']:+9.1f}"
        )
    print(f"{missing} derived rows have no cached graph and are left out")
    if args.json is not None:
        args.json.write_text(json.dumps({"table": table, "missing": missing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
