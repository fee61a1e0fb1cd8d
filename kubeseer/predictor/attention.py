"""Attention in an exported graph, and which of its tensors a GPU's fused kernel never stores.

ONNX has no attention operator that exporters use (opset 23's ``Attention`` is new), so an
export spells attention out: ``Q @ K^T``, a scale, an optional additive mask or bias, a Softmax
and ``P @ V``, with a ``(batch, heads, S, S)`` tensor between each step. A job need not run it
that way. PyTorch's ``F.scaled_dot_product_attention`` (SDPA; timm and Hugging Face's ``sdpa``
attention call it) runs FlashAttention-2 or the memory-efficient kernel on an
SM80+ GPU: one kernel from Q, K and V to the output, keeping for backward only Q, K, V, the
output and one fp32 log-sum-exp per query row. Attention written by hand (``q @ k.transpose``,
``softmax``, ``@ v``) runs op by op and stores every matrix, as the graph shows.

Both look alike in ONNX, except for one trace the exporters leave: PyTorch's SDPA export (the
TorchScript symbolic of opset 14 and the dynamo exporter's alike) scales *both* operands of
``Q @ K^T`` by ``sqrt(scale)`` for numerical range, where hand-written attention scales one
operand or the product. `find` recognises the pattern and that trace; `fused_interior` says,
for the kernel a job runs (`kubeseer.prediction.Attention`), which nodes' outputs are never
materialised. The log-sum-exp a fused kernel keeps for backward (1/head-dim of its output) is
left out: the graph does not record the head dimension, and the term is under 2 % of the
attention output for the head sizes of published models (64-128).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from kubeseer.prediction import Attention
from kubeseer.predictor.opnode import Operator

#: Operators between ``Q @ K^T`` and the Softmax that a fused kernel computes internally: the
#: scale, an additive mask or relative-position bias, a boolean mask's Where, and casts.
SCORE_OPS: Final[frozenset[str]] = frozenset({"Mul", "Div", "Add", "Where", "Cast"})

#: Operators between the Softmax and ``P @ V`` inside a fused kernel (its dropout draws its
#: mask on the fly and stores none).
PROBABILITY_OPS: Final[frozenset[str]] = frozenset({"Cast", "Dropout"})

#: Operators that scale one operand of ``Q @ K^T`` by a constant.
_SCALE_OPS: Final[frozenset[str]] = frozenset({"Mul", "Div"})


@dataclass(frozen=True)
class AttentionBlock:
    """One attention spelled out in a graph.

    Attributes:
        scores: the ``Q @ K^T`` MatMul.
        output: the ``P @ V`` MatMul, the one tensor a fused kernel writes.
        interior: nodes from ``Q @ K^T`` to the last one before ``P @ V``, whose outputs a
            fused kernel keeps in on-chip memory; for an SDPA export also the operand scales
            and the key's transpose, which SDPA never makes.
        sdpa: written by an exporter's scaled-dot-product attention (both operands scaled),
            i.e. the job calls ``F.scaled_dot_product_attention``.
        four_dimensional: ``Q @ K^T`` is four-dimensional (batch, heads, queries, keys), as
            both fused kernels require of SDPA's operands; a five-dimensional call (a window
            axis kept apart, as timm's NesT and Hiera do) runs PyTorch's math path, which
            stores the scores. A rank the graph did not record counts as four.
        inputs: for an SDPA export, the nodes whose outputs the call was given (query, key,
            value): PyTorch's math path copies them to fp32 (`upcasts`).
    """

    scores: int
    output: int
    interior: frozenset[int]
    sdpa: bool
    four_dimensional: bool = True
    inputs: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Wiring:
    """Data flow between a graph's operators. Scalars computed at run time (the SDPA export's
    ``sqrt(1 / sqrt(head_dim))``, made from the query's shape) are constants here: producers
    are the tensor-valued ones only."""

    nodes: Sequence[Operator]
    producers: Sequence[Sequence[int]]
    consumers: Sequence[Sequence[int]]

    def op_type(self, node: int) -> str:
        return self.nodes[node].op_type

    def tensors_into(self, node: int) -> list[int]:
        return [p for p in self.producers[node] if self.nodes[p].output_elements > 1]

    def only_consumer(self, node: int) -> int | None:
        readers = self.consumers[node]
        return readers[0] if len(readers) == 1 else None

    def is_activation_matmul(self, node: int) -> bool:
        """A MatMul of two activations (attention's), not a Linear's MatMul with weights."""
        return (
            self.op_type(node) == "MatMul"
            and len(self.tensors_into(node)) == 2
            and self.nodes[node].weight_elements <= 1
        )

    def is_operand_scale(self, node: int, reader: int) -> bool:
        """`node` scales one activation by a constant and only `reader` reads it."""
        return (
            self.op_type(node) in _SCALE_OPS
            and len(self.tensors_into(node)) == 1
            and self.nodes[node].weight_elements <= 1
            and self.consumers[node] == [reader]
        )


def _scores_path(wiring: _Wiring, node: int, reader: int) -> tuple[int, set[int]] | None:
    """From `node` (read only by `reader`) back to the ``Q @ K^T`` MatMul through score
    operators: the MatMul and the nodes on the way, or None where the path is anything else."""
    if wiring.consumers[node] != [reader]:
        return None
    if wiring.is_activation_matmul(node):
        return node, {node}
    if wiring.op_type(node) not in SCORE_OPS:
        return None
    for producer in wiring.tensors_into(node):
        found = _scores_path(wiring, producer, node)
        if found is not None:
            matmul, path = found
            return matmul, path | {node}
    return None


def _probabilities_path(wiring: _Wiring, softmax: int) -> tuple[int, set[int]] | None:
    """From the Softmax forward to ``P @ V``: that MatMul and the nodes before it."""
    path = {softmax}
    node = softmax
    while (reader := wiring.only_consumer(node)) is not None:
        if wiring.is_activation_matmul(reader):
            return reader, path
        if wiring.op_type(reader) not in PROBABILITY_OPS:
            return None
        path.add(reader)
        node = reader
    return None


def _key_transpose(wiring: _Wiring, scale: int) -> int | None:
    """The transpose an SDPA export makes of the key before scaling it, where `scale` reads
    one that only it reads."""
    source = wiring.tensors_into(scale)[0]
    if wiring.op_type(source) == "Transpose" and wiring.consumers[source] == [scale]:
        return source
    return None


def _sdpa_operands(wiring: _Wiring, scores: int) -> set[int] | None:
    """The operand scales (and the key's transpose before its scale) of an SDPA export, or
    None where ``Q @ K^T`` does not have both operands scaled."""
    operands = wiring.tensors_into(scores)
    if not all(wiring.is_operand_scale(p, scores) for p in operands):
        return None
    transposes = {_key_transpose(wiring, scale) for scale in operands}
    return set(operands) | {t for t in transposes if t is not None}


def _sdpa_inputs(
    wiring: _Wiring, scores: int, output: int, probabilities: set[int]
) -> tuple[int, ...]:
    """The query, key and value an SDPA export's block was called with: what its operand
    scales (and the key's transpose) read, and the value ``P @ V`` reads."""
    inputs = []
    for scale in wiring.tensors_into(scores):
        transpose = _key_transpose(wiring, scale)
        inputs.append(wiring.tensors_into(scale if transpose is None else transpose)[0])
    inputs.extend(p for p in wiring.tensors_into(output) if p not in probabilities)
    return tuple(inputs)


def find(
    nodes: Sequence[Operator],
    producers: Sequence[Sequence[int]],
    consumers: Sequence[Sequence[int]],
) -> list[AttentionBlock]:
    """Every attention in a graph of `nodes`, given each node's producers and consumers (node
    indices, a tensor read twice by one node listed twice)."""
    wiring = _Wiring(nodes, producers, consumers)
    blocks = []
    for softmax, node in enumerate(nodes):
        if node.op_type != "Softmax" or len(wiring.tensors_into(softmax)) != 1:
            continue
        upstream = _scores_path(wiring, wiring.tensors_into(softmax)[0], softmax)
        downstream = _probabilities_path(wiring, softmax)
        if upstream is None or downstream is None:
            continue
        (scores, score_nodes), (output, probability_nodes) = upstream, downstream
        operands = _sdpa_operands(wiring, scores)
        interior = score_nodes | probability_nodes | (operands or set())
        four_dimensional = nodes[scores].rank in (0, 4)
        inputs = () if operands is None else _sdpa_inputs(wiring, scores, output, probability_nodes)
        blocks.append(
            AttentionBlock(
                scores, output, frozenset(interior), operands is not None, four_dimensional, inputs
            )
        )
    return blocks


def fused_kernel(block: AttentionBlock, kernel: Attention) -> bool:
    """Whether `block` runs as one fused kernel when the job asks for `kernel`.

    ``auto`` is PyTorch's own choice on an SM80+ GPU: SDPA on four-dimensional operands runs
    FlashAttention-2 or the memory-efficient kernel (every float precision, masks allowed),
    SDPA on other ranks runs the math path (`upcasts`) and hand-written attention as written.
    ``flash`` and ``efficient`` say the job's runtime fuses every attention (an inference server
    that fuses hand-written attention, a model patched to call SDPA); ``math`` that it runs
    none fused (``torch.backends.cuda.enable_flash_sdp(False)`` and
    ``enable_mem_efficient_sdp(False)``, or a GPU without the kernels); ``written`` none fused
    and none in fp32 (PyTorch 1.x).
    """
    if kernel in (Attention.MATH, Attention.WRITTEN):
        return False
    if kernel is Attention.AUTO:
        return block.sdpa and block.four_dimensional
    return True


def upcasts(block: AttentionBlock, kernel: Attention) -> bool:
    """Whether `block` is a scaled-dot-product attention that PyTorch runs on its math path in
    fp32 when the job asks for `kernel`.

    Since PyTorch 2.5 (pytorch#128922) the math path copies fp16 and bf16 query, key and value
    to fp32, computes the scores, the softmax and ``P @ V`` in fp32 and casts the output back;
    ``written`` is the runtime that computes attention in the job's precision (PyTorch 1.x's
    hand-written attention, the math path before 2.5)."""
    return block.sdpa and kernel is not Attention.WRITTEN and not fused_kernel(block, kernel)


def fused_interior(blocks: Sequence[AttentionBlock], kernel: Attention) -> set[int]:
    """Nodes of `blocks` whose outputs are never materialised when the job runs `kernel`."""
    return {node for block in blocks if fused_kernel(block, kernel) for node in block.interior}


def describe(blocks: Sequence[AttentionBlock], kernel: Attention) -> str:
    """What the estimate assumed of a graph's attention, said with its prediction so that a job
    that runs otherwise knows to set its kernel."""
    sdpa = sum(block.sdpa for block in blocks)
    unfusable = sum(block.sdpa and not block.four_dimensional for block in blocks)
    ranks = f" ({unfusable} not four-dimensional, which PyTorch runs unfused)" if unfusable else ""
    fused = sum(fused_kernel(block, kernel) for block in blocks)
    return (
        f"attention ({kernel.value}): {len(blocks)} blocks, {sdpa} through "
        f"scaled_dot_product_attention{ranks}; {fused} counted fused (no sequence-by-sequence "
        f"matrix), {len(blocks) - fused} as written; a job whose attention runs otherwise sets "
        "spec.attention (flash, efficient, math or written)"
    )
