"""torch.matmul's copies of broadcast operands: counted at extraction, held by the estimate."""

import dataclasses

import pytest
import torch
from torch import nn

from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import extract
from kubeseer.predictor.extract import features
from kubeseer.predictor.opcount import TensorInfo

BATCH, HEADS, POSITIONS, KEYS, VALUES = 2, 4, 64, 16, 32
FLOAT = 1  # onnx.TensorProto.FLOAT


class PositionLambda(nn.Module):
    """lambda_resnet's position term: per-head queries times a lambda shared by the heads
    (``q.unsqueeze(-2) @ position_lam``), which torch.matmul expands over the heads and
    clones before ``bmm``."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = nn.Linear(KEYS, HEADS * KEYS)
        self.lam = nn.Linear(KEYS, KEYS * VALUES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, m, _ = x.shape
        q = self.queries(x).reshape(b, m, HEADS, KEYS).transpose(1, 2).unsqueeze(-2)
        lam = self.lam(x).reshape(b, 1, m, KEYS, VALUES)
        return (q @ lam).reshape(b, -1)


@pytest.fixture(scope="module")
def position_lambda(torchscript_onnx) -> bytes:
    return torchscript_onnx(PositionLambda(), torch.randn(BATCH, POSITIONS, KEYS))


def info(*shape: int) -> TensorInfo:
    return TensorInfo(shape, FLOAT)


def test_only_a_broadcast_batch_is_copied() -> None:
    copy = features.broadcast_copy_elements
    assert copy("MatMul", [info(2, 4, 8, 1, 16), info(2, 1, 8, 16, 32)]) == 2 * 4 * 8 * 16 * 32
    # both broadcast: each operand is expanded to the common batch
    assert copy("MatMul", [info(2, 1, 8, 16), info(1, 3, 16, 4)]) == 6 * 8 * 16 + 6 * 16 * 4
    assert copy("MatMul", [info(2, 4, 8, 16), info(2, 4, 16, 8)]) == 0  # same batch: views
    assert copy("MatMul", [info(2, 4, 8, 16), info(16, 8)]) == 0  # a matrix folds into mm
    assert copy("MatMul", [info(1, 8, 16), info(16, 8)]) == 0
    assert copy("Add", [info(2, 1, 8, 16), info(1, 3, 8, 16)]) == 0


def test_the_export_carries_the_copy_and_the_estimate_holds_it(position_lambda: bytes) -> None:
    graph = am.from_perfgraph(extract.from_onnx(position_lambda, batch_size=BATCH))
    copies = [op.broadcast_elements for op in graph.nodes if op.broadcast_elements]
    assert copies == [BATCH * HEADS * POSITIONS * KEYS * VALUES]
    without = dataclasses.replace(
        graph, nodes=tuple(dataclasses.replace(op, broadcast_elements=0) for op in graph.nodes)
    )
    assert am.MemoryGraph.from_dict(graph.to_dict()) == graph
    assert "broadcast" not in without.to_dict()

    def activations(g: am.MemoryGraph, mode: Mode, rules: am.Rules) -> int:
        return am.estimate(
            g, mode=mode, precision=Precision.FP32, optimizer=am.Optimizer.SGD, rules=rules
        ).activations

    copy_bytes = copies[0] * 4
    for mode in Mode:
        held = activations(graph, mode, am.Rules.EAGER) - activations(without, mode, am.Rules.EAGER)
        assert copy_bytes <= held <= copy_bytes + 4096
        # the readings checkpoints learned against before are left as they were
        for rules in (am.Rules.RUNTIME, am.Rules.WRITTEN):
            assert activations(graph, mode, rules) == activations(without, mode, rules)
