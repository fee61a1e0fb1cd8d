"""Real image architectures as PerfGraphs: timm models exported to ONNX with random weights.

The public GPU step times and out-of-memory boundaries (`shared/data/public-gpu/timm`) were
measured on timm architectures; to learn from them the predictor needs each one's PerfGraph.
`timm.create_model(name, pretrained=False)` builds the architecture with random weights (nothing
is downloaded), torch's TorchScript exporter writes it with a dynamic batch (the exporter a user
of torch 2 reaches by default for such models; H1's tests/unit/predictor/test_timm_exports.py
shows it binds at any batch), and the weight bytes are dropped before the file is cached:
extraction reads initializers' names, shapes and types, never their values. So each cached
model is kilobytes, not the hundreds of megabytes of its weights.

Files live under ``<cache>/timm-onnx/timm-<version>-torch-<version>/<name>-<img>.onnx`` (cache:
`dataset.default_cache_dir`); an architecture that cannot be exported is recorded once in
``failures.jsonl`` beside them, with the reason, and not tried again. PerfGraphs and memory
graphs go to the dataset's `dataset.GraphCache` under `config_hash(name, img)`, like the zoo's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import signal
import tempfile
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from torch_geometric.data import Data

from kubeseer.predictor import analytic_memory, dataset, perfgraph

OPSET: Final[int] = 17
EXPORT_TIMEOUT_S: Final[int] = 600
"""An export that takes longer is recorded as failed (a few of timm's largest graphs trace for
many minutes on one core)."""

KEPT_INITIALIZER_BYTES: Final[int] = 4096
"""Initializers up to this size keep their values (shape constants that extraction may read);
larger ones keep name, shape and type only."""


class ExportError(RuntimeError):
    """An architecture that timm cannot build or torch cannot export (the reason is kept)."""


def _versions() -> str:
    import timm
    import torch

    return f"timm-{timm.__version__}-torch-{torch.__version__}"


def cache_root() -> Path:
    """Where this timm and torch's exports are cached."""
    return dataset.default_cache_dir() / "timm-onnx" / _versions()


def onnx_path(name: str, img: int) -> Path:
    """The cached export of `name` at `img` x `img` pixels."""
    if not name.replace("_", "").replace(".", "").isalnum():
        raise ExportError(f"{name!r} is not a timm model name")
    return cache_root() / f"{name}-{img}.onnx"


def config_hash(name: str, img: int) -> str:
    """The key of `name` at `img` in the graph cache and in samples (alphanumeric, like the
    zoo's config hashes)."""
    text = json.dumps({"source": "timm", "model": name, "img": img, "versions": _versions()})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def failures() -> dict[str, str]:
    """`<name>-<img>` -> why its export failed, for every architecture tried and failed."""
    path = cache_root() / "failures.jsonl"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out[entry["key"]] = entry["error"]
    return out


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise ExportError(f"export took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def export(name: str, img: int, *, timeout_s: int = EXPORT_TIMEOUT_S) -> Path:
    """The cached export of `name` at `img`, exporting it first if needed.

    Raises:
        ExportError: timm cannot build it, torch cannot export it, or it took too long; the
            failure is recorded and raised again on the next call without another attempt.
    """
    path = onnx_path(name, img)
    if path.exists():
        return path
    key = f"{name}-{img}"
    known = failures().get(key)
    if known is not None:
        raise ExportError(known)
    try:
        with _deadline(timeout_s):
            data = _export_bytes(name, img)
    except Exception as e:  # any failure of timm or the exporter is this architecture's
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        path.parent.mkdir(parents=True, exist_ok=True)
        with (path.parent / "failures.jsonl").open("a") as handle:
            handle.write(json.dumps({"key": key, "error": reason}) + "\n")
        raise ExportError(reason) from e
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(path)
    return path


def export_all(
    architectures: Sequence[tuple[str, int]],
    *,
    workers: int,
    batches: Mapping[tuple[str, int], Collection[int]] | None = None,
) -> dict[str, str]:
    """Export every one of `architectures` (name, image size) not cached yet, `workers` processes
    at a time; the ones that fail, ``"<name>-<img>"`` to why.

    An export is one traced forward pass and the exporter's passes, single-threaded for most of
    its time, so on a fresh machine (about 1,200 architectures, hours on one core) processes
    are what use the cores. Each worker gets an equal share of the CPU threads. Failures are
    recorded in ``failures.jsonl`` as `export` records them.

    With `batches`, a worker also extracts each exported architecture's PerfGraphs at its
    batch sizes into the graph cache (`graphs`), so that the samples built next read them
    instead of extracting some 3,600 graphs in one process. An extraction that fails is left
    to the caller's own `graphs` call, which raises it where the architecture is reported.
    """
    cache = dataset.GraphCache()
    jobs = [
        (name, img, sorted((batches or {}).get((name, img), ()))) for name, img in architectures
    ]
    todo = [job for job in jobs if not _prepared(*job, cache)]
    names, images, wanted = [j[0] for j in todo], [j[1] for j in todo], [j[2] for j in todo]
    if workers <= 1:
        reasons = list(map(_export_or_reason, names, images, wanted))
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=dataset.WORKER_CONTEXT,
            initializer=_use_threads,
            initargs=(threads,),
        ) as pool:
            reasons = list(pool.map(_export_or_reason, names, images, wanted))
    return {
        f"{n}-{i}": why for n, i, why in zip(names, images, reasons, strict=True) if why is not None
    }


def _prepared(name: str, img: int, wanted: Sequence[int], cache: dataset.GraphCache) -> bool:
    """Exported, and every graph in `wanted` cached with its memory graph."""
    key = config_hash(name, img)
    return onnx_path(name, img).exists() and all(cache.memory_path(key, b).exists() for b in wanted)


def _use_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _export_or_reason(name: str, img: int, batches: Sequence[int] = ()) -> str | None:
    """`export` (and `graphs` at `batches`) in a worker: None once cached, else why the export
    failed (an exception would be pickled across the process boundary with its whole
    traceback)."""
    try:
        export(name, img)
    except ExportError as e:
        return str(e)
    if batches:
        # any extraction failure raises again in the caller's `graphs`, which reports it
        with contextlib.suppress(Exception):
            graphs(name, img, batches)
    return None


def _export_bytes(name: str, img: int) -> bytes:
    import onnx
    import timm
    import torch
    from onnx import external_data_helper

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    with tempfile.TemporaryDirectory(prefix="kubeseer-timm-") as tmp:
        target = Path(tmp) / "model.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.randn(2, 3, img, img),),
                target,
                input_names=["input"],
                output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )
        del model
        proto = onnx.load(str(target), load_external_data=False)
    for tensor in proto.graph.initializer:
        if len(tensor.raw_data) > KEPT_INITIALIZER_BYTES:
            external_data_helper.set_external_data(tensor, location="weights.bin")
            tensor.ClearField("raw_data")
    return bytes(proto.SerializeToString())


def graphs(
    name: str, img: int, batch_sizes: Sequence[int], cache: dataset.GraphCache | None = None
) -> dict[int, Data]:
    """PyG PerfGraphs of `name` at each batch size, each carrying its ``memory_graph``.

    Read from the graph cache where present; otherwise extracted from the cached export (which
    is made first if needed) and stored. A cached memory graph without module paths predates
    their reading (a TorchScript export always names them) and is extracted again.

    Raises:
        ExportError: the architecture cannot be exported.
        kubeseer.predictor.errors.PredictionError: its export cannot be extracted.
    """
    from kubeseer.predictor import errors, extract

    cache = cache or dataset.GraphCache()
    key = config_hash(name, img)
    out = {
        b: g
        for b in batch_sizes
        if (g := cache.get_with_memory(key, b)) is not None and g.memory_graph.scoped
    }
    missing = [b for b in batch_sizes if b not in out]
    if not missing:
        return out
    model = export(name, img).read_bytes()
    for batch in missing:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExtractionWarning)
            perf = extract.from_onnx(model, batch_size=batch)
        graph = perfgraph.to_pyg(perf)
        memory_graph = analytic_memory.from_perfgraph(perf)
        cache.put(key, batch, graph)
        cache.put_memory(key, batch, memory_graph)
        graph.memory_graph = memory_graph
        out[batch] = graph
    return out
