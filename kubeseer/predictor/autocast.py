"""How wide each tensor of an exported graph is when PyTorch runs it under CUDA autocast.

An ONNX export is fp32 throughout, but a job trained or served with
``torch.autocast("cuda", torch.float16)`` (or bfloat16) is not uniformly half precision:

- matrix products and convolutions run in the lower precision, and autocast casts every fp32
  activation they read to a low-precision copy first (weights too, cached per step; the
  estimator counts those as `MemoryBreakdown.weight_copies`). The copy of an activation is not
  cached: each reader makes its own, and a training step saves it for backward in place of the
  fp32 original;
- normalisations, softmax, exponentials, reductions and upsampling return fp32
  (`FP32_UNDER_AUTOCAST`);
- everything else follows PyTorch's type promotion: the widest of its tensor inputs, where an
  fp32 parameter of more than one element (a position embedding, a layer-scale gamma, a class
  token) counts as an input, and a scalar does not.

So a vision transformer's residual stream is fp32 (its class token and position embedding are
fp32 parameters, and each block adds an fp16 branch to it), a ConvNeXt block ends in fp32 (its
layer-scale gamma), and a ResNet stays fp16 end to end. The rules follow
``aten/src/ATen/autocast_mode.cpp`` and ``c10/core/ScalarType.h`` promotion, as
`kubeseer.measure.meta_cuda` does for the derivation; counting every activation at two bytes
put the analytic estimate 30-65 % under the derived inference memory of timm's transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from kubeseer.prediction import Precision
from kubeseer.predictor.opnode import Operator

FP32_BYTES: Final[int] = 4
LOW_PRECISION_BYTES: Final[int] = 2

#: Operators autocast runs in fp32 whatever the requested precision (autocast_mode.cpp's fp32
#: and fp32-output lists, as ONNX names them).
FP32_UNDER_AUTOCAST: Final[frozenset[str]] = frozenset(
    {
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "Exp",
        "Log",
        "Pow",
        "Reciprocal",
        "ReduceSum",
        "ReduceMean",
        "ReduceL2",
        "ReduceProd",
        "CumSum",
        "Resize",
        "Softplus",
    }
)

#: Operators of `FP32_UNDER_AUTOCAST` whose autocast policy casts each low-precision input to an
#: fp32 copy first (autocast_mode.cpp's fp32 list). The others take a half-precision input as
#: it is and only return fp32: softmax and log-softmax (``half_to_float``), sums, cumulative
#: sums and products (an fp32 ``dtype`` argument), and means, which autocast leaves alone.
UPCASTS_INPUTS: Final[frozenset[str]] = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "Exp",
        "Log",
        "Pow",
        "Reciprocal",
        "Softplus",
        "Resize",
    }
)

#: Operators of `FP32_UNDER_AUTOCAST` that read an fp16 input as it is but make an fp32 copy of
#: a bf16 one: softmax with an fp32 ``dtype`` takes ATen's ``half_to_float`` kernel for Half on
#: CUDA only (SoftMax.cpp), and converts any other input first.
COPIES_BF16_INPUTS: Final[frozenset[str]] = frozenset({"Softmax", "LogSoftmax"})

#: Operators autocast runs in fp16/bf16, casting (and, when training, caching) their weights.
LOW_PRECISION_MATMUL_OPS: Final[frozenset[str]] = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", "PRelu"}
)

#: Operators with fp32 parameters whose output keeps their input's width: cuDNN's batch norm
#: takes fp16 activations with fp32 statistics and returns fp16.
KEEPS_INPUT_WIDTH: Final[frozenset[str]] = frozenset({"BatchNormalization"})

#: Operators whose constant inputs are scalars by the ONNX standard (Clip's min and max), which
#: never promote: a node's weight count sums its constants, and two scalars are not a parameter.
SCALAR_OPERAND_OPS: Final[frozenset[str]] = frozenset({"Clip"})

#: Operators whose output has the width of their data, the largest of their inputs: the others
#: are amounts, indices, shapes or axes (a Pad's pads, a Slice's starts and ends), Python
#: integers in PyTorch and never part of its type promotion, or a Where's boolean condition
#: (``scores.masked_fill(causal, -inf)`` keeps the scores' bf16; read as fp32, a GPT's masked
#: scores were counted twice their size and their softmax's fp32 copy not at all).
DATA_OPERAND_OPS: Final[frozenset[str]] = frozenset(
    {"Pad", "Slice", "Tile", "Expand", "Reshape", "Squeeze", "Unsqueeze", "Split", "Gather",
     "GatherElements", "GatherND", "TopK", "ReduceMax", "ReduceMin", "Where"}
)  # fmt: skip


def widths(
    nodes: Sequence[Operator],
    order: Sequence[int],
    producers: Sequence[Sequence[int]],
    precision: Precision,
    aliases: Callable[[int], int | None],
    *,
    typed_operands: bool = True,
) -> list[int]:
    """Bytes per element of each node's output at `precision` (fp32: 4 everywhere).

    Args:
        nodes: the operators.
        order: a topological order of them.
        producers: each node's activation producers; a node without any reads the graph
            input (fp32, as a job feeds it) or only constants.
        precision: the autocast precision.
        aliases: for a node whose output is another node's storage (a view, a Linear's bias
            Add), that node; None otherwise. An alias has its storage's width.
        typed_operands: read only the operands PyTorch promotes over (`SCALAR_OPERAND_OPS`,
            `DATA_OPERAND_OPS`); False reads every input as `analytic_memory.Rules.RUNTIME` did,
            which took a ReLU6's bounds for an fp32 parameter and a Pad's amounts for an fp32
            tensor, and so widened every MobileNet and TF-padded EfficientNet to fp32.
    """
    keeps_width = KEEPS_INPUT_WIDTH | (SCALAR_OPERAND_OPS if typed_operands else frozenset())
    if precision is Precision.FP32:
        return [FP32_BYTES] * len(nodes)
    width = [LOW_PRECISION_BYTES] * len(nodes)
    for node in order:
        op = nodes[node]
        aliased = aliases(node)
        if aliased is not None:
            width[node] = width[aliased]
        elif op.op_type in LOW_PRECISION_MATMUL_OPS:
            width[node] = LOW_PRECISION_BYTES
        elif op.op_type in FP32_UNDER_AUTOCAST:
            width[node] = FP32_BYTES
        else:
            tensors = [p for p in producers[node] if nodes[p].output_elements > 1]
            if typed_operands and op.op_type in DATA_OPERAND_OPS and tensors:
                tensors = [max(tensors, key=lambda p: nodes[p].output_elements)]
            inputs = [width[p] for p in tensors] or [FP32_BYTES]
            if op.weight_elements > 1 and op.op_type not in keeps_width:
                inputs.append(FP32_BYTES)
            width[node] = max(inputs)
    return width


def casts_before(node: Operator, precision: Precision) -> bool:
    """Whether autocast casts `node`'s fp32 activation inputs to a low-precision copy."""
    return precision is not Precision.FP32 and node.op_type in LOW_PRECISION_MATMUL_OPS


def upcasts_before(node: Operator, precision: Precision) -> bool:
    """Whether autocast casts `node`'s low-precision activation inputs to an fp32 copy."""
    return precision is not Precision.FP32 and node.op_type in UPCASTS_INPUTS


def copies_before(node: Operator, precision: Precision) -> bool:
    """Whether a bf16 job's autocast has `node` read an fp32 copy of its bf16 input, made for
    it and freed after it (`COPIES_BF16_INPUTS`): the eager reading counts it. A BERT's
    attention at batch 256 and 512 tokens holds the bf16 scores, their fp32 copy and the
    fp32 softmax at once, and without the copy its estimate was 35 % under."""
    return precision is Precision.BF16 and node.op_type in COPIES_BF16_INPUTS
