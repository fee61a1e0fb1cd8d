"""Are the kernel launch limits read off an ONNX export the ones the job really launches?

`kubeseer.predictor.launch_limits` reads, from the exported graph alone, the batch of each
fused attention and the largest depthwise-convolution tensor: what kubeseer can know in
production, where a DLJob gives only its export. The peer is the job itself: the same
architecture run by PyTorch on the meta device (`kubeseer.measure.kernel_limits`, committed in
data/derived-gpu-memory-timm/kernel-limits.jsonl, one probe per architecture, image size and
runtime). Both are compared

* per architecture and runtime: the same attention batch and the same depthwise tensor per
  example (torch 1.x has no scaled-dot-product attention, so its jobs fuse none);
* on the public out-of-memory boundaries (timm's benchmark, NCHW, eager, fp16 AMP): per
  limit, the failures the export puts down to it (crossed at the batch that failed, not at the
  one that ran), whether the probe agrees, and the batches that ran although the export says
  they cross it. The last decides what a limit is worth: one crossed mostly by failures is a
  failure (`--max-batch` stays below it), one crossed as often by batches that ran is a risk.

    .venv/bin/python bench/launch_limits.py [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from kubeseer.measure import gpu_memory, kernel_limits, public_gpu
from kubeseer.prediction import Attention
from kubeseer.predictor import analytic_memory, errors, extract, launch_limits, timm_models

REPO = Path(__file__).resolve().parents[1]
TIMM_DIR = REPO.parent / "shared" / "data" / "public-gpu" / "timm"
PROBES = REPO / "data" / "derived-gpu-memory-timm" / "kernel-limits.jsonl"


def read_export(model: str, img: int, runtime: str) -> kernel_limits.Limits | None:
    """The per-example launch sizes the export of `model` at `img` shows for a job on
    `runtime`, in the probe's form; None when the export is missing or does not extract."""
    path = timm_models.onnx_path(model, img)
    if not path.exists():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExtractionWarning)
            graph = extract.from_onnx(str(path), batch_size=1)
    except errors.PredictionError:
        return None
    kernel = Attention.AUTO if gpu_memory.RUNTIMES[runtime].fused_attention else Attention.WRITTEN
    memory = analytic_memory.from_perfgraph(graph)
    found = launch_limits.measure(graph, memory, analytic_memory.attention_blocks(memory), kernel)
    return kernel_limits.Limits(0, found.attention_batch, found.depthwise_elements)


def compare_sizes(
    probes: dict[str, kernel_limits.Limits | None], read: dict[str, kernel_limits.Limits | None]
) -> dict[str, Any]:
    """Per runtime, how many architectures' exports show the probe's sizes."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    differ = []
    for name, probe in sorted(probes.items()):
        runtime = name.rsplit("|", 1)[1]
        found = read.get(name)
        if probe is None or found is None:
            counts[runtime]["unread"] += 1
            continue
        counts[runtime]["n"] += 1
        same_attention = found.attention_batch_per_example == probe.attention_batch_per_example
        same_depthwise = (
            found.depthwise_elements_per_example == probe.depthwise_elements_per_example
        )
        counts[runtime]["attention"] += same_attention
        counts[runtime]["depthwise"] += same_depthwise
        if not (same_attention and same_depthwise):
            differ.append(
                f"{name}: attention {found.attention_batch_per_example} (probe "
                f"{probe.attention_batch_per_example}), depthwise "
                f"{found.depthwise_elements_per_example:,} "
                f"(probe {probe.depthwise_elements_per_example:,})"
            )
    print("\n### per-example launch sizes: export vs the job on the meta device\n")
    print("| runtime | architectures | same attention batch | same depthwise tensor | unread |")
    print("|---|---:|---:|---:|---:|")
    table = {}
    for runtime, c in sorted(counts.items()):
        n = max(c["n"], 1)
        table[runtime] = {
            "n": c["n"],
            "attention": 100 * c["attention"] / n,
            "depthwise": 100 * c["depthwise"] / n,
            "unread": c["unread"],
        }
        print(
            f"| {runtime} | {c['n']} | {table[runtime]['attention']:.1f} % | "
            f"{table[runtime]['depthwise']:.1f} % | {c['unread']} |"
        )
    print(f"\n{len(differ)} differ" + (":" if differ else ""))
    for line in differ[:20]:
        print(f"- {line}")
    return {"table": table, "differ": differ}


def score_boundaries(
    boundaries: list[public_gpu.Boundary],
    probes: dict[str, kernel_limits.Limits | None],
    read: dict[str, kernel_limits.Limits | None],
) -> dict[str, Any]:
    """Per limit, the failures the export puts down to it, how many of those the probe puts
    down to it too, and the batches that ran although the export says they cross it."""
    rows: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for b in boundaries:
        name = kernel_limits.key(b.row.model, b.row.img_size, b.row.runtime)
        probe, found = probes.get(name), read.get(name)
        if probe is None or found is None:
            continue
        by_probe, by_export = probe.explains(b.fit, b.fail), found.explains(b.fit, b.fail)
        crossed_at_fit = (
            ("attention", found.attention_batch_per_example * b.fit > kernel_limits.GRID_LIMIT),
            (
                "depthwise",
                found.depthwise_elements_per_example * b.fit >= kernel_limits.INT32_ELEMENTS,
            ),
        )
        for group in ("all", f"{b.row.gpu} {b.row.mode} {b.row.runtime}"):
            c = rows[group]
            c["n"] += 1
            c["disagree"] += by_probe != by_export
            for limit, ran_past in crossed_at_fit:
                c[f"{limit} failed"] += by_export is not None and limit in by_export
                c[f"{limit} ran"] += ran_past
    print("\n### public boundaries and the launch limits read off the export\n")
    print(
        "| rows | boundaries | attention: failed past it | attention: ran past it | "
        "depthwise: failed past it | depthwise: ran past it | export and probe disagree |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    table = {}
    for group, c in sorted(rows.items(), key=lambda item: (item[0] != "all", item[0])):
        table[group] = dict(c)
        print(
            f"| {group} | {c['n']} | {c['attention failed']} | {c['attention ran']} | "
            f"{c['depthwise failed']} | {c['depthwise ran']} | {c['disagree']} |"
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not TIMM_DIR.is_dir():
        print(f"public GPU data not found at {TIMM_DIR}", file=sys.stderr)
        return 2
    probes = kernel_limits.read([PROBES])
    read = {}
    for name in sorted(probes):
        model, img, runtime = name.split("|")
        read[name] = read_export(model, int(img), runtime)
    boundaries = [
        b
        for b in public_gpu.boundaries(public_gpu.read_timm(TIMM_DIR))
        if not b.row.channels_last and b.row.precision == "fp16"
    ]
    result = {
        "sizes": compare_sizes(probes, read),
        "boundaries": score_boundaries(boundaries, probes, read),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
