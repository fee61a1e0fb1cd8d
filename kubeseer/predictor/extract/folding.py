"""Constant folding: sub-graphs of initializers and constants are weights of the operators that
read them, not operators of their own, exactly as a runtime folds them before the first step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import onnx

from kubeseer.predictor.extract import structure

# Operators whose outputs differ per run even from constant inputs: never folded.
_NONDETERMINISTIC_OPS: Final[frozenset[str]] = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli", "Dropout"}
)  # fmt: skip


@dataclass(frozen=True)
class Folding:
    """The graph after constant folding.

    Attributes:
        constants: names of constant tensors.
        origins: for a constant that is a re-layout of another (`Transpose`, `Cast`, ...), the
            tensor it was derived from, so that a weight counts once in `PerfGraph.params`
            (exporters transpose a tied embedding for the output projection).
        runtime: indices of the nodes that remain operators.
    """

    constants: set[str]
    origins: dict[str, str]
    runtime: list[int]


# Folded operators whose output holds the same values as their first input, laid out anew.
_RELAYOUT_OPS: Final[frozenset[str]] = frozenset(
    {"Transpose", "Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
     "DequantizeLinear"}
)  # fmt: skip


def fold(graph: onnx.GraphProto, nodes: list[structure.Node]) -> Folding:
    constants = {init.name for init in graph.initializer}
    constants.add("")
    origins: dict[str, str] = {}
    runtime: list[int] = []
    for index, node in enumerate(nodes):
        if node.op_type not in _NONDETERMINISTIC_OPS and constants.issuperset(node.inputs):
            constants.update(node.outputs)
            if node.op_type in _RELAYOUT_OPS and node.inputs and node.outputs:
                source = node.inputs[0]
                origins[node.outputs[0]] = origins.get(source, source)
        else:
            runtime.append(index)
    constants.discard("")
    return Folding(constants, origins, runtime)
