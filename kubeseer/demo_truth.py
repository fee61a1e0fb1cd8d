"""What the demo's jobs would use on a GPU, derived without one: the demo's observed values.

On a machine without a GPU nothing can be measured, and an "observation" copied from the
prediction would show nothing. The demo instead takes each pod's GPU memory from a source that
never saw the predictor: the memory derivation of `kubeseer.measure.gpu_memory` (label source
`derived-allocator-replay`, docs/dataset.md). The example's ONNX graph is read back as the
zoo's MLP family (the samples of `examples/` are Gemm/Relu chains, exactly that family's
architecture), the zoo builds that model on the meta device, its training or inference step is
traced allocation by allocation and replayed through the model of PyTorch's caching allocator,
and the runtime's context is added. What NVML would show for the process is the context plus
the allocator's reserved peak on the pod's own device (`observed_bytes`): the replay is bounded
by the device as the allocator is, keeping cached segments while there is room, releasing them
and retrying when there is not, and running out of memory when the job needs more than the
device holds. What the job needs at least, the smallest capacity it runs in, is kept beside it
(`required_bytes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import onnx

from kubeseer import zoo

LABEL_SOURCE = "derived-allocator-replay"
"""The derivation's label source (docs/dataset.md), named wherever a derived figure is shown."""


class NotDerivableError(ValueError):
    """The model is not an architecture the derivation can rebuild (only the MLP family)."""


@dataclass(frozen=True)
class Derived:
    """A pod's derived GPU memory (bytes) on its device.

    Attributes:
        spec: the zoo model the derivation built.
        runtime: the runtime whose context and cuBLAS workspace were added.
        observed_bytes: what NVML reports for the process on this device: the context plus
            the caching allocator's reserved peak within the device's memory; None when the
            job does not fit the device (it runs out of memory).
        required_bytes: the least a device must hold for the job to run.
    """

    spec: zoo.ModelSpec
    runtime: str
    observed_bytes: int | None
    required_bytes: int

    @property
    def out_of_memory(self) -> bool:
        """The job does not fit its device."""
        return self.observed_bytes is None


def mlp_spec(model: onnx.ModelProto) -> zoo.ModelSpec:
    """The zoo MLP whose layers are the model's: Gemm (weight [in, out]) with Relu between.

    Raises:
        NotDerivableError: the graph is anything else.
    """
    graph = model.graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    widths: list[tuple[int, int]] = []
    for i, node in enumerate(graph.node):
        expected = "Gemm" if i % 2 == 0 else "Relu"
        if node.op_type != expected:
            raise NotDerivableError(
                f"node {i} is {node.op_type}, not {expected}: only Gemm layers with Relu "
                "between them are rebuilt"
            )
        if expected == "Relu":
            continue
        if any(a.name in ("transA", "transB") and a.i for a in node.attribute):
            raise NotDerivableError(f"Gemm {node.name or i} transposes an operand")
        weight = shapes.get(node.input[1])
        if weight is None or len(weight) != 2:
            raise NotDerivableError(f"Gemm {node.name or i} has no [in, out] weight initializer")
        widths.append((int(weight[0]), int(weight[1])))
    if not widths or len(graph.node) % 2 == 0:
        raise NotDerivableError("the graph does not end in a Gemm layer")
    for (_, out), (fan_in, _) in itertools.pairwise(widths):
        if out != fan_in:
            raise NotDerivableError(f"a layer of width {out} feeds one expecting {fan_in}")
    return zoo.ModelSpec(
        "mlp",
        {
            "hidden": [out for _, out in widths[:-1]],
            "activation": "relu",
            "norm": "none",
            "num_classes": widths[-1][1],
        },
        {"features": widths[0][0]},
    )


def derive(
    model: onnx.ModelProto, spec: Mapping[str, Any], gpu_name: str, device_bytes: int
) -> Derived:
    """The derived memory of one pod of the DLJob `spec` (its `mode`, `batchSize` and
    `precision`, with Adam for training, as the prediction assumes) on a device of
    `device_bytes` of the GPU `gpu_name`.

    Raises:
        NotDerivableError: the model is not an MLP the zoo can rebuild.
    """
    from kubeseer.measure import caching_allocator, gpu_memory, replay_cuda  # torch loads here

    zoo_spec = mlp_spec(model)
    mode: Literal["infer", "train"] = "train" if spec["mode"] == "train" else "infer"
    job = gpu_memory.Job(
        mode=mode,
        precision=str(spec.get("precision", "fp32")),  # type: ignore[arg-type]  # CRD enum
        optimizer="adam" if mode == "train" else "none",
        batch_size=int(spec["batchSize"]),
    )
    runtime = replay_cuda.runtime_for(gpu_name)
    events = gpu_memory.trace(replay_cuda.parts_of(zoo_spec), job, runtime)
    required = runtime.context_bytes + caching_allocator.required_capacity(events)
    try:
        on_device = caching_allocator.replay(
            events, capacity=max(0, device_bytes - runtime.context_bytes)
        )
    except caching_allocator.OutOfMemory:
        return Derived(zoo_spec, runtime.name, None, required)
    return Derived(
        zoo_spec, runtime.name, runtime.context_bytes + on_device.peak_reserved, required
    )


__all__ = ["LABEL_SOURCE", "Derived", "NotDerivableError", "derive", "mlp_spec"]
