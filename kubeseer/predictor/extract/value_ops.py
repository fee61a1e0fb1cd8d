"""numpy implementations of the ONNX operators that shape arithmetic uses (`VALUE_OPS`),
each on tensors of at most `MAX_ELEMENTS` values."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto

# Shape arithmetic evaluated by `shape_values.compute` stays this small; anything larger is data.
MAX_ELEMENTS: Final[int] = 4096


ValueArray = npt.NDArray[Any]


Args = list[ValueArray | None]


Attrs = Mapping[str, int | list[int] | str]


ValueOp = Callable[[Args, Attrs], ValueArray]


def arg(args: Args, index: int) -> ValueArray:
    value = args[index] if index < len(args) else None
    if value is None:
        raise ValueError("missing input")
    return value


def _axes(args: Args, attrs: Attrs, slot: int) -> list[int] | None:
    """Axes from the attribute (older opsets) or from the input slot (opset 13 and later)."""
    if slot < len(args) and args[slot] is not None:
        return [int(a) for a in np.ravel(arg(args, slot))]
    value = attrs.get("axes")
    return value if isinstance(value, list) else None


def _unsqueeze(args: Args, attrs: Attrs) -> ValueArray:
    data, axes = arg(args, 0), _axes(args, attrs, 1) or []
    rank = data.ndim + len(axes)
    for axis in sorted(a % rank for a in axes):
        data = np.expand_dims(data, axis)
    return data


def _squeeze(args: Args, attrs: Attrs) -> ValueArray:
    data, axes = arg(args, 0), _axes(args, attrs, 1)
    return np.squeeze(data, axis=None if axes is None else tuple(a % data.ndim for a in axes))


def _slice(args: Args, attrs: Attrs) -> ValueArray:
    data = arg(args, 0)
    if len(args) > 1:
        starts, ends = np.ravel(arg(args, 1)), np.ravel(arg(args, 2))
        axes = _axes(args, {}, 3) or list(range(len(starts)))
        steps = np.ravel(arg(args, 4)) if len(args) > 4 and args[4] is not None else None
    else:
        starts = np.array(attrs.get("starts", []))
        ends = np.array(attrs.get("ends", []))
        axes = _axes([], attrs, 0) or list(range(len(starts)))
        steps = None
    index = [slice(None)] * data.ndim
    for i, axis in enumerate(axes):
        step = int(steps[i]) if steps is not None else 1
        index[axis % data.ndim] = slice(int(starts[i]), int(ends[i]), step)
    return data[tuple(index)]


def _integer_div(args: Args, attrs: Attrs) -> ValueArray:
    a, b = arg(args, 0), arg(args, 1)
    if np.issubdtype(a.dtype, np.integer):
        return np.asarray(np.trunc(a / b).astype(a.dtype))  # ONNX integer Div truncates
    return np.asarray(a / b)


def _reshape(args: Args, attrs: Attrs) -> ValueArray:
    data, shape = arg(args, 0), [int(v) for v in np.ravel(arg(args, 1))]
    if not attrs.get("allowzero", 0):
        shape = [data.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return data.reshape(shape)


def _reduce(function: Callable[..., Any]) -> ValueOp:
    def reduce(args: Args, attrs: Attrs) -> ValueArray:
        data, axes = arg(args, 0), _axes(args, attrs, 1)
        keep = bool(attrs.get("keepdims", 1))
        return np.asarray(function(data, axis=None if not axes else tuple(axes), keepdims=keep))

    return reduce


def sized(shape: ValueArray) -> tuple[int, ...]:
    dims = tuple(int(v) for v in np.ravel(shape))
    if math.prod(dims) > MAX_ELEMENTS:
        raise ValueError("too large for shape arithmetic")
    return dims


def _int_attr(attrs: Attrs, name: str, default: int) -> int:
    value = attrs.get(name, default)
    return value if isinstance(value, int) else default


def _cast(args: Args, attrs: Attrs) -> ValueArray:
    to = _int_attr(attrs, "to", TensorProto.FLOAT)
    return arg(args, 0).astype(onnx.helper.tensor_dtype_to_np_dtype(to))


def _gather(args: Args, attrs: Attrs) -> ValueArray:
    return np.take(arg(args, 0), arg(args, 1), axis=_int_attr(attrs, "axis", 0))


def _concat(args: Args, attrs: Attrs) -> ValueArray:
    parts = [np.atleast_1d(v) for v in args if v is not None]
    return np.concatenate(parts, axis=_int_attr(attrs, "axis", 0))


def _expand(args: Args, attrs: Attrs) -> ValueArray:
    data = arg(args, 0)
    return np.broadcast_to(data, np.broadcast_shapes(data.shape, sized(arg(args, 1))))


def _transpose(args: Args, attrs: Attrs) -> ValueArray:
    perm = attrs.get("perm")
    return np.transpose(arg(args, 0), perm if isinstance(perm, list) else None)


def _range(args: Args, attrs: Attrs) -> ValueArray:
    start, limit, delta = (arg(args, i).item() for i in range(3))
    if delta == 0 or abs((limit - start) / delta) > MAX_ELEMENTS:
        raise ValueError("not shape arithmetic")
    return np.arange(start, limit, delta, dtype=arg(args, 0).dtype)


def _binary(function: Callable[[ValueArray, ValueArray], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function(arg(args, 0), arg(args, 1)))

    return apply


def _unary(function: Callable[[ValueArray], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function(arg(args, 0)))

    return apply


def _variadic(function: Callable[[list[ValueArray]], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function([v for v in args if v is not None]))

    return apply


def _where(args: Args, attrs: Attrs) -> ValueArray:
    return np.where(arg(args, 0), arg(args, 1), arg(args, 2))


def _clip(args: Args, attrs: Attrs) -> ValueArray:
    """Opset 11 and later: bounds as optional inputs (TF-style "same" padding clips at 0)."""
    low = args[1] if len(args) > 1 else None
    high = args[2] if len(args) > 2 else None
    return np.asarray(np.clip(arg(args, 0), low, high))


VALUE_OPS: Final[Mapping[str, ValueOp]] = {
    "Identity": _unary(lambda x: x),
    "Cast": _cast,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "Expand": _expand,
    "Transpose": _transpose,
    "Range": _range,
    "Where": _where,
    "Clip": _clip,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _integer_div,
    "Mod": _binary(np.fmod),
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "Greater": _binary(np.greater),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Sqrt": _unary(np.sqrt),
    "Not": _unary(np.logical_not),
    "Max": _variadic(lambda vs: np.maximum.reduce(vs)),
    "Min": _variadic(lambda vs: np.minimum.reduce(vs)),
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}
