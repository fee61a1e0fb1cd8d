"""`kubeseer dataset pull`: the cluster's observations as a measured dataset for `train --init`.

The measured dataset (`kubeseer.measure.records`, docs/dataset.md) regenerates each model's
graph from a zoo spec; a cluster's jobs run arbitrary ONNX models, so the pull writes their
PerfGraphs into the predictor's graph cache (`predictor.dataset.GraphCache`, the directory
`kubeseer train` reads first) under a config hash derived from the model's sha256 and its
symbolic dimension bindings, and the records name that hash. The graph comes from the store
(the operator keeps each job's PerfGraph there) or, failing that, from an ONNX file of the same
sha256 in `--models DIR`; an observation with neither is skipped and listed.

Rows: one per (device, configuration, batch, mode, precision, optimizer), as the harness
writes them. Several runs of one configuration agree closely on memory, and the slice must
hold the largest, so the row keeps the largest observed peak; SM activity is their mean. A
configuration that only ever ran out of memory becomes a censored row (`status = oom`,
`memory_bytes` = the largest limit it exceeded). The device is the GPU the profiler saw
(`DeviceDescriptor` with its MIG profile, as the harness records a MIG instance), the label
source `measured`. The observations carry no step times (the profiler cannot see steps).

The labels are NVML device memory (the dataset's `memory_bytes`): what the job's process holds
on its device, the CUDA context and everything the caching allocator reserved. Each row also
carries the runtime context (`context_bytes`, the documented CUDA context of a torch 2 / CUDA 12
runtime unless the cluster's runtime is another, `--context-mib`), so the reservation less the
context is a label too: the one the shipped checkpoint learned (`--memory-label reserved`), which
adds the same context back when it predicts. A checkpoint that learned allocator peaks
(`--memory-label allocator`) has no label here, because NVML cannot see inside a job's
allocator, and `train --init` says so. Observations from the NVML stand-in are left out unless
asked for: they are not measurements.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kubeseer import units
from kubeseer.measure import records, storage
from kubeseer.observations import graphs, record
from kubeseer.observations import store as store_mod

if TYPE_CHECKING:
    from kubeseer.predictor import perfgraph

PLAN = "cluster-observations"
"""The `plan` column of pulled rows."""
STANDIN_SOURCE = "nvml-standin"
_MAX_MODEL_BYTES = 2 * units.GIB


@dataclass
class PullResult:
    """What a pull wrote and what it left out (with the reason)."""

    rows: dict[str, int] = field(default_factory=dict)
    graphs: int = 0
    skipped: list[str] = field(default_factory=list)


def config_hash(model_digest: str, inputs_json: str) -> str:
    """16 hex naming a (model, bindings) in the graph cache, like a zoo spec's hash."""
    return hashlib.sha256(f"{model_digest}\n{inputs_json}".encode()).hexdigest()[:16]


def _usable(o: record.Observation, include_standin: bool) -> str | None:
    """Why an observation cannot become a row, or None."""
    if o.observed_source == STANDIN_SOURCE and not include_standin:
        return "observed by the NVML stand-in, not measured"
    if o.outcome is record.Outcome.FAILED:
        return "the attempt failed for a reason other than memory"
    if o.memory_label is None:
        return "no memory was observed (no profiler report)"
    return None


def _device(o: record.Observation) -> records.DeviceDescriptor:
    return records.DeviceDescriptor(
        kind=records.DeviceKind.CUDA,
        name=o.gpu_model_name or o.gpu_product,
        memory_bytes=o.usable_memory_bytes or 0,
        sm_count=None,
        cores=None,
        mig_profile=o.mig_profile,
        driver_version=None,
        cuda_version=None,
        torch_version="unknown",
    )


def documented_context_bytes() -> int:
    """The CUDA context of a torch 2 / CUDA 12 runtime as the derivation documents it
    (`kubeseer.measure.gpu_memory.RUNTIMES`), the runtime a cluster's jobs are assumed to run."""
    from kubeseer.measure import gpu_memory

    return gpu_memory.RUNTIMES["torch2-cuda12"].context_bytes


def _row(
    group: list[record.Observation], graph_flops: int, graph_params: int, context_bytes: int
) -> records.Record:
    first = group[0]
    measured = [o for o in group if not o.censored]
    status = records.Status.OK if measured else records.Status.OUT_OF_MEMORY
    labels = measured or group
    memory = max(int(o.memory_label or 0) for o in labels)
    sms = [o.observed_sm_activity_percent for o in measured if o.observed_sm_activity_percent]
    spec = {
        "source": "cluster-observation",
        "family": first.family,
        "model_digest": first.model_digest,
        "inputs": first.inputs(),
    }
    return records.Record(
        schema_version=records.SCHEMA_VERSION,
        config_hash=config_hash(first.model_digest, first.inputs_json),
        family=first.family,
        spec_json=json.dumps(spec, sort_keys=True),
        batch_size=first.batch_size,
        mode=first.mode,
        precision=first.precision,
        optimizer=first.optimizer,
        device=_device(first),
        label_source=records.LabelSource.MEASURED,
        status=status,
        plan=PLAN,
        flops=graph_flops,
        params=graph_params,
        warmup_iterations=0,
        timed_iterations=0,
        step_time_mean_s=None,
        step_time_median_s=None,
        step_time_p95_s=None,
        step_cpu_time_median_s=None,
        memory_bytes=memory,
        context_bytes=context_bytes,
        allocator_peak_allocated_bytes=None,
        allocator_peak_reserved_bytes=None,
        rss_baseline_bytes=None,
        rss_peak_delta_bytes=None,
        sm_util_mean_percent=sum(sms) / len(sms) if sms and status is records.Status.OK else None,
        sm_util_peak_percent=None,
        utilisation_source=first.observed_sm_source if sms else None,
        utilisation_samples=sum(o.observed_samples for o in measured) if measured else None,
        energy_j=None,
        threads=None,
        started_at=min(o.window_start or o.finished_at for o in group),
        finished_at=max(o.finished_at for o in group),
    )


class _Models:
    """ONNX files of a directory, by sha256 (hashed once, on first need)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._by_digest: dict[str, Path] | None = None

    def find(self, digest: str) -> Path | None:
        if self.directory is None:
            return None
        if self._by_digest is None:
            self._by_digest = {}
            for path in sorted(self.directory.rglob("*.onnx")):
                if path.stat().st_size <= _MAX_MODEL_BYTES:
                    self._by_digest[hashlib.sha256(path.read_bytes()).hexdigest()] = path
        return self._by_digest.get(digest)


def pull(
    store: store_mod.Store,
    out: Path,
    *,
    models: Path | None = None,
    cache_dir: Path | None = None,
    include_standin: bool = False,
    context_bytes: int | None = None,
) -> PullResult:
    """Write the store's observations under `out` (one dataset per device, which a
    device-aware checkpoint's fine-tune reads together: `dataset.select_records(pool=True)`)
    and their graphs into the graph cache; each row's runtime context is `context_bytes`, by
    default `documented_context_bytes()`.

    Raises:
        store_mod.StoreError: the store cannot be listed.
    """
    from kubeseer.predictor import analytic_memory, dataset
    from kubeseer.predictor import perfgraph as perfgraph_mod

    context = documented_context_bytes() if context_bytes is None else context_bytes
    result = PullResult()
    found = store.read()
    result.skipped.extend(f"damaged file {d}" for d in found.damaged)
    groups: dict[tuple[str, str, str, str, str, str, str], list[record.Observation]] = defaultdict(
        list
    )
    for o in found.observations:
        why = _usable(o, include_standin)
        if why is not None:
            result.skipped.append(f"{o.namespace}/{o.dljob} attempt {o.attempt}: {why}")
            continue
        key = (
            _device(o).slug(),
            o.model_digest,
            o.inputs_json,
            str(o.batch_size),
            o.mode,
            o.precision,
            o.optimizer,
        )
        groups[key].append(o)
    cache = dataset.GraphCache(cache_dir)
    onnx_files = _Models(models)
    by_device: dict[str, list[records.Record]] = defaultdict(list)
    for key, group in groups.items():
        first = group[0]
        chash = config_hash(first.model_digest, first.inputs_json)
        graph = _graph(store, first, onnx_files, result)
        if graph is None:
            continue
        if cache.get(chash, first.batch_size) is None:
            cache.put(chash, first.batch_size, perfgraph_mod.to_pyg(graph))
            cache.put_memory(chash, first.batch_size, analytic_memory.from_perfgraph(graph))
            result.graphs += 1
        by_device[key[0]].append(_row(group, graph.flops, graph.params, context))
    for slug, rows in by_device.items():
        storage.write_part(out / slug, rows)
        result.rows[slug] = len(rows)
    return result


def _graph(
    store: store_mod.Store,
    o: record.Observation,
    onnx_files: _Models,
    result: PullResult,
) -> perfgraph.PerfGraph | None:
    """The observation's PerfGraph from the store, else from a local ONNX file; None (and a
    reason in `result.skipped`) when neither has it."""
    from kubeseer.predictor import errors, extract

    where = f"{o.namespace}/{o.dljob} attempt {o.attempt}"
    if o.perfgraph_ref:
        try:
            data = store.get_graph(o.perfgraph_ref)
            if data is not None:
                return graphs.from_bytes(data)
        except (store_mod.StoreError, graphs.GraphFileError) as e:
            result.skipped.append(f"{where}: stored PerfGraph unusable ({e})")
    path = onnx_files.find(o.model_digest)
    if path is None:
        result.skipped.append(
            f"{where}: no PerfGraph stored and no ONNX file with sha256 {o.model_digest}"
        )
        return None
    try:
        return extract.from_onnx(path, batch_size=o.batch_size, inputs=o.inputs() or None)
    except errors.GraphError as e:
        result.skipped.append(f"{where}: {path}: {e}")
        return None


def summarise(result: PullResult) -> Iterable[str]:
    """Lines for the command's output."""
    for slug, count in sorted(result.rows.items()):
        yield f"{slug}: {count} rows"
    yield f"{result.graphs} PerfGraphs added to the graph cache"
    for reason in result.skipped:
        yield f"skipped: {reason}"
