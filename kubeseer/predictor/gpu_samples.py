"""Training samples from GPU labels: what the default, device-aware checkpoint learns from.

Three sources, one sample set (`build`), every sample carrying its device (`model_input.build`
with the GPU's specs) so that one model learns from all of them:

* **derived memory of the zoo** (`data/cuda-*-derived-allocator-replay`, label source
  ``derived-allocator-replay``): what an H100 must hold for every zoo family at small, medium and
  large sizes, batch 1-512, training (SGD, Adam) and inference, fp32/fp16/bf16 (docs/dataset.md,
  "GPU memory without a GPU"). Memory is learned as the allocator's required reservation, the
  target less the runtime's CUDA context (`targets.MemoryLabel.RESERVED`), which the predictor
  adds back.
* **measured step times of timm architectures** (`shared/data/public-gpu/timm`, Apache-2.0;
  `STEP_FILES`): eager, NCHW, fp16 AMP; inference on the RTX 3090 and 4090 (torch 2.4), the
  4090, 5090 and RTX PRO 6000 Max-Q (torch 2.9), training with SGD on the 3090 (torch 1.12).
  Each row is one sample on its GPU, at its batch.
* **derived memory of timm architectures** (`data/derived-gpu-memory-timm/derivations.jsonl`,
  the same derivation at the public out-of-memory boundaries): the rows derived for the torch 2
  runtime (`RUNTIME`, the runtime the zoo's rows and the checkpoint's context assume).

and, trained on in every split but never scored or calibrated on (`Sources.training_only`,
named in `dataset.DatasetInfo.training_only` for `splits.apart`), **derived memory of a draw
whose held-out counterpart is kept apart**: the Llama family's training draw
(`data/llama-training`, seed 1), beside the 24 specs of `data/held-out-llama` (seed 0) that
`bench/llama_memory.py` scores the checkpoint on.

And, beside them, `censored_samples`: the **public out-of-memory boundaries themselves** as
right- and left-censored memory (the batch that ran needed at most the card, the next one more),
for training only (`train.fit`'s ``censored``). They are the one GPU evidence of timm memory;
the derivations above are what kubeseer says of the same jobs.

Timm architectures become PerfGraphs through `timm_models` (exported with random weights and
cached); one whose export fails is left out and counted. A sample's ``family`` is the zoo family
or ``timm/<module>`` (the timm module that defines the architecture), its ``config_hash`` the
zoo configuration or the timm architecture at its image size, so splits never cut an
architecture in two; ``gpu`` names the device and ``source`` the kind of label.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor
from torch_geometric.data import Data

from kubeseer.hardware import gpus, mig
from kubeseer.measure import gpu_memory, kernel_limits, public_gpu, storage
from kubeseer.prediction import Precision
from kubeseer.predictor import dataset, model_input, prior, targets, timm_models

METRICS: Final[tuple[str, ...]] = (
    "train.memory_bytes",
    "train.step_time_s",
    "infer.memory_bytes",
    "infer.step_time_s",
)

STEP_FILES: Final[tuple[str, ...]] = (
    "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
    "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-5090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
    "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",
)
"""The public step times learned from: eager (no `torch.compile`), NCHW, fp16 AMP."""

RUNTIME: Final[str] = "torch2-cuda12"
"""The derivation runtime of the timm memory rows learned from (`gpu_memory.RUNTIMES`)."""

TIMM_PRECISION: Final[str] = "fp16"
TIMM_TRAIN_OPTIMIZER: Final[str] = "sgd"
"""timm's benchmark trains with SGD and momentum (Nesterov), the prior's ``sgd``."""

MAX_PARAMS: Final[int] = 400_000_000
"""Architectures above this many parameters are not exported (their fp32 weights alone would
take more than this machine's share of memory while tracing)."""


@dataclass(frozen=True)
class Sources:
    """Where the labels are.

    Attributes:
        replay: a directory of derived-allocator-replay records (the zoo's derived memory).
        timm: the public timm benchmark directory (`shared/data/public-gpu/timm`).
        derivations: the timm derivations (`data/derived-gpu-memory-timm/derivations.jsonl`).
        training_only: directories of derived-allocator-replay records whose samples every
            split trains on and none scores: each a draw of a family whose held-out draw is a
            set of its own.
    """

    replay: Path
    timm: Path
    derivations: Path
    training_only: tuple[Path, ...] = ()


def _family(model: str) -> str:
    from timm.models import _registry

    return "timm/" + str(_registry._model_to_module.get(model, model.split("_")[0]))


def step_rows(directory: Path) -> list[public_gpu.TimmRow]:
    """The public step-time rows learned from (`STEP_FILES`)."""
    return [r for r in public_gpu.read_timm(directory) if r.source in STEP_FILES]


def architectures(rows: Iterable[public_gpu.TimmRow], derivations: Path) -> list[tuple[str, int]]:
    """Every (timm model, image size) to export, in the order to export them.

    First the architectures of the memory derivations, in their file's order (a seeded shuffle
    of the public boundaries, `bench/gpu_memory.py`), then the other step-time architectures a
    family at a time in turn (seeded within each family), so that a prefix of the list is a
    sample of every family. Architectures over `MAX_PARAMS` are left out.
    """
    import random

    params = {(r.model, r.img_size): r.params for r in rows}
    order: list[tuple[str, int]] = []
    for derivation in _derivations(derivations):
        arch = (derivation.model, derivation.img)
        if arch not in order and params.get(arch, 0) <= MAX_PARAMS and arch in params:
            order.append(arch)
    by_family: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for arch in sorted(params):
        if arch not in order and params[arch] <= MAX_PARAMS:
            by_family[_family(arch[0])].append(arch)
    rng = random.Random(0)
    for members in by_family.values():
        rng.shuffle(members)
    while any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family]:
                order.append(by_family[family].pop())
    return order


@dataclass(frozen=True)
class Derivation:
    """One derived timm job (`data/derived-gpu-memory-timm/README.md`)."""

    model: str
    img: int
    mode: str
    batch: int
    runtime: str
    required: int
    allocated: int


def _derivations(path: Path) -> list[Derivation]:
    """Every derivation that ran, in the file's order."""
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "error" in entry or entry.get("required") is None:
            continue
        model, img, mode, batch, runtime = entry["key"].split("|")
        out.append(
            Derivation(
                model, int(img), mode, int(batch), runtime, entry["required"], entry["allocated"]
            )
        )
    return out


def _timm_sample(
    graph: Data,
    *,
    on: mig.Device,
    mode: str,
    label: float,
    quantity: str,
) -> Data:
    optimizer = TIMM_TRAIN_OPTIMIZER if mode == "train" else targets.NO_OPTIMIZER
    sample = model_input.build(graph, TIMM_PRECISION, optimizer, on)
    values = [0.0] * len(METRICS)
    present = [False] * len(METRICS)
    k = METRICS.index(targets.metric(mode, quantity))
    values[k], present[k] = label, True
    sample.y = torch.tensor([values], dtype=torch.float64)
    sample.y_mask = torch.tensor([present], dtype=torch.bool)
    terms = prior.breakdowns(graph.memory_graph, Precision(TIMM_PRECISION), optimizer)
    sample.prior_log = torch.tensor([prior.log_priors(terms, with_batch=True)], dtype=torch.float64)
    sample.live_peak = torch.zeros(1, len(METRICS), dtype=torch.float64)
    return sample


def timm_samples(
    sources: Sources, *, limit: int | None = None, export: bool = False, workers: int = 1
) -> tuple[list[Data], list[str]]:
    """Samples of the timm step times and memory derivations whose architectures have graphs.

    Args:
        sources: where the labels are.
        limit: use only the first `limit` architectures of `architectures` (None: all).
        export: export architectures not cached yet (seconds to minutes each); without it,
            only cached exports are used.
        workers: processes that export at once, each extracting the graphs of what it
            exported (`timm_models.export_all`).

    Returns:
        the samples and one line per architecture left out (why).
    """
    rows = step_rows(sources.timm)
    order = architectures(rows, sources.derivations)
    if limit is not None:
        order = order[:limit]
    chosen = set(order)
    wanted: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
    for row in rows:
        if (row.model, row.img_size) in chosen:
            wanted[(row.model, row.img_size)].add(row.batch_size)
    derived = [
        d
        for d in _derivations(sources.derivations)
        if d.runtime == RUNTIME and (d.model, d.img) in chosen
    ]
    for d in derived:
        wanted[(d.model, d.img)].add(d.batch)
    if export:
        timm_models.export_all(
            [arch for arch in order if arch in wanted], workers=workers, batches=wanted
        )
    failed: list[str] = []
    graphs: dict[tuple[str, int], dict[int, Data]] = {}
    for arch in order:
        if arch not in wanted:
            continue
        if not export and not timm_models.onnx_path(*arch).exists():
            failed.append(f"{arch[0]}-{arch[1]}: not exported")
            continue
        try:
            graphs[arch] = timm_models.graphs(*arch, sorted(wanted[arch]))
        except Exception as e:  # an architecture that cannot be exported or extracted
            failed.append(f"{arch[0]}-{arch[1]}: {type(e).__name__}: {e}"[:300])
    samples = []
    for row in rows:
        arch = (row.model, row.img_size)
        if arch not in graphs:
            continue
        sample = _timm_sample(
            graphs[arch][row.batch_size],
            on=mig.device(row.gpu),
            mode=row.mode,
            label=row.step_time_s,
            quantity="step_time_s",
        )
        _tag(sample, arch, row.batch_size, row.gpu, f"measured {row.source}")
        samples.append(sample)
    reference = mig.device("H100-SXM5-80GB")
    for d in derived:
        arch = (d.model, d.img)
        if arch not in graphs:
            continue
        sample = _timm_sample(
            graphs[arch][d.batch],
            on=reference,
            mode=d.mode,
            label=d.required,
            quantity="memory_bytes",
        )
        sample.live_peak[0, METRICS.index(targets.metric(d.mode, "memory_bytes"))] = d.allocated
        _tag(sample, arch, d.batch, reference.gpu.key, f"derived-allocator-replay {d.runtime}")
        samples.append(sample)
    return samples, failed


CENSORED_RUNTIMES: Final[frozenset[str]] = frozenset({RUNTIME})
"""The runtimes whose public boundaries become censored samples: the runtime the checkpoint's
labels assume. A torch 1.x job ran attention as written and held another context, so its
boundary says nothing exact about the torch 2 job the checkpoint predicts."""


def censored_samples(
    sources: Sources, limits: Path, *, export: bool = False, workers: int = 1
) -> tuple[list[Data], list[str]]:
    """The public out-of-memory boundaries of `sources.timm` as censored memory samples.

    Each boundary that is memory evidence (no kernel limit in `limits` explains its failure,
    `kernel_limits`, and no other run of the job contradicts it,
    `public_gpu.memory_contradictions`) of a `CENSORED_RUNTIMES` file (eager, NCHW, fp16 AMP)
    gives two samples at the card's capacity less the runtime's context, in the label's units
    (`targets.MemoryLabel.RESERVED`): the batch that ran, whose label is at most that
    (``y_censor`` -1), and the one that failed, whose label exceeds it (``y_censor`` +1).
    Like the derivations they are put on the reference device: memory does not read it.

    Returns:
        the samples, and one line per architecture whose graphs could not be had.
    """
    rows = public_gpu.read_timm(sources.timm)
    contradicted = public_gpu.memory_contradictions(rows)
    chosen = [
        b
        for b in public_gpu.boundaries(rows)
        if b.row.runtime in CENSORED_RUNTIMES
        and b.row.mode == "infer"
        and b.row.precision == TIMM_PRECISION
        and not b.row.channels_last
        and b not in contradicted
        and b.row.params <= MAX_PARAMS
        and (export or timm_models.onnx_path(b.row.model, b.row.img_size).exists())
    ]
    probed = kernel_limits.read([limits])
    evidence = []
    for b in chosen:
        found = probed.get(kernel_limits.key(b.row.model, b.row.img_size, b.row.runtime))
        if found is None or found.explains(b.fit, b.fail) is None:
            evidence.append(b)
    wanted: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
    for b in evidence:
        wanted[(b.row.model, b.row.img_size)].update((b.fit, b.fail))
    if export:
        timm_models.export_all(list(wanted), workers=workers, batches=wanted)
    graphs: dict[tuple[str, int], dict[int, Data]] = {}
    failed: list[str] = []
    for arch, batches in wanted.items():
        try:
            graphs[arch] = timm_models.graphs(*arch, sorted(batches))
        except Exception as e:  # an architecture that cannot be exported or extracted
            failed.append(f"{arch[0]}-{arch[1]}: {type(e).__name__}: {e}"[:300])
    reference = mig.device("H100-SXM5-80GB")
    samples = []
    for b in evidence:
        arch = (b.row.model, b.row.img_size)
        if arch not in graphs:
            continue
        held = (
            gpus.by_key(b.row.gpu).memory_bytes - gpu_memory.RUNTIMES[b.row.runtime].context_bytes
        )
        k = METRICS.index(targets.metric("infer", "memory_bytes"))
        for batch, direction, outcome in ((b.fit, -1, "ran"), (b.fail, 1, "failed")):
            sample = _timm_sample(
                graphs[arch][batch], on=reference, mode="infer", label=held, quantity="memory_bytes"
            )
            sample.y_censor = torch.zeros(1, len(METRICS), dtype=torch.int8)
            sample.y_censor[0, k] = direction
            _tag(
                sample,
                arch,
                batch,
                reference.gpu.key,
                f"censored {outcome} on {b.row.gpu} {b.row.source}",
            )
            samples.append(sample)
    return samples, failed


def _tag(sample: Data, arch: tuple[str, int], batch: int, gpu: str, source: str) -> None:
    sample.family = _family(arch[0])
    sample.config_hash = timm_models.config_hash(*arch)
    sample.job_batch_size = batch
    sample.gpu = gpu
    sample.source = source
    sample.model_name = f"{arch[0]}@{arch[1]}"


def replay_samples(
    directory: Path, *, workers: int = 1, cache_dir: Path | None = None, export: bool = True
) -> tuple[list[Data], dataset.DatasetInfo]:
    """The zoo's derived memory rows as device-aware samples (reserved memory, analytic prior);
    without `export`, only configurations whose graphs are cached."""
    rows = dataset.select_records(storage.read_records(directory))
    live = {_record_key(r): r.allocator_peak_allocated_bytes for r in rows if not r.censored}
    samples, info = dataset.build_samples(
        rows,
        metrics=[m for m in METRICS if m.endswith("memory_bytes")],
        memory_label=targets.MemoryLabel.RESERVED,
        memory_prior=True,
        workers=workers,
        cache_dir=cache_dir,
        device_aware=True,
        graph_fn=None if export else dataset.cached_only(rows, cache_dir),
    )
    widened = []
    for s in samples:
        # Widen the two memory columns to `METRICS`, step time unlabelled.
        y = torch.zeros(1, len(METRICS), dtype=torch.float64)
        mask = torch.zeros(1, len(METRICS), dtype=torch.bool)
        for k, name in enumerate(info.metrics):
            y[0, METRICS.index(name)] = s.y[0, k]
            mask[0, METRICS.index(name)] = s.y_mask[0, k]
        s.y, s.y_mask = y, mask
        s.live_peak = _live_peaks(s, live)
        s.gpu = mig.device(rows[0].device.name).gpu.key
        s.source = f"derived-allocator-replay zoo {rows[0].device.name}"
        s.model_name = f"zoo/{s.family}/{s.config_hash}"
        widened.append(s)
    return widened, info


def _record_key(record: Any) -> tuple[str, int, str, str, str]:
    optimizer = record.optimizer if record.mode == "train" else targets.NO_OPTIMIZER
    return (record.config_hash, record.batch_size, record.precision, optimizer, record.mode)


def _live_peaks(sample: Data, live: dict[tuple[str, int, str, str, str], int | None]) -> Tensor:
    """The live-tensor peak (`torch.cuda.max_memory_allocated`, what a FakeTensor estimate
    gives) of each memory metric the sample labels, 0 where there is none: a baseline."""
    out = torch.zeros(1, len(METRICS), dtype=torch.float64)
    for mode in targets.MODES:
        optimizer = sample.optimizer if mode == "train" else targets.NO_OPTIMIZER
        key = (
            str(sample.config_hash),
            int(sample.job_batch_size),
            sample.precision,
            optimizer,
            mode,
        )
        value = live.get(key)
        if value:
            out[0, METRICS.index(targets.metric(mode, "memory_bytes"))] = float(value)
    return out


def build(
    sources: Sources, *, limit: int | None = None, export: bool = False, workers: int = 1
) -> tuple[list[Data], dataset.DatasetInfo]:
    """Every sample of the three sources, and a `dataset.DatasetInfo` naming them.

    Raises:
        dataset.DatasetError: the replay records do not make samples.
    """
    zoo, replay_info = replay_samples(sources.replay, workers=workers, export=export)
    drawn: list[Data] = []
    for directory in sources.training_only:
        more, more_info = replay_samples(directory, workers=workers, export=export)
        drawn += more
        replay_info = replace(
            replay_info,
            records=replay_info.records + more_info.records,
            censored=replay_info.censored + more_info.censored,
            failed=(*replay_info.failed, *more_info.failed),
        )
    timm, failed = timm_samples(sources, limit=limit, export=export, workers=workers)
    samples = zoo + timm + drawn
    step_gpus = sorted({s.gpu for s in timm if bool(s.y_mask[0, 1] | s.y_mask[0, 3])})
    timm_archs = {s.config_hash for s in timm}
    derived_timm = sum(1 for s in timm if s.source.startswith("derived"))
    info = dataset.DatasetInfo(
        device_kind="cuda",
        device="cuda-public-gpus",
        device_name="GPUs: public timm step times (" + ", ".join(step_gpus) + "), derived memory",
        label_source="measured+derived-allocator-replay",
        optimizers=tuple(sorted({*replay_info.optimizers, TIMM_TRAIN_OPTIMIZER})),
        metrics=METRICS,
        records=replay_info.records + len(timm),
        censored=replay_info.censored,
        samples=len(samples),
        digest=digest(samples),
        failed=(*replay_info.failed, *failed),
        memory_label=targets.MemoryLabel.RESERVED,
        device_aware=True,
        context_bytes=replay_info.context_bytes,
        sources=(
            f"memory: derived-allocator-replay (no GPU ran them; docs/dataset.md): "
            f"{len(zoo)} zoo samples ({replay_info.device_name} runtime, torch 2 / CUDA 12), "
            f"{derived_timm} samples of {len(timm_archs)} timm architectures at public "
            "out-of-memory boundaries"
            + (
                f" and {len(drawn)} samples trained on only ("
                + ", ".join(f"{d.parent.name}/{d.name}" for d in sources.training_only)
                + ")"
                if drawn
                else ""
            ),
            f"step time: measured, timm's public benchmark (Apache-2.0): "
            f"{len(timm) - derived_timm} rows, fp16 AMP, on " + ", ".join(step_gpus),
        ),
        step_time_gpus=tuple(step_gpus),
        training_only=tuple(sorted({str(s.config_hash) for s in drawn})),
    )
    return samples, info


def digest(samples: Sequence[Data]) -> str:
    """sha256 over every sample's identity and labels, independent of their order."""
    lines = sorted(
        json.dumps(
            [
                str(s.config_hash),
                int(s.job_batch_size),
                str(s.precision),
                str(s.optimizer),
                str(getattr(s, "gpu", "")),
                [round(float(v), 9) for v in s.y[0].tolist()],
                [bool(v) for v in s.y_mask[0].tolist()],
            ]
        )
        for s in samples
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
