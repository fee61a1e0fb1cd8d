"""GPU memory of Llama-style decoders at real sizes, specs no checkpoint has learned from.

The question: asked for a Llama job (0.07-17 B parameters, 512-8192 tokens, training with SGD
or Adam or inference, fp32 or fp16/bf16 autocast), does the memory the operator places on hold
it? Each job of `data/held-out-llama` (`plans/replay-cuda-llama.yaml`) carries its derived
memory target on an H100 (the job's eager allocation trace on the meta device through the
caching-allocator model, plus the CUDA context; docs/dataset.md). On the same rows:

* **default checkpoint**: the served prediction for `H100-SXM5-80GB`, point and upper bound,
  exactly what `kubeseer predict` answers and the operator places on;
* **analytic**: the estimator's tensor bytes plus the same context, the prior the checkpoint's
  memory heads correct;
* **live-tensor peak**: the job's own trace without the allocator (what a FakeTensor count
  gives), plus the context: not independent of the target, it shows the allocator's share.

Each model's rows: MAPE, within 10 %, and where it has a bound the coverage and the would-be
out-of-memory placements (a bound below the target). Then what placement does with the bound:
the smallest device of the placement catalogue (A100, H100, H200 and their MIG profiles, usable
memory) that holds it, out of memory there when the target exceeds that device, and refused
("fits no GPU") while the target would have fitted one. Grouped by mode, precision and size;
the ratio to watch is the checkpoint's MAPE over the analytic estimate's, both measured here.

A checkpoint trained with the family's training draw (`data/llama-training`: 24 other specs,
seed 1; `gpu_samples.Sources.training_only`) has seen the family but none of these specs; one
trained before it has seen neither. The checkpoint's sources are printed first.

    .venv/bin/python bench/llama_memory.py [--data data/held-out-llama] [--ckpt default]
        [--json PATH]

Exports every spec's ONNX without weights (`zoo.export`, seconds to minutes per spec) into
``~/.cache/kubeseer/held-out-llama``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeseer import zoo
from kubeseer.measure import records, storage
from kubeseer.placement import catalogue
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import analytic_memory, api, dataset, extract, prior
from kubeseer.zoo import export

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "held-out-llama"
ONNX_CACHE = Path.home() / ".cache" / "kubeseer" / "held-out-llama"
GPU = "H100-SXM5-80GB"
DEVICES: tuple[int, ...] = tuple(
    sorted(
        {
            profile.usable_memory_bytes
            for model in catalogue.MODELS
            for profile in (model.whole, *model.profiles)
        }
    )
)
"""Usable memory of every whole GPU and MIG profile placement chooses from, smallest first."""


@dataclass(frozen=True)
class Scored:
    """One job's target and each model's figures, in bytes."""

    record: records.Record
    target: float
    point: float
    upper: float
    analytic: float
    live: float

    def groups(self) -> list[str]:
        r = self.record
        billions = (r.params or 0) / 1e9
        size = "under 1 B" if billions < 1 else "1-5 B" if billions < 5 else "5-17 B"
        seq = json.loads(r.spec_json)["input"]["seq_len"]
        return [
            "all",
            f"mode {r.mode}",
            f"precision {r.precision}",
            f"parameters {size}",
            f"sequence {seq}",
        ]


def onnx_for(record: records.Record) -> Path:
    """The record's spec exported without weights, cached by config hash under the graph
    cache's revision, which moves with the zoo's export."""
    path = ONNX_CACHE / f"r{dataset.GRAPH_REVISION}" / f"{record.config_hash}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = zoo.ModelSpec.from_json(record.spec_json)
        partial = path.with_suffix(".partial.onnx")
        export.export_onnx(spec, partial, with_weights=False)
        partial.replace(path)
    return path


def score(rows: Sequence[records.Record], predictor: api.Predictor) -> list[Scored]:
    """Every row predicted and estimated, one graph extraction per (spec, batch)."""
    out = []
    for r in sorted(rows, key=lambda r: (r.config_hash, r.batch_size)):
        assert r.memory_bytes is not None and r.context_bytes is not None
        seq = int(json.loads(r.spec_json)["input"]["seq_len"])
        graph = extract.from_onnx(onnx_for(r), batch_size=r.batch_size, inputs={"seq": seq})
        made = predictor.predict(
            graph, r.batch_size, r.mode, r.precision, gpu=GPU, optimizer=_optimizer(r)
        )
        terms = prior.breakdown(
            analytic_memory.from_perfgraph(graph),
            Mode(r.mode),
            Precision(r.precision),
            _optimizer(r),
        )
        out.append(
            Scored(
                record=r,
                target=float(r.memory_bytes),
                point=made.memory_bytes.point,
                upper=made.memory_bytes.upper,
                analytic=float(prior.tensor_bytes(terms) + r.context_bytes),
                live=float((r.allocator_peak_allocated_bytes or 0) + r.context_bytes),
            )
        )
    return out


def _optimizer(record: records.Record) -> str:
    return record.optimizer if record.mode == "train" else "adam"


def holding(need: float) -> int | None:
    """Usable memory of the smallest catalogued device that holds `need`; None: none does."""
    return next((capacity for capacity in DEVICES if capacity >= need), None)


def table(scored: Sequence[Scored]) -> dict[str, dict[str, Any]]:
    """Per group and model: rows, MAPE, within 10 %, signed median error, coverage and would-be
    out-of-memory placements (bound below the target)."""
    by_group: dict[str, list[Scored]] = collections.defaultdict(list)
    for s in scored:
        for group in s.groups():
            by_group[group].append(s)
    out: dict[str, dict[str, Any]] = {}
    for group, items in sorted(by_group.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        cell: dict[str, Any] = {"rows": len(items)}
        for model in ("point", "analytic", "live"):
            errors = [getattr(s, model) / s.target - 1 for s in items]
            cell[model] = {
                "mape": 100 * sum(abs(e) for e in errors) / len(errors),
                "within_10": 100 * sum(abs(e) <= 0.1 for e in errors) / len(errors),
                "median_error": 100 * sorted(errors)[len(errors) // 2],
                "under": 100 * sum(e < 0 for e in errors) / len(errors),
            }
        under_bound = [s for s in items if s.upper < s.target]
        placed = [(s, holding(s.upper)) for s in items]
        cell["bound"] = {
            "coverage": 100 * (1 - len(under_bound) / len(items)),
            "would_be_oom": len(under_bound),
            "median_width": 100 * (sorted(s.upper / s.point for s in items)[len(items) // 2] - 1),
            "placed": sum(device is not None for _, device in placed),
            "placed_oom": sum(device is not None and s.target > device for s, device in placed),
            "refused_would_fit": sum(
                device is None and holding(s.target) is not None for s, device in placed
            ),
        }
        out[group] = cell
    return out


def _figures(model: dict[str, float]) -> str:
    return f"{model['mape']:.1f} / {model['within_10']:.0f} % / {model['under']:.0f} %"


def print_table(found: dict[str, dict[str, Any]]) -> None:
    print(
        "\n| group | rows | checkpoint MAPE / within 10 % / under | analytic | live-tensor peak "
        "| bound coverage (would-be OOMs) | bound over point | placed (out of memory there) "
        "| refused, would have fitted |\n|---|---:|---|---|---|---|---:|---:|---:|"
    )
    for group, cell in found.items():
        bound = cell["bound"]
        print(
            f"| {group} | {cell['rows']} | {_figures(cell['point'])} | "
            f"{_figures(cell['analytic'])} | {_figures(cell['live'])} | "
            f"{bound['coverage']:.1f} % ({bound['would_be_oom']}) | "
            f"+{bound['median_width']:.1f} % | {bound['placed']} ({bound['placed_oom']}) | "
            f"{bound['refused_would_fit']} |"
        )
    every = found["all"]
    ratio = every["point"]["mape"] / every["analytic"]["mape"]
    print(
        f"\ncheckpoint MAPE / analytic MAPE: {ratio:.2f} (below 1: the network adds to its prior)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--ckpt", default="default")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = [
        r
        for r in dataset.select_records(storage.read_records(args.data))
        if r.memory_bytes is not None and not r.censored
    ]
    started = time.monotonic()
    predictor = api.Predictor.load(args.ckpt)
    print("\n".join(["checkpoint sources:", *predictor.checkpoint.sources]))
    scored = score(rows, predictor)
    print(
        f"{len(scored)} jobs of {len({r.config_hash for r in rows})} llama specs, "
        f"{min(r.params or 0 for r in rows) / 1e9:.2f}-{max(r.params or 0 for r in rows) / 1e9:.1f}"
        f" B parameters, scored in {time.monotonic() - started:.0f} s"
    )
    found = table(scored)
    print_table(found)
    worst = sorted(scored, key=lambda s: s.upper / s.target)[:5]
    print("\nlowest bound over target:")
    for s in worst:
        r = s.record
        print(
            f"  {r.config_hash} {r.mode} {r.precision} {r.optimizer} batch {r.batch_size}: "
            f"target {s.target / 1e9:.2f} GB, point {s.point / 1e9:.2f}, bound "
            f"{s.upper / 1e9:.2f} ({100 * (s.upper / s.target - 1):+.1f} %)"
        )
    if args.json is not None:
        jobs = [
            {
                "config_hash": s.record.config_hash,
                "params": s.record.params,
                "mode": s.record.mode,
                "precision": s.record.precision,
                "optimizer": s.record.optimizer,
                "batch": s.record.batch_size,
                "target": s.target,
                "point": s.point,
                "upper": s.upper,
                "analytic": s.analytic,
                "live": s.live,
            }
            for s in scored
        ]
        args.json.write_text(json.dumps({"groups": found, "jobs": jobs}, indent=1) + "\n")
    return 0 if math.isfinite(found["all"]["point"]["mape"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
