"""Binding the graph inputs' symbolic dimensions to the batch size and the requested `inputs`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import onnx

from kubeseer.predictor import errors

BATCH_DIM_NAMES: Final[frozenset[str]] = frozenset({"batch", "batch_size", "n", "bs"})
"""Symbolic dimension names (case-insensitive) bound to the batch size wherever they appear."""


@dataclass(frozen=True)
class Bound:
    """The activation inputs with static shapes, and the value each symbol was bound to.

    `exported_batch` is the fixed leading dimension the inputs were exported with, when they
    were rebound from it to `batch_size` (`rebatch` checks that the graph follows); else None.
    """

    inputs: list[onnx.ValueInfoProto]
    symbols: dict[str, int]
    batch_size: int
    exported_batch: int | None = None

    def at_export(self) -> Bound:
        """The same inputs at the batch size they were exported with (self when not rebound)."""
        if self.exported_batch is None:
            return self
        return Bound(
            [_with_leading(vi, self.exported_batch) for vi in self.inputs],
            self.symbols,
            self.exported_batch,
        )


def _with_leading(value_info: onnx.ValueInfoProto, size: int) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value_info)
    dims = copy.type.tensor_type.shape.dim
    if dims:
        dims[0].Clear()
        dims[0].dim_value = size
    return copy


def bind_inputs(graph: onnx.GraphProto, batch_size: int, bindings: dict[str, int]) -> Bound:
    """The graph's activation inputs with every symbolic dimension replaced by its value."""
    for name, value in bindings.items():
        if value < 1:
            raise errors.BindingError(f"dimension {name!r} must be at least 1, got {value}")
    initializers = {init.name for init in graph.initializer}
    activations = [vi for vi in graph.input if vi.name not in initializers]
    used: set[str] = set()
    symbols: dict[str, int] = {}
    unbound: dict[str, list[str]] = {}
    fixed_first: list[int] = []
    has_symbolic_batch = False
    bound: list[onnx.ValueInfoProto] = []
    for value_info in activations:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(value_info)
        if not copy.type.HasField("tensor_type"):
            raise errors.ShapeInferenceError(f"graph input {copy.name!r} is not a tensor")
        dims = copy.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                if axis == 0:
                    fixed_first.append(dim.dim_value)
                continue
            name = dim.dim_param
            if name in bindings:
                value = bindings[name]
                used.add(name)
                if name.lower() in BATCH_DIM_NAMES and value != batch_size:
                    raise errors.BindingError(
                        f"inputs binds {name!r} to {value} but the batch size is {batch_size}"
                    )
            elif name.lower() in BATCH_DIM_NAMES or axis == 0:
                value = batch_size
                has_symbolic_batch = True
            else:
                unbound.setdefault(name or f"<unnamed axis {axis}>", []).append(copy.name)
                continue
            if name:
                symbols[name] = value
            dim.Clear()
            dim.dim_value = value
        bound.append(copy)
    # A misspelt name leaves its dimension unbound as well: name the misspelling, the cause.
    unknown = sorted(set(bindings) - used)
    if unknown:
        named = sorted({*symbols, *unbound} - {name for name in unbound if name.startswith("<")})
        raise errors.BindingError(
            f"inputs names dimensions the model's inputs do not have: {', '.join(unknown)} "
            f"(its symbolic input dimensions: {', '.join(named) or 'none'})"
        )
    if unbound:
        listed = "; ".join(f"{dim!r} (in {', '.join(names)})" for dim, names in unbound.items())
        raise errors.SymbolicDimensionError(
            f"symbolic input dimensions left unbound: {listed}; "
            "bind them with inputs={name: value} (CLI: --input name=value)"
        )
    if fixed_first and not has_symbolic_batch and batch_size not in fixed_first:
        if len(set(fixed_first)) > 1 or len(fixed_first) < len(bound):
            raise errors.BindingError(
                f"the model was exported with fixed leading dimensions {sorted(set(fixed_first))}"
                f" on its inputs, none of them {batch_size}, so its batch dimension is unclear; "
                "re-export it with a dynamic batch dimension"
            )
        # Every input leads with the same fixed size: the batch it was exported at. `rebatch`
        # checks that the graph follows another.
        return Bound(
            [_with_leading(vi, batch_size) for vi in bound],
            symbols,
            batch_size,
            exported_batch=fixed_first[0],
        )
    return Bound(bound, symbols, batch_size)


def rebind(value_info: onnx.ValueInfoProto, bound: Bound) -> onnx.ValueInfoProto:
    """A copy of a declared shape with the symbols bound at the graph inputs replaced."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value_info)
    for axis, dim in enumerate(copy.type.tensor_type.shape.dim):
        if axis == 0 and dim.HasField("dim_value") and dim.dim_value == bound.exported_batch:
            dim.dim_value = bound.batch_size
            continue
        if not dim.HasField("dim_param"):
            continue
        if dim.dim_param in bound.symbols:
            value = bound.symbols[dim.dim_param]
        elif dim.dim_param.lower() in BATCH_DIM_NAMES:
            value = bound.batch_size
        else:
            continue
        dim.Clear()
        dim.dim_value = value
    return copy
