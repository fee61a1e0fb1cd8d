"""Measured records -> PerfGraph training samples.

Records carry no ONNX files, only the spec JSON, so each configuration's graph is regenerated:
the zoo exports the spec to ONNX without weights, `extract.from_onnx` binds the batch size,
and `perfgraph.to_pyg` produces the tensors. Exports are slow (seconds for big models) and the
same graph serves many trainings, so graphs are cached on disk under
``<cache>/graphs/v<schema>-r<revision>/<config hash>/b<batch>.pt`` (default cache
``~/.cache/kubeseer``, or ``$KUBESEER_CACHE_DIR``). Writes go to a temporary file renamed into
place, so parallel builders never see half a file. The schema version and `GRAPH_REVISION` in
the path mean that neither a feature change nor a change in what extraction computes reads
stale graphs.

A sample is one (config hash, batch size, precision, training optimizer): its graph, plus the
labels of both modes (`targets.METRICS` order; missing where that mode was not measured). The
optimizer's state is part of training memory and the graph does not show it, so precision and
optimizer are appended to the global features (`targets.EXTRA_GLOBAL_FEATURES`); a sample
measured only in inference carries optimizer "none". Censored (out-of-memory) records carry
only a lower bound and are left out of regression; they are counted in `DatasetInfo`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import hashlib
import json
import multiprocessing
import os
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Final

import torch
from rich.progress import Progress
from torch_geometric.data import Data

from kubeseer.hardware import gpus, mig
from kubeseer.measure import records as records_lib
from kubeseer.prediction import Precision
from kubeseer.predictor import (
    analytic_memory,
    model_input,
    perfgraph,
    prior,
    schema,
    targets,
)

GRAPH_REVISION: Final[int] = 9
"""Revision of what export and extraction make of a spec, part of the cache path.

Bump it with any change that gives a spec a different PerfGraph or memory graph at the same
schema version (the zoo's export, `extract`, `opcount`, `analytic_memory.from_perfgraph`):
graphs cached before would otherwise be read as if current. Revision 1 held memory graphs
extracted before tied weights were counted once; revision 2, graphs exported without the
dropout the zoo's models train with; revision 3, memory graphs without each operator's output
rank (five-dimensional attention was counted as fused); revision 4, without torch.matmul's
broadcast copies; revision 5, parameters the TorchScript exporter merged (equal values) counted
once; revision 6, the zoo's graphs without module paths (its export dropped them with the
rest of the node metadata, so no zoo graph had module calls); revision 7, operators the
dynamo exporter wrote without a module path (a Llama's rotary Split) read as the top-level
``forward`` (`extract.scopes.module_paths`); revision 8, a convolution the rewriter fused a
BatchNorm into read in the BatchNorm's module (`extract.scopes.module_path`), and the zoo's
export without the rewriter's rule names it is told by.
tests/unit/predictor/test_graph_revision.py fails when its reference graphs change and this
number did not.
"""

WORKER_CONTEXT: Final = multiprocessing.get_context("spawn")
"""How the processes that export and extract start: fresh interpreters, not forks. A fork of
this process inherits every lock its other threads (a pool's feeder thread, torch's own) hold at
that moment, still locked, and a child that needs one waits forever: a second pool in one
process (the zoo's graphs, then a training draw's) hung with every worker in
`UntypedStorage._share_fd_cpu_`, sending back its graphs. Each spawned worker imports torch
once; exports take seconds to minutes each."""

GraphFn = Callable[[str, Sequence[int]], dict[int, Data]]
"""(spec JSON, batch sizes) -> graph per batch size."""


class DatasetError(ValueError):
    """Records that cannot become a training set (mixed devices, no labels, nothing left)."""


@dataclass(frozen=True)
class DatasetInfo:
    """Where a sample set came from; stored in checkpoints and printed by `train`."""

    device_kind: str
    device: str
    device_name: str
    label_source: str
    optimizers: tuple[str, ...]
    metrics: tuple[str, ...]
    records: int
    censored: int
    samples: int
    digest: str
    failed: tuple[str, ...] = field(default_factory=tuple)
    memory_label: targets.MemoryLabel = targets.MemoryLabel.DEVICE
    device_aware: bool = False
    context_bytes: int = 0
    sources: tuple[str, ...] = field(default_factory=tuple)
    step_time_gpus: tuple[str, ...] = field(default_factory=tuple)
    training_only: tuple[str, ...] = field(default_factory=tuple)
    """Config hashes every split trains on and none scores or calibrates on (`splits.apart`)."""
    left_out: tuple[str, ...] = field(default_factory=tuple)
    """Metrics the records label that were not learnable (`build_samples(learnable=...)`)."""


def joined(info: DatasetInfo, replayed: DatasetInfo) -> DatasetInfo:
    """`info` of a sample set with `replayed`'s samples added (`kubeseer train --replay`): the
    counts and sources of both, a digest of both, and the device and label source of `info`,
    whose rows the training is for."""
    both = hashlib.sha256(f"{info.digest}\n{replayed.digest}".encode()).hexdigest()
    return replace(
        info,
        optimizers=tuple(sorted({*info.optimizers, *replayed.optimizers})),
        records=info.records + replayed.records,
        censored=info.censored + replayed.censored,
        samples=info.samples + replayed.samples,
        digest=both,
        failed=(*info.failed, *replayed.failed),
        context_bytes=max(info.context_bytes, replayed.context_bytes),
        sources=(*info.sources, *(f"replayed: {line}" for line in replayed.sources)),
        step_time_gpus=tuple(dict.fromkeys((*info.step_time_gpus, *replayed.step_time_gpus))),
    )


def default_cache_dir() -> Path:
    """``$KUBESEER_CACHE_DIR`` or ``~/.cache/kubeseer``."""
    root = os.environ.get("KUBESEER_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "kubeseer"


class GraphCache:
    """On-disk PerfGraph tensors, and the analytic estimator's view of the same graph, keyed by
    schema version, graph revision, config hash and batch size."""

    def __init__(self, root: Path | None = None) -> None:
        base = root or default_cache_dir()
        version = f"v{schema.SCHEMA_VERSION}-r{GRAPH_REVISION}"
        self.root = base / "graphs" / version
        self.memory_root = base / "memory-graphs" / version

    def path(self, config_hash: str, batch_size: int) -> Path:
        """Where the graph of `config_hash` at `batch_size` lives."""
        return self.root / _checked(config_hash) / f"b{batch_size}.pt"

    def memory_path(self, config_hash: str, batch_size: int) -> Path:
        """Where the memory graph (`analytic_memory.MemoryGraph`) of the same lives."""
        return self.memory_root / _checked(config_hash) / f"b{batch_size}.json"

    def get(self, config_hash: str, batch_size: int) -> Data | None:
        """The cached graph, or None (also for an unreadable file, which is then rebuilt)."""
        path = self.path(config_hash, batch_size)
        if not path.exists():
            return None
        try:
            tensors = torch.load(path, weights_only=True)
        except Exception:  # any damage (torch raises many kinds) just means: build it again
            return None
        return Data(**tensors)

    def get_memory(self, config_hash: str, batch_size: int) -> analytic_memory.MemoryGraph | None:
        """The cached memory graph, or None (missing or unreadable)."""
        path = self.memory_path(config_hash, batch_size)
        try:
            return analytic_memory.MemoryGraph.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, analytic_memory.MemoryEstimateError):
            return None

    def get_with_memory(self, config_hash: str, batch_size: int) -> Data | None:
        """The cached graph carrying its memory graph as ``memory_graph``; None unless both are
        cached."""
        graph = self.get(config_hash, batch_size)
        memory_graph = self.get_memory(config_hash, batch_size)
        if graph is None or memory_graph is None:
            return None
        graph.memory_graph = memory_graph
        return graph

    def put(self, config_hash: str, batch_size: int, graph: Data) -> None:
        """Store atomically (write a temporary file, then rename)."""
        tensors = {k: graph[k] for k in ("x", "edge_index", "edge_attr", "u")}
        _replace(self.path(config_hash, batch_size), lambda f: torch.save(tensors, f))

    def put_memory(
        self, config_hash: str, batch_size: int, graph: analytic_memory.MemoryGraph
    ) -> None:
        """Store a memory graph atomically."""
        text = json.dumps(graph.to_dict()).encode()
        _replace(self.memory_path(config_hash, batch_size), lambda f: f.write(text))


def _checked(config_hash: str) -> str:
    """`config_hash`, refused unless it is safe as a single path component."""
    if not config_hash.isalnum():
        raise DatasetError(f"config hash {config_hash!r} is not alphanumeric")
    return config_hash


def _replace(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write `path` through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_perfgraphs(spec_json: str, batch_sizes: Sequence[int]) -> dict[int, perfgraph.PerfGraph]:
    """Export `spec_json` once to ONNX (no weights) and extract its PerfGraph per batch size.

    The zoo binds a token model's `seq` from its spec, so the graph has the measured shapes.
    """
    import onnx

    from kubeseer.predictor import errors, extract
    from kubeseer.zoo import export, spec

    model_spec = spec.ModelSpec.from_json(spec_json)
    with tempfile.TemporaryDirectory(prefix="kubeseer-graph-") as tmp:
        path = export.export_onnx(model_spec, Path(tmp) / "model.onnx", with_weights=False)
        proto = onnx.load(str(path), load_external_data=False)
        symbols = {
            d.dim_param
            for i in proto.graph.input
            for d in i.type.tensor_type.shape.dim
            if d.dim_param
        }
        bindings = {
            name: int(model_spec.input[key])
            for name, key in (("seq", "seq_len"),)
            if name in symbols and key in model_spec.input
        }
        with warnings.catch_warnings():
            # Unknown operators count as zero FLOPs; the dataset accepts that like inference does.
            warnings.simplefilter("ignore", errors.UnknownOperatorWarning)
            return {
                b: extract.from_onnx(proto, batch_size=b, inputs=bindings or None)
                for b in batch_sizes
            }


def _build_one(
    spec_json: str,
    config_hash: str,
    batch_sizes: Sequence[int],
    cache_root: Path | None,
    memory: bool = False,
) -> tuple[str, dict[int, Data] | str]:
    """Worker: graphs of one configuration, from cache or freshly exported; an error as text.

    One export fills both caches. With `memory`, each graph also carries its
    `analytic_memory.MemoryGraph` as ``memory_graph`` (for `prior`).
    """
    cache = GraphCache(cache_root)
    read = cache.get_with_memory if memory else cache.get
    graphs = {b: graph for b in batch_sizes if (graph := read(config_hash, b)) is not None}
    missing = [b for b in batch_sizes if b not in graphs]
    if missing:
        try:
            fresh = export_perfgraphs(spec_json, missing)
            memory_graphs = {b: analytic_memory.from_perfgraph(g) for b, g in fresh.items()}
        except Exception as e:  # a model the exporter or extractor cannot handle is skipped
            return config_hash, f"{config_hash}: {type(e).__name__}: {e}"
        for b, perf in fresh.items():
            graph = perfgraph.to_pyg(perf)
            cache.put(config_hash, b, graph)
            cache.put_memory(config_hash, b, memory_graphs[b])
            if memory:
                graph.memory_graph = memory_graphs[b]
            graphs[b] = graph
    return config_hash, graphs


def build_graphs(
    requests: dict[str, tuple[str, set[int]]],
    *,
    cache_dir: Path | None = None,
    workers: int = 1,
    progress: bool = False,
    graph_fn: GraphFn | None = None,
    memory: bool = False,
) -> tuple[dict[tuple[str, int], Data], list[str]]:
    """Graphs for ``{config hash: (spec JSON, batch sizes)}``; returns graphs and failures.

    `graph_fn` replaces export + extraction (and the cache), for tests and for callers that
    already hold graphs. With `memory` every graph carries ``memory_graph`` (see `_build_one`).
    """
    graphs: dict[tuple[str, int], Data] = {}
    failures: list[str] = []

    def collect(config_hash: str, result: dict[int, Data] | str) -> None:
        if isinstance(result, str):
            failures.append(result)
        else:
            graphs.update({(config_hash, b): g for b, g in result.items()})

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("PerfGraphs", total=len(requests))
        if graph_fn is not None:
            for config_hash, (spec_json, batches) in requests.items():
                collect(config_hash, graph_fn(spec_json, sorted(batches)))
                bar.advance(task)
        elif workers <= 1:
            for config_hash, (spec_json, batches) in requests.items():
                collect(*_build_one(spec_json, config_hash, sorted(batches), cache_dir, memory))
                bar.advance(task)
        else:
            with concurrent.futures.ProcessPoolExecutor(
                max_workers=workers, mp_context=WORKER_CONTEXT
            ) as pool:
                futures = [
                    pool.submit(_build_one, spec_json, h, sorted(batches), cache_dir, memory)
                    for h, (spec_json, batches) in requests.items()
                ]
                for future in concurrent.futures.as_completed(futures):
                    collect(*future.result())
                    bar.advance(task)
    return graphs, failures


def select_metrics(samples: Sequence[Data], have: Sequence[str], keep: Sequence[str]) -> list[Data]:
    """Shallow copies of the samples labelled in any of `keep`, their label columns narrowed
    from `have` order to `keep` order (one model per metric; a checkpoint scored on a dataset
    that has fewer metrics). Priors keep their `targets.METRICS` columns."""
    index = [list(have).index(m) for m in keep]
    out = []
    for s in samples:
        mask = s.y_mask[:, index]
        if bool(mask.any()):
            narrowed = copy.copy(s)
            narrowed.y = s.y[:, index]
            narrowed.y_mask = mask
            out.append(narrowed)
    return out


def select_records(
    rows: Iterable[records_lib.Record], device: str | None = None, *, pool: bool = False
) -> list[records_lib.Record]:
    """The records of one device and label source, or of several; ambiguity is an error that
    lists the choices.

    `device` names one device slug (``DeviceDescriptor.slug()``), optionally followed by
    ``/<label source>``, or several separated by commas (what a pooled checkpoint's
    `label_device` holds). Without it, `pool` takes every device of the one label source and
    device kind the rows have. Several devices need `pool`: a device-aware model reads each
    sample's own device, so a cluster's observations of several GPUs and MIG slices make one
    sample set (`build_samples`); a model that does not read it learns from one device.
    """
    groups: dict[str, list[records_lib.Record]] = collections.defaultdict(list)
    for r in rows:
        groups[f"{r.device.slug()}/{r.label_source.value}"].append(r)
    if not groups:
        raise DatasetError("no records")
    if device is not None:
        chosen: list[str] = []
        for asked in device.split(","):
            matched = [k for k in groups if k == asked or k.split("/", 1)[0] == asked]
            if len(matched) != 1:
                raise DatasetError(
                    f"records come from {sorted(groups)}; choose with --device "
                    + ("(none matched)" if not matched else f"({asked} matched several)")
                )
            chosen.extend(m for m in matched if m not in chosen)
    else:
        chosen = list(groups)
    kinds = {(groups[k][0].device.kind, groups[k][0].label_source) for k in chosen}
    if len(chosen) > 1 and (len(kinds) > 1 or not pool):
        raise DatasetError(
            f"records come from {sorted(groups)}; choose one with --device ("
            + (
                "several devices pool only under one label source and device kind)"
                if len(kinds) > 1
                else "several devices pool only for a device-aware checkpoint)"
            )
        )
    return [r for k in chosen for r in groups[k]]


def digest(
    rows: Iterable[records_lib.Record], memory: targets.MemoryLabel = targets.MemoryLabel.DEVICE
) -> str:
    """sha256 over the keys and labels of `rows`, independent of their order."""
    lines = sorted(
        json.dumps(
            [
                *r.key,
                r.device.slug(),
                r.label_source.value,
                r.status.value,
                *(
                    getattr(r, c)
                    for c in targets.label_columns(r.device.kind.value, memory).values()
                ),
            ]
        )
        for r in rows
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _label(record: records_lib.Record, quantity: str, memory: targets.MemoryLabel) -> float | None:
    value = getattr(record, targets.label_columns(record.device.kind.value, memory)[quantity])
    if value is not None and quantity == "memory_bytes" and memory is targets.MemoryLabel.RESERVED:
        # What the device held less its runtime's context (a record without one has no label).
        value = None if record.context_bytes is None else value - record.context_bytes
    if value is None or not value > 0:
        return None
    return float(value)


def cached_only(rows: Sequence[records_lib.Record], cache_dir: Path | None = None) -> GraphFn:
    """A graph source for `build_samples` that answers from the graph cache and never exports:
    a benchmark over rows whose configurations were exported before (by another dataset of the
    same configurations) scores them in seconds instead of about 8 s of export each."""
    hash_of = {r.spec_json: r.config_hash for r in rows}
    cache = GraphCache(cache_dir)

    def graphs(spec_json: str, batches: Sequence[int]) -> dict[int, Data]:
        found = {b: cache.get_with_memory(hash_of[spec_json], b) for b in batches}
        return {b: graph for b, graph in found.items() if graph is not None}

    return graphs


def build_samples(
    rows: Sequence[records_lib.Record],
    *,
    metrics: Sequence[str] | None = None,
    optimizer: str | None = None,
    memory_label: targets.MemoryLabel = targets.MemoryLabel.DEVICE,
    memory_prior: bool = False,
    cache_dir: Path | None = None,
    workers: int = 1,
    progress: bool = False,
    graph_fn: GraphFn | None = None,
    device_aware: bool = False,
    learnable: Collection[str] | None = None,
) -> tuple[list[Data], DatasetInfo]:
    """Samples (see docs/internals.md) from the records of one device and label source, or,
    for a device-aware model, of several devices of one label source (`select_records(pool=)`).

    Args:
        rows: records, already narrowed with `select_records`.
        metrics: targets to keep; default every metric with at least one label (among
            `learnable`, when given).
        learnable: without `metrics`, the metrics a fine-tune's base has heads for. A
            cluster's observations carry SM activity, which the shipped checkpoint does not
            predict; those labels are left out (`DatasetInfo.left_out`) rather than refused.
        optimizer: keep only this training-mode optimizer; default every one.
        memory_label: the record column memory is learned from (`targets.MemoryLabel`).
        memory_prior: give every sample ``prior_log``, the log analytic memory estimate per
            `targets.METRICS` entry (`prior.log_priors`), for a normaliser fitted with
            ``prior=True``.
        cache_dir, workers, progress, graph_fn: see `build_graphs`.
        device_aware: samples for a device-aware model: each record's GPU or MIG slice, found
            in the hardware table, rides along (`model_input.build`); a device the table does
            not know is an error. Records of several devices make one sample set: the same
            configuration on two devices is two samples.
    """
    rows = select_records(rows, pool=device_aware)
    on = _hardware_devices(rows) if device_aware else {}
    usable = [r for r in rows if not r.censored]
    censored = len(rows) - len(usable)
    train_optimizers = sorted({r.optimizer for r in usable if r.mode == "train"})
    if optimizer is not None:
        if optimizer not in train_optimizers:
            raise DatasetError(f"no training records with optimizer {optimizer!r}")
        train_optimizers = [optimizer]
    unknown = [o for o in train_optimizers if o not in targets.OPTIMIZERS]
    if unknown:
        raise DatasetError(f"optimizers {unknown} have no feature; known: {targets.OPTIMIZERS}")
    # Inference labels do not depend on the optimizer: they join every training sample of the
    # same (config, batch, precision), or stand alone (optimizer "none") where none exists.
    # A sample is keyed (device, config, batch, precision, optimizer); one device's rows
    # leave the device slug the same throughout.
    infer: dict[tuple[str, str, int, str], records_lib.Record] = {}
    by_sample: dict[tuple[str, str, int, str, str], dict[str, records_lib.Record]] = (
        collections.defaultdict(dict)
    )
    for r in usable:
        where = r.device.slug()
        if r.mode == "infer":
            infer.setdefault((where, r.config_hash, r.batch_size, r.precision), r)
        elif r.optimizer in train_optimizers:
            key = (where, r.config_hash, r.batch_size, r.precision, r.optimizer)
            by_sample[key].setdefault("train", r)
    trained = {key[:4] for key in by_sample}
    for infer_key, r in infer.items():
        if infer_key in trained:
            for sample_key, modes in by_sample.items():
                if sample_key[:4] == infer_key:
                    modes["infer"] = r
        else:
            by_sample[(*infer_key, targets.NO_OPTIMIZER)]["infer"] = r

    available = [
        targets.metric(mode, q)
        for mode in targets.MODES
        for q in targets.QUANTITIES
        if any(
            mode in s and _label(s[mode], q, memory_label) is not None for s in by_sample.values()
        )
    ]
    if metrics is not None:
        chosen = targets.validate_metrics(metrics)
    else:
        chosen = tuple(m for m in available if learnable is None or m in learnable)
    if not chosen:
        raise DatasetError(
            "the records carry no labels"
            + ("" if learnable is None or not available else f" of {', '.join(learnable)}")
            + (f"; they have {', '.join(available)}" if available else "")
        )
    missing = [m for m in chosen if m not in available]
    if missing:
        raise DatasetError(f"no labels for {missing}; the records have {available}")

    requests: dict[str, tuple[str, set[int]]] = {}
    for (_, config_hash, batch, _, _), modes in by_sample.items():
        spec_json = next(iter(modes.values())).spec_json
        requests.setdefault(config_hash, (spec_json, set()))[1].add(batch)
    graphs, failures = build_graphs(
        requests,
        cache_dir=cache_dir,
        workers=workers,
        progress=progress,
        graph_fn=graph_fn,
        memory=memory_prior,
    )

    counting = _prior_counting(rows[0], memory_label) if memory_prior else None
    samples = []
    used: dict[tuple[str, str, int, str, str, str], records_lib.Record] = {}
    for (where, config_hash, batch, precision, sample_optimizer), modes in sorted(
        by_sample.items()
    ):
        graph = graphs.get((config_hash, batch))
        if graph is None:
            continue
        values, present = [], []
        for name in chosen:
            mode, quantity = targets.split_metric(name)
            value = _label(modes[mode], quantity, memory_label) if mode in modes else None
            values.append(0.0 if value is None else value)
            present.append(value is not None)
        if not any(present):
            continue
        first = next(iter(modes.values()))
        sample = _sample(graph, first, precision, sample_optimizer, on.get(where), counting)
        sample.y = torch.tensor([values], dtype=torch.float64)
        sample.y_mask = torch.tensor([present], dtype=torch.bool)
        samples.append(sample)
        used.update(((where, *r.key), r) for r in modes.values())
    if not samples:
        raise DatasetError(f"no sample could be built ({len(failures)} graph failures)")
    devices = dict(sorted({r.device.slug(): r.device for r in rows}.items()))
    label_source = rows[0].label_source.value
    counts = collections.Counter(where for where, *_ in used)
    info = DatasetInfo(
        device_kind=rows[0].device.kind.value,
        device=",".join(devices),
        device_name=", ".join(dict.fromkeys(d.name for d in devices.values())),
        label_source=label_source,
        optimizers=tuple(train_optimizers),
        metrics=chosen,
        left_out=tuple(m for m in available if m not in chosen) if metrics is None else (),
        records=len(rows),
        censored=censored,
        samples=len(samples),
        digest=digest(used.values(), memory_label),
        failed=tuple(failures),
        memory_label=memory_label,
        device_aware=device_aware,
        context_bytes=max((r.context_bytes or 0 for r in used.values()), default=0),
        sources=tuple(
            f"{_described(d)} ({label_source}): {counts[slug]} records"
            for slug, d in devices.items()
            if counts[slug]
        ),
        step_time_gpus=tuple(
            dict.fromkeys(
                on[where].gpu.key
                for (where, *_), r in used.items()
                if on and _label(r, "step_time_s", memory_label) is not None
            )
        ),
    )
    return samples, info


def build_bounds(
    rows: Sequence[records_lib.Record],
    info: DatasetInfo,
    *,
    memory_prior: bool = False,
    cache_dir: Path | None = None,
    workers: int = 1,
    graph_fn: GraphFn | None = None,
) -> list[Data]:
    """The out-of-memory rows of `rows` as training samples whose memory label is a bound.

    A task that ran out of memory on a GPU (the harness's cap, or a cluster job killed for it,
    `kubeseer dataset pull`) needed more than the limit it hit, which its ``memory_bytes``
    holds: a sample whose label for the mode's memory metric of `info` is that limit (less the
    record's context for a `RESERVED` label) with ``y_censor`` +1 (`train.masked_task_losses`).
    They join the samples `build_samples` made of the same rows (`info`: its metrics and memory
    label) through `train.train_checkpoint`'s ``censored``. An allocator-peak label, and a CPU's
    address-space cap, bound nothing, so those give none.
    """
    metric_of = {
        mode: targets.metric(mode, "memory_bytes")
        for mode in targets.MODES
        if targets.metric(mode, "memory_bytes") in info.metrics
    }
    limited = [
        r
        for r in select_records(rows, pool=info.device_aware)
        if r.censored
        and r.device.kind.value == "cuda"
        and info.memory_label is not targets.MemoryLabel.ALLOCATOR
        and r.mode in metric_of
        and _label(r, "memory_bytes", info.memory_label) is not None
    ]
    if not limited:
        return []
    requests: dict[str, tuple[str, set[int]]] = {}
    for r in limited:
        requests.setdefault(r.config_hash, (r.spec_json, set()))[1].add(r.batch_size)
    graphs, _ = build_graphs(
        requests, cache_dir=cache_dir, workers=workers, graph_fn=graph_fn, memory=memory_prior
    )
    on = _hardware_devices(limited) if info.device_aware else {}
    counting = _prior_counting(limited[0], info.memory_label) if memory_prior else None
    out = []
    for r in limited:
        graph = graphs.get((r.config_hash, r.batch_size))
        if graph is None:
            continue
        optimizer = r.optimizer if r.mode == "train" else targets.NO_OPTIMIZER
        sample = _sample(graph, r, r.precision, optimizer, on.get(r.device.slug()), counting)
        k = info.metrics.index(metric_of[r.mode])
        values = [0.0] * len(info.metrics)
        values[k] = float(_label(r, "memory_bytes", info.memory_label) or 0.0)
        sample.y = torch.tensor([values], dtype=torch.float64)
        sample.y_mask = torch.tensor([[i == k for i in range(len(info.metrics))]])
        sample.y_censor = torch.zeros(1, len(info.metrics), dtype=torch.int8)
        sample.y_censor[0, k] = 1
        out.append(sample)
    return out


@dataclass(frozen=True)
class _PriorCounting:
    """How the analytic memory estimate counts for a sample set's labels: whether it includes
    the input batch, and on which kind of device (`prior.label_device`)."""

    batch: bool
    device: analytic_memory.DeviceProfile


def _prior_counting(record: records_lib.Record, memory: targets.MemoryLabel) -> _PriorCounting:
    """A memory prior counts the input batch where the labels do, on the labels' kind of
    device."""
    kind = record.device.kind.value
    return _PriorCounting(
        batch=targets.memory_counts_batch(memory, kind, record.label_source.value),
        device=prior.label_device(kind),
    )


def _sample(
    graph: Data,
    record: records_lib.Record,
    precision: str,
    optimizer: str,
    on: mig.Device | None,
    counting: _PriorCounting | None,
) -> Data:
    """What a model reads for `record`'s configuration at its batch (`model_input.build`), with
    its analytic memory estimate where the model learns memory relative to it (`counting`);
    no labels."""
    sample = model_input.build(graph, precision, optimizer, on)
    if counting is not None:
        memory_graph = getattr(graph, "memory_graph", None)
        if memory_graph is None:
            raise DatasetError(
                f"{record.config_hash} at batch {record.batch_size} has no memory graph"
            )
        terms = prior.breakdowns(memory_graph, Precision(precision), optimizer, counting.device)
        sample.prior_log = torch.tensor(
            [prior.log_priors(terms, with_batch=counting.batch)], dtype=torch.float64
        )
    sample.family = record.family
    sample.config_hash = record.config_hash
    sample.job_batch_size = record.batch_size
    return sample


def _hardware_devices(rows: Iterable[records_lib.Record]) -> dict[str, mig.Device]:
    """The hardware table's device of each of `rows`' devices, by slug: the whole GPU, or the
    MIG slice a record names (what the predictor is asked for when it places on that slice).

    Raises:
        DatasetError: the table knows no such GPU or profile.
    """
    found: dict[str, mig.Device] = {}
    for r in rows:
        slug = r.device.slug()
        if slug in found:
            continue
        try:
            found[slug] = mig.device(r.device.name, r.device.mig_profile)
        except (gpus.UnknownGpuError, mig.UnknownProfileError) as e:
            raise DatasetError(
                f"{_described(r.device)} is not in the hardware table (kubeseer.hardware): a "
                "device-aware model needs its specs"
            ) from e
    return found


def _described(device: records_lib.DeviceDescriptor) -> str:
    """A device as a person names it: the GPU, and its MIG slice if any."""
    return device.name + (f" MIG {device.mig_profile}" if device.mig_profile else "")
