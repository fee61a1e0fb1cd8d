"""Parsing without the weights.

A model with inline weights is mostly tensor payload that extraction never reads, yet protobuf
copies all of it while parsing. `skeleton` walks the wire format and re-encodes the model
without the data fields of large tensors (initializers and `Constant` values), which leaves
exactly what a weight-stripped export holds: names, dims and element types.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Final

from kubeseer import units

SKELETON_MIN_MODEL_BYTES: Final[int] = units.MIB


_SKELETON_MIN_TENSOR_BYTES: Final[int] = 4096  # smaller tensors keep their values


_DROP: Final[str] = "drop"


# Message kind -> {field number: kind of the embedded message, or _DROP}; field numbers are
# those of onnx.proto (ModelProto.graph, GraphProto.node/initializer, NodeProto.attribute,
# AttributeProto.t/tensors, TensorProto's float/int32/string/int64/raw/double/uint64 data).
_WIRE_LAYOUT: Final[Mapping[str, Mapping[int, str]]] = {
    "model": {7: "graph"},
    "graph": {1: "node", 5: "tensor"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 11: "tensor"},
    "tensor": dict.fromkeys((4, 5, 6, 7, 9, 10, 11), _DROP),
}


class _WireError(ValueError):
    """The bytes are not well-formed protobuf; the regular parser reports why."""


def skeleton(data: bytes | mmap.mmap) -> bytes:
    """`data` re-encoded without the payload of tensors larger than 4 KiB.

    Malformed bytes are handed to the regular parser unchanged, so that errors read the same
    whichever path a model takes.
    """
    with memoryview(data) as view:
        try:
            return b"".join(_strip(view, 0, len(view), "model"))
        except _WireError:
            return bytes(data)


def _strip(buf: memoryview, start: int, end: int, kind: str) -> list[bytes | memoryview]:
    layout = _WIRE_LAYOUT[kind]
    out: list[bytes | memoryview] = []
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(buf, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, value_start = _varint(buf, pos, end)
            pos = value_start + length
            child = layout.get(field)
            if pos <= end and child == _DROP:
                continue
            if pos <= end and child is not None and length > _SKELETON_MIN_TENSOR_BYTES:
                payload = b"".join(_strip(buf, value_start, pos, child))
                out.append(_encode_varint(key) + _encode_varint(len(payload)))
                out.append(payload)
                continue
        else:
            raise _WireError(f"wire type {wire_type}")
        if pos > end:
            raise _WireError("field runs past the end of its message")
        out.append(buf[field_start:pos])
    return out


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _WireError("truncated varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
