"""Serving predictions with torch or with ONNX Runtime: size, accuracy and speed, side by side.

The image (deploy/Dockerfile) needs a runtime for SeerNet-Multi's forward pass. This script
exports the shipped checkpoint's network to ONNX (the PerfGraph stays a Python input: node,
edge and global features, edges, the graph index), runs both runtimes on the same real graphs
(the `onnx` package's light models and zoo models, at several batches, both modes), and reports:

* accuracy: the largest difference between the two runtimes' decoded predictions (memory,
  SM utilisation, step time), relative to torch's;
* speed: median wall time of one forward pass per request, torch over ONNX Runtime;
* size: what each runtime adds to the image (installed bytes of the distributions it needs).

Usage: .venv/bin/python bench/serving_runtime.py [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from torch import nn

from kubeseer import zoo
from kubeseer.prediction import Precision
from kubeseer.predictor import (
    analytic_memory,
    api,
    extract,
    model_input,
    perfgraph,
    prior,
    seernet,
)
from kubeseer.zoo import export

LIGHT = (
    "light_resnet50",
    "light_densenet121",
    "light_inception_v1",
    "light_vgg19",
    "light_zfnet512",
)
ZOO = {
    "mobilenet_v2": {},
    "resnet50": {},
    "vit-b16": {},
    "bert-base": {"seq": 128},
    "gpt2-small": {"seq": 256},
}
BATCHES = (1, 8, 32)
REPEATS = 20


class Forward(nn.Module):
    """The network over plain tensors: what ONNX can take as inputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor, u: torch.Tensor
    ) -> torch.Tensor:
        batch = torch.zeros(x.shape[0], dtype=torch.long)
        out = self.model.block(x, edge_index, edge_attr, u, batch)
        return torch.cat([head(out.u) for head in self.model.heads], dim=-1)


def distributions_bytes(names: list[str]) -> int:
    total = 0
    for name in names:
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
    return total


def samples(predictor: api.Predictor, scratch: Path) -> list[tuple[str, Any]]:
    models: list[tuple[str, Path, dict[str, int]]] = []
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    models += [(n, light / f"{n}.onnx", {}) for n in LIGHT]
    for name, inputs in ZOO.items():
        path = export.export_onnx(
            zoo.standard_spec(name), scratch / f"{name}.onnx", with_weights=False
        )
        models.append((name, path, inputs))
    out = []
    normaliser = predictor.checkpoint.normaliser
    for name, path, inputs in models:
        for batch in (1,) if name.startswith("light_") else BATCHES:
            graph = extract.from_onnx(path, batch_size=batch, inputs=inputs)
            memory_graph = analytic_memory.from_perfgraph(graph)
            for optimizer in ("none", "adam"):
                sample = model_input.build(perfgraph.to_pyg(graph), Precision.FP32.value, optimizer)
                if normaliser.memory_prior:  # as api.Predictor does for every request
                    device = prior.label_device(predictor.checkpoint.label_device_kind)
                    terms = prior.breakdowns(memory_graph, Precision.FP32, optimizer, device)
                    logs = prior.log_priors(
                        terms, with_batch=predictor.checkpoint.memory_counts_batch
                    )
                    sample.prior_log = torch.tensor([logs], dtype=torch.float64)
                out.append((f"{name} b{batch} {optimizer}", normaliser.features(sample)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    predictor = api.Predictor.load(None)
    model = predictor.model.eval()
    assert isinstance(model, seernet.SeerNetMulti)
    forward = Forward(model).eval()
    with tempfile.TemporaryDirectory() as scratch:
        graphs = samples(predictor, Path(scratch))
        first = graphs[0][1]
        onnx_path = Path(scratch) / "seernet.onnx"
        torch.onnx.export(
            forward,
            (first.x, first.edge_index, first.edge_attr, first.u),
            str(onnx_path),
            input_names=["x", "edge_index", "edge_attr", "u"],
            output_names=["y"],
            dynamic_shapes={
                "x": {0: torch.export.Dim("nodes", min=2)},
                "edge_index": {1: torch.export.Dim("edges", min=2)},
                "edge_attr": {0: torch.export.Dim("edges", min=2)},
                "u": None,
            },
            opset_version=18,
            dynamo=True,
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        onnx_bytes = onnx_path.stat().st_size
    normaliser = predictor.checkpoint.normaliser
    worst = 0.0
    torch_s, ort_s = [], []
    for _, sample in graphs:
        feeds = {
            "x": sample.x.numpy(),
            "edge_index": sample.edge_index.numpy(),
            "edge_attr": sample.edge_attr.numpy(),
            "u": sample.u.numpy(),
        }
        with torch.inference_mode():
            started = time.perf_counter()
            for _ in range(REPEATS):
                reference = forward(sample.x, sample.edge_index, sample.edge_attr, sample.u)
            torch_s.append((time.perf_counter() - started) / REPEATS)
        started = time.perf_counter()
        for _ in range(REPEATS):
            (got,) = session.run(["y"], feeds)
        ort_s.append((time.perf_counter() - started) / REPEATS)
        priors = normaliser.log_priors(sample)
        a = normaliser.decode_targets(reference.double(), priors).numpy()
        b = normaliser.decode_targets(torch.from_numpy(got).double(), priors).numpy()
        worst = max(worst, float(np.max(np.abs(b - a) / np.maximum(np.abs(a), 1e-12))))
    torch_stack = ["torch", "torch_geometric"] + [
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if d.metadata["Name"].startswith("nvidia-") and d.metadata["Name"] != "nvidia-ml-py"
    ]
    result = {
        "graphs": len(graphs),
        "max_relative_difference": worst,
        "torch_forward_ms_median": statistics.median(torch_s) * 1e3,
        "onnxruntime_forward_ms_median": statistics.median(ort_s) * 1e3,
        "speed_ratio_torch_over_onnxruntime": statistics.median(torch_s) / statistics.median(ort_s),
        "torch_stack_bytes": distributions_bytes(torch_stack),
        "torch_alone_bytes": distributions_bytes(["torch"]),
        "onnxruntime_bytes": distributions_bytes(["onnxruntime"]),
        "seernet_onnx_bytes": onnx_bytes,
    }
    result["size_ratio_torch_stack_over_onnxruntime"] = result["torch_stack_bytes"] / (
        result["onnxruntime_bytes"] + onnx_bytes
    )
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
