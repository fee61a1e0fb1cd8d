"""How fast is PerfGraph extraction, against onnx-tool's own profile of the same file?

ResNet-50 and BERT-base (the zoo's standard specs, sequence length 128) are exported twice: by
`kubeseer.zoo.export.export_onnx` (torch's default exporter, weights in a sidecar data file, as
kubeseer itself exports) and by torch's TorchScript exporter (weights inline in the .onnx file).
For each file, in the same run:

* kubeseer: `extract.from_onnx(path, batch_size=8)` -- read, sha256, parse, bind, shape
  inference, features. The external data file is never opened.
* onnx-tool 1.0.1: its own `Model(path)` load (which reads the weights), `shape_infer` at batch
  8 and `profile` -- the work onnx-tool needs for FLOPs alone. The last column is its
  `shape_infer` + `profile` on an already loaded model, for scale: the part of its work that
  does not depend on the file format.

Medians over --repeat runs after one warm-up run (the first call in a process also loads ONNX's
operator schemas, ~25 ms, paid once per process). Goal: ResNet-50 in at most 50 ms and faster
than onnx-tool.

    .venv/bin/python bench/perfgraph.py [--repeat 20] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_tool
import torch

from kubeseer import zoo
from kubeseer.predictor import extract, opcount
from kubeseer.zoo import export as zoo_export

BATCH = 8
MODELS = ("resnet50", "bert-base")


def export(name: str, path: Path, *, inline: bool) -> None:
    """Export a zoo standard model with a symbolic batch (and sequence) dimension."""
    spec = zoo.standard_spec(name)
    if not inline:
        zoo_export.export_onnx(spec, path)
        return
    model = zoo.build_model(spec).eval()
    inputs, _ = zoo.example_batch(spec, 2, torch.device("cpu"))
    axes = {0: "batch", 1: "seq"} if inputs[0].dim() == 2 else {0: "batch"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            model, inputs, path, dynamo=False, input_names=["x"], dynamic_axes={"x": axes}
        )


def bindings(path: Path) -> dict[str, int]:
    """Bind every non-batch symbolic input dimension to the zoo's sequence length (128)."""
    proto = onnx.load(str(path), load_external_data=False)
    symbols = {
        d.dim_param
        for vi in proto.graph.input
        for axis, d in enumerate(vi.type.tensor_type.shape.dim)
        if d.dim_param and axis > 0
    }
    return dict.fromkeys(symbols, 128)


def onnx_tool_load(path: Path) -> object:
    model = onnx_tool.Model(str(path), {"verbose": False})
    model.graph.graph_reorder_nodes()
    return model.graph


def onnx_tool_profile(graph: object, shapes: dict[str, np.ndarray]) -> None:
    graph.shape_infer(shapes)
    graph.profile()


def input_arrays(path: Path, symbols: dict[str, int]) -> dict[str, np.ndarray]:
    proto = onnx.load(str(path), load_external_data=False)
    weights = {init.name for init in proto.graph.initializer}
    arrays = {}
    for vi in proto.graph.input:
        if vi.name in weights:
            continue
        dims = [
            d.dim_value
            if d.HasField("dim_value")
            else (BATCH if axis == 0 else symbols[d.dim_param])
            for axis, d in enumerate(vi.type.tensor_type.shape.dim)
        ]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        arrays[vi.name] = np.zeros(dims, dtype=dtype)
    return arrays


def median_seconds(run: Callable[[], object], repeat: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workdir", type=Path, help="keep the exported models here")
    args = parser.parse_args()
    opcount.register_missing_operators()  # IsNaN/IsInf for onnx-tool's own pipeline, too
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kubeseer-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"batch {BATCH}, median of {args.repeat} runs; models in {workdir}")
    header = f"{'model':<10} {'weights':<12} {'file MB':>8} {'nodes':>6} {'kubeseer':>10} "
    print(header + f"{'onnx-tool':>11} {'ratio':>7} {'(its infer+profile)':>20}")
    for name in MODELS:
        for inline in (False, True):
            path = workdir / f"{name}-{'torchscript' if inline else 'zoo'}.onnx"
            if not path.exists():
                export(name, path, inline=inline)
            symbols = bindings(path)
            graph = extract.from_onnx(path, batch_size=BATCH, inputs=symbols or None)
            ours = median_seconds(
                lambda p=path, s=symbols: extract.from_onnx(p, batch_size=BATCH, inputs=s or None),
                args.repeat,
            )
            shapes = input_arrays(path, symbols)
            try:
                peer = median_seconds(
                    lambda p=path, s=shapes: onnx_tool_profile(onnx_tool_load(p), s),
                    max(3, args.repeat // 4),
                )
                loaded = onnx_tool_load(path)
                profile_only = median_seconds(
                    lambda g=loaded, s=shapes: onnx_tool_profile(g, s), args.repeat
                )
                peer_text = f"{peer * 1e3:9.1f}ms"
                ratio = f"{peer / ours:6.1f}x"
                profile_text = f"{profile_only * 1e3:9.1f}ms"
            except Exception as e:  # a failure of the peer is a result, not a crash
                peer_text, ratio, profile_text = f"fails: {type(e).__name__}", "-", "-"
            size = sum(f.stat().st_size for f in workdir.glob(path.name + "*")) / 1e6
            label = "inline" if inline else "sidecar"
            print(
                f"{name:<10} {label:<12} {size:8.1f} {graph.num_nodes:6d} {ours * 1e3:8.1f}ms "
                f"{peer_text:>11} {ratio:>7} {profile_text:>20}   ({graph.flops / 1e9:.1f} GFLOPs)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
