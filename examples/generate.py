"""Write the sample DLJobs in this directory, each with its ONNX model in a ConfigMap.

The models are multi-layer perceptrons whose weights are *external data* that is not shipped:
kubeseer reads only the graph (operators, shapes, element types), never weight bytes, so a
multi-billion-parameter model fits in a ConfigMap of a few kilobytes. Sizes are chosen so that the
samples land on different resources of the dev cluster (deploy/devcluster/nodes.yaml): a small
MIG slice, a larger slice, a whole GPU, and a two-replica Job.

    .venv/bin/python examples/generate.py     # rewrites examples/*.yaml
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import onnx
import yaml
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
OPSET = 17


@dataclass(frozen=True)
class Sample:
    """One sample: a DLJob running an MLP of `layers` hidden layers of width `width`."""

    name: str
    description: str
    mode: str
    batch_size: int
    features: int
    width: int
    layers: int
    classes: int
    precision: str = "fp32"
    replicas: int = 1
    max_slowdown: float | None = None


SAMPLES = (
    Sample(
        "mlp-infer-small",
        "batch inference of a 37M-parameter MLP that may run up to 4x slower than on a whole GPU: "
        "a small MIG slice",
        mode="infer",
        batch_size=256,
        features=4096,
        width=4096,
        layers=2,
        classes=1000,
        max_slowdown=4.0,
    ),
    Sample(
        "mlp-train-slice",
        "fp16 training of a 270M-parameter MLP with Adam, up to 3x slower than on a whole "
        "GPU: a larger MIG slice",
        mode="train",
        batch_size=512,
        features=8192,
        width=8192,
        layers=4,
        classes=1000,
        precision="fp16",
        max_slowdown=3.0,
    ),
    Sample(
        "mlp-train-whole-gpu",
        "training of a 3.2B-parameter MLP with Adam: more than any slice, a whole GPU",
        mode="train",
        batch_size=64,
        features=16384,
        width=16384,
        layers=12,
        classes=1000,
    ),
    Sample(
        "mlp-train-replicas",
        "two data-parallel replicas of a small training job: a batch/v1 Job",
        mode="train",
        batch_size=128,
        features=1024,
        width=2048,
        layers=3,
        classes=10,
        replicas=2,
    ),
)


def _external(name: str, dims: list[int], offset: int) -> tuple[TensorProto, int]:
    """A float initializer whose bytes live in a weights file that is not shipped."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    length = 4
    for d in dims:
        length *= d
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor, offset + length


def build_mlp(sample: Sample) -> onnx.ModelProto:
    """Gemm + Relu layers with a symbolic batch dimension named `batch`."""
    nodes: list[onnx.NodeProto] = []
    initializers: list[TensorProto] = []
    offset = 0
    previous, width_in = "input", sample.features
    sizes = [sample.width] * sample.layers + [sample.classes]
    for i, width_out in enumerate(sizes):
        weight, offset = _external(f"w{i}", [width_in, width_out], offset)
        bias, offset = _external(f"b{i}", [width_out], offset)
        initializers += [weight, bias]
        out = f"h{i}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{i}", f"b{i}"], [out], name=f"fc{i}"))
        if i < len(sizes) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"a{i}"], name=f"relu{i}"))
            out = f"a{i}"
        previous, width_in = out, width_out
    graph = helper.make_graph(
        nodes,
        sample.name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sample.features])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", sample.classes])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return model


def manifests(sample: Sample) -> list[dict[str, object]]:
    """The ConfigMap holding the model and the DLJob naming it."""
    model = build_mlp(sample).SerializeToString()
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{sample.name}-model"},
        "binaryData": {"model.onnx": base64.b64encode(model).decode()},
    }
    job: dict[str, object] = {
        "apiVersion": "kubeseer.io/v1alpha1",
        "kind": "DLJob",
        "metadata": {"name": sample.name},
        "spec": {
            "model": {"configMapRef": {"name": f"{sample.name}-model", "key": "model.onnx"}},
            "mode": sample.mode,
            "batchSize": sample.batch_size,
            "precision": sample.precision,
            "replicas": sample.replicas,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/kubeseer-demo/mlp:1",
                            "args": [f"--{sample.mode}", f"--batch-size={sample.batch_size}"],
                        }
                    ],
                    # Lets the pods run on the dev cluster's fake (KWOK) nodes; harmless elsewhere.
                    "tolerations": [
                        {
                            "key": "kwok.x-k8s.io/node",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ],
                }
            },
        },
    }
    if sample.max_slowdown is not None:
        spec = job["spec"]
        assert isinstance(spec, dict)
        spec["placement"] = {"maxSlowdown": sample.max_slowdown}
    return [config_map, job]


def main() -> None:
    """Rewrite every sample file."""
    for sample in SAMPLES:
        path = HERE / f"{sample.name}.yaml"
        header = f"# {sample.description}\n# Generated by examples/generate.py.\n"
        body = yaml.safe_dump_all(manifests(sample), sort_keys=False, width=100)
        path.write_text(header + body)
        print(path.relative_to(HERE.parent))


if __name__ == "__main__":
    main()
