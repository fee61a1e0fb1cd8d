"""The v^hp node columns: kernel, stride, padding, dilation, group, channels, GEMM sizes, heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from kubeseer.predictor import opcount
from kubeseer.predictor.extract import layout, structure

_CONV_OPS: Final[Mapping[str, int]] = {
    # operator -> input slot of the weight
    "Conv": 1,
    "ConvTranspose": 1,
    "ConvInteger": 1,
    "QLinearConv": 3,
    "DeformConv": 1,
}


_POOL_OPS: Final[frozenset[str]] = frozenset({"MaxPool", "AveragePool", "LpPool"})


_GLOBAL_POOL_OPS: Final[frozenset[str]] = frozenset(
    {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
)


_MATMUL_OPS: Final[Mapping[str, tuple[int, int]]] = {
    # operator -> input slots of A and B
    "MatMul": (0, 1),
    "MatMulInteger": (0, 1),
    "QLinearMatMul": (0, 3),
}


_BIAS_SLOT: Final[Mapping[str, int]] = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "QLinearConv": 8}


def _ints(attrs: Mapping[str, int | list[int] | str], name: str, default: list[int]) -> list[int]:
    value = attrs.get(name)
    return value if isinstance(value, list) and value else default


def _window(
    attrs: Mapping[str, int | list[int] | str],
    kernel: Sequence[int],
    data: opcount.TensorInfo | None,
    output: opcount.TensorInfo | None,
) -> list[int]:
    """Kernel, stride, padding and dilation of a sliding-window operator, folded to (H, W)."""
    spatial = len(kernel)
    strides = _ints(attrs, "strides", [1] * spatial)
    dilations = _ints(attrs, "dilations", [1] * spatial)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and data is not None and output is not None:
        pads = [
            max(0, (o - 1) * s + (k - 1) * d + 1 - i)
            for i, o, k, s, d in zip(
                data.shape[2:], output.shape[2:], kernel, strides, dilations, strict=False
            )
        ]
    elif auto_pad == "VALID":
        pads = [0] * spatial
    else:
        flat = _ints(attrs, "pads", [0] * (2 * spatial))
        pads = [flat[i] + flat[i + spatial] for i in range(min(spatial, len(flat) // 2))]
    return [
        *layout.fold_spatial(kernel),
        *layout.fold_spatial(strides),
        *layout.fold_pads(pads),
        *layout.fold_spatial(dilations),
    ]


def columns(
    node: structure.Node,
    inputs: Sequence[opcount.TensorInfo | None],
    outputs: Sequence[opcount.TensorInfo | None],
    first_activation: opcount.TensorInfo | None,
    in_channel_first: bool,
    out_channel_first: bool,
    num_activations: int,
) -> list[float]:
    """The node's v^hp columns (schema order, 0 where not applicable)."""
    op = node.op_type
    attrs = structure.attributes(node.proto)
    out0 = outputs[0] if outputs else None
    window = [0] * 8
    group = 0
    if op in _CONV_OPS:
        weight = _slot(inputs, _CONV_OPS[op])
        kernel = list(weight.shape[2:]) if weight is not None else []
        window = _window(attrs, _ints(attrs, "kernel_shape", kernel), _slot(inputs, 0), out0)
        group_attr = attrs.get("group", 1)
        group = group_attr if isinstance(group_attr, int) else 1
    elif op in _POOL_OPS:
        window = _window(attrs, _ints(attrs, "kernel_shape", []), _slot(inputs, 0), out0)
    elif op in _GLOBAL_POOL_OPS and (data := _slot(inputs, 0)) is not None:
        spatial = len(data.shape) - 2
        window = _window({}, list(data.shape[2:]), data, out0)
        window[2:4] = layout.fold_spatial([1] * spatial)
    gemm_m = gemm_k = units = 0
    if op == "Gemm":
        a, b = _slot(inputs, 0), _slot(inputs, 1)
        if a is not None and b is not None:
            trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
            gemm_m, units, gemm_k = opcount.gemm_mnk(
                a.shape, b.shape, trans_a=bool(trans_a), trans_b=bool(trans_b)
            )
    elif op in _MATMUL_OPS:
        a, b = (_slot(inputs, slot) for slot in _MATMUL_OPS[op])
        if a is not None and b is not None and out0 is not None and a.shape and b.shape:
            gemm_k = a.shape[-1]
            units = b.shape[-1] if len(b.shape) >= 2 else 1
            gemm_m = out0.numel // units if units else 0
    heads = _heads(op, attrs, inputs, out0, num_activations)
    bias_slot = _BIAS_SLOT.get(op)
    has_bias = int(bias_slot is not None and _slot(inputs, bias_slot) is not None)
    in_channels = (
        layout.bchw(first_activation.shape, channel_first=in_channel_first)[1]
        if first_activation
        else 0
    )
    out_channels = layout.bchw(out0.shape, channel_first=out_channel_first)[1] if out0 else 0
    elem_bytes = opcount.element_bits(out0.elem_type) / 8 if out0 else 0.0
    return [
        *window,
        group,
        in_channels,
        out_channels,
        gemm_m,
        gemm_k,
        units,
        heads,
        has_bias,
        num_activations,
        sum(1 for name in node.outputs if name),
        elem_bytes,
    ]


def _heads(
    op: str,
    attrs: Mapping[str, int | list[int] | str],
    inputs: Sequence[opcount.TensorInfo | None],
    output: opcount.TensorInfo | None,
    num_activations: int,
) -> int:
    """Attention heads: an attention operator's attribute, else the head axis of the
    rank-4 (B, heads, T, T) tensors of a decomposed attention (activation @ activation MatMul,
    Softmax over scores)."""
    for name in ("num_heads", "q_num_heads"):
        value = attrs.get(name)
        if isinstance(value, int):
            return value
    if output is None or len(output.shape) != 4:
        return 0
    if op == "MatMul" and num_activations == 2:
        a, b = _slot(inputs, 0), _slot(inputs, 1)
        if a is not None and b is not None and len(a.shape) == 4 and len(b.shape) == 4:
            return output.shape[1]
    if op == "Softmax":
        return output.shape[1]
    return 0


def _slot(infos: Sequence[opcount.TensorInfo | None], index: int) -> opcount.TensorInfo | None:
    return infos[index] if index < len(infos) else None
