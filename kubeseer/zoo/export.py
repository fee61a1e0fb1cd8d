"""Deterministic ONNX export of zoo specs, with or without weight bytes.

Exporter choice (measured in docs/zoo.md): torch's dynamo exporter (``torch.export`` then
onnxscript). The TorchScript exporter is deprecated (every call raises a
``DeprecationWarning``) and stores tied embeddings twice, so BERT-base comes out 93 MB larger.

What the file looks like:

- One ``.onnx`` graph in opset `DEFAULT_OPSET`, inputs ``input`` (images, features) or
  ``input_ids`` (tokens), output ``logits``; the batch dimension is symbolic and named
  ``batch``; token models also have a symbolic ``seq``.
- Every floating-point initializer of at least `_EXTERNAL_MIN_BYTES` lives in a sidecar
  ``<file>.onnx.data`` at 64-byte aligned offsets in graph order. Small and integer
  initializers (shape constants the PerfGraph extractor needs) stay inline.
- With ``with_weights=False`` the graph is the same and the sidecar is not written:
  initializers keep their names, shapes, dtypes and external-data references, so weight bytes
  can still be counted, and a file exported without weights is interchangeable with one
  exported with them for everything except running it.
- Node metadata is dropped (stack traces with absolute paths, class hierarchies) but for each
  node's module path (``pkg.torch.onnx.name_scopes``: module names only) and the optimiser's
  rewrites that made it (``pkg.onnxscript.rewriter.rule_name``), so the bytes depend
  only on the spec, the opset and the torch/onnxscript versions, not on where the package is
  installed, and the graph carries the module calls a user's dynamo export carries
  (`kubeseer.predictor.extract.scopes`).

Weights are materialised in memory only when they are written. The exporter's optimiser folds
BatchNorm into convolutions and folds constants, which reads tensor values; on the meta device
it fails ("Cannot copy out of meta tensor"). It also makes value-dependent choices (it drops an
all-zero convolution bias and merges initializers with equal values, such as the all-ones scales
of freshly initialised LayerNorms), so a fresh model would export to a different graph than the
same model after training. So:

- with weights, the model is built with its initial values and `_make_values_generic` perturbs
  every constant-valued tensor, which makes the graph structure independent of the values and
  equal to what a trained model of the same spec exports to;
- without weights, the model is built on the meta device and `_make_weight_free` gives every
  parameter and floating-point buffer a value of its own, broadcast over its shape (a view with
  zero strides, no memory): the optimiser reads values where it folds, none is zero and no two
  are equal, so the same rules fire and the graph is the same (operators, wiring, initializer
  layout; only the small inline values differ). A model whose weights exceed this machine's
  memory (a Llama 2 13B holds 52 GB in fp32) exports in under a gigabyte (docs/zoo.md, "ONNX
  export").
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import onnx_ir as ir
import torch

from kubeseer.zoo import models, registry
from kubeseer.zoo.spec import ModelSpec

DEFAULT_OPSET: Final = 18
BATCH_DIM: Final = "batch"
SEQ_DIM: Final = "seq"
_EXTERNAL_MIN_BYTES: Final = 1024
_ALIGNMENT: Final = 64
_EXAMPLE_BATCH: Final = 2
MODULE_PATH_KEY: Final = "pkg.torch.onnx.name_scopes"
REWRITE_RULES_KEY: Final = "pkg.onnxscript.rewriter.rule_name"
KEPT_METADATA: Final = (MODULE_PATH_KEY, REWRITE_RULES_KEY)
"""The node metadata kept: the module path and the rewrites that made a node (a convolution a
BatchNorm was fused into carries the BatchNorm's path), as `kubeseer.predictor.extract.scopes`
reads them."""
_SEED: Final = 0


class ExportError(RuntimeError):
    """torch could not export a spec to ONNX (a bug in a family or in the exporter)."""


def export_onnx(
    spec: ModelSpec,
    path: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    with_weights: bool = True,
) -> Path:
    """Export `spec` to `path` (and ``<path>.data`` when `with_weights`), deterministically.

    Exporting the same spec twice gives the same bytes. The model is exported as it trains:
    in eval mode (BatchNorm folded into convolutions, as deployment exports are) but with its
    dropout (rate above 0) in training mode, so the graph shows the ``Dropout`` operators whose
    masks a training step keeps (see `_build_for_export`).

    Args:
        spec: what to export.
        path: the ``.onnx`` file to write; its parent directory must exist.
        opset: ONNX opset of the default domain.
        with_weights: write the weight sidecar; without it the graph keeps every initializer's
            shape, dtype and external-data reference but no bytes are written.

    Returns:
        `path` as a `Path`.

    Raises:
        ExportError: the exporter failed.
    """
    path = Path(path)
    model = _build_for_export(spec, materialise=with_weights)
    inputs, dynamic_shapes, input_name = _export_inputs(spec)
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                model,
                inputs,
                dynamo=True,
                verbose=False,
                input_names=[input_name],
                output_names=["logits"],
                dynamic_shapes=dynamic_shapes,
                opset_version=opset,
                optimize=True,
            )
    except Exception as e:
        raise ExportError(f"exporting {spec.describe()} failed: {e}") from e
    if program is None:
        raise ExportError(f"exporting {spec.describe()} returned no program")
    onnx_model = program.model
    _strip_metadata(onnx_model)
    data_path = path.with_name(path.name + ".data")
    layout = _externalise(onnx_model, data_path.name)
    if with_weights:
        _write_sidecar(data_path, layout)
    else:
        data_path.unlink(missing_ok=True)
    proto = ir.serde.serialize_model(onnx_model)
    path.write_bytes(proto.SerializeToString(deterministic=True))
    return path


def _build_for_export(spec: ModelSpec, *, materialise: bool = True) -> torch.nn.Module:
    """The spec's model in eval mode except its dropout, with generic values: materialised
    and perturbed (`_make_values_generic`), or broadcast from one value a tensor
    (`_make_weight_free`).

    An eval export drops dropout, yet a training step keeps a mask for every dropout and a
    masked copy of its input: up to a tenth of a BERT's training peak, invisible in such a
    graph. Dropout modules with a positive rate stay in training mode and export as ``Dropout``
    operators; one with rate 0 is the identity in either mode and stays out of the graph.
    """
    if materialise:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_SEED)
            model = models.build_model(spec).eval()
            _make_values_generic(model)
    else:
        with torch.device("meta"):
            model = models.build_model(spec).eval()
        _make_weight_free(model)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            module.train()
    return model


def _make_weight_free(model: torch.nn.Module) -> None:
    """Replace every parameter and floating-point buffer of a meta-device `model` by one value
    of its own broadcast over its shape, in module order: ``1 + k / 1024`` for the k-th tensor.

    A broadcast view holds one element, so exporting a model of any size costs no memory for
    its weights; the values are distinct and non-zero, so the optimiser's value-dependent rules
    (an all-zero bias dropped, equal initializers merged) fire exactly as on the perturbed
    values of a materialised export. Integer buffers (BatchNorm's batch counter) are scalars
    or small and are materialised as zeros.
    """
    count = 0

    def placeholder(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        if not tensor.is_floating_point():
            return torch.zeros(tensor.shape, dtype=tensor.dtype)
        count += 1
        return torch.full((), 1.0 + count / 1024, dtype=tensor.dtype).expand(tensor.shape)

    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                replacement = placeholder(parameter)
                module._parameters[name] = torch.nn.Parameter(replacement, requires_grad=False)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = placeholder(buffer)


@torch.no_grad()
def _make_values_generic(model: torch.nn.Module) -> None:
    """Nudge every constant-valued float tensor (zero biases, unit norm scales, BatchNorm
    running statistics) by a small seeded noise, so no value-dependent optimiser rule fires.

    The noise is at most 1% of the value's magnitude (or 0.01 around zero), so the exported
    network still computes what the spec describes.
    """
    generator = torch.Generator().manual_seed(_SEED)
    tensors = [*model.parameters(), *model.buffers()]
    for tensor in tensors:
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        first = tensor.reshape(-1)[0]
        if bool((tensor == first).all()):
            scale = max(0.01, 0.01 * abs(float(first)))
            noise = torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype) - 0.5
            tensor.add_(noise * (2 * scale))


def _export_inputs(spec: ModelSpec) -> tuple[tuple[torch.Tensor, ...], Any, str]:
    """Example inputs, their dynamic-shape description and the graph input name."""
    (example,), _ = models.example_batch(spec, _EXAMPLE_BATCH)
    dims: dict[int, Any] = {0: torch.export.Dim(BATCH_DIM)}
    name = "input"
    if registry.family(spec.family).task.takes_tokens:
        name = "input_ids"
        seq_len = example.shape[1]
        if seq_len >= 2:
            # torch.export specialises sizes 0 and 1; a 1-token spec keeps a static seq.
            dims[1] = torch.export.Dim(SEQ_DIM, max=int(spec.arch["max_positions"]))
    return (example,), (dims,), name


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence what the exporter says about itself, not about the model.

    torch 2.13's exporter trips a deprecation inside torch.export's own pytree code, and logs
    a warning per torchvision operator it cannot register when torchvision is absent (the zoo
    does not use torchvision). Neither is actionable here; anything else still surfaces.
    """
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                category=FutureWarning,
            )
            yield
    finally:
        registration.setLevel(level)


def _strip_metadata(model: ir.Model) -> None:
    """Drop per-node provenance but `KEPT_METADATA`: stack traces embed absolute source paths
    and would make the bytes depend on the install location; the module path and the rewrites
    are what the memory estimate reads a module call from, as it does in any dynamo export."""
    model.metadata_props.clear()
    model.doc_string = None
    graph = model.graph
    graph.metadata_props.clear()
    graph.doc_string = None
    for node in graph.all_nodes():
        kept: dict[str, str] = {
            key: node.metadata_props[key] for key in KEPT_METADATA if key in node.metadata_props
        }
        node.metadata_props.clear()
        node.metadata_props.update(kept)
        node.doc_string = None
        for output in node.outputs:
            output.metadata_props.clear()
    for value in (*graph.inputs, *graph.outputs, *graph.initializers.values()):
        value.metadata_props.clear()


def _externalise(model: ir.Model, location: str) -> list[tuple[int, ir.TensorProtocol]]:
    """Point large float initializers at `location`; return (offset, tensor) to write there."""
    layout: list[tuple[int, ir.TensorProtocol]] = []
    offset = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None or not tensor.dtype.is_floating_point():
            continue
        if tensor.nbytes < _EXTERNAL_MIN_BYTES:
            continue
        offset = -(-offset // _ALIGNMENT) * _ALIGNMENT
        layout.append((offset, tensor))
        value.const_value = ir.ExternalTensor(
            location,
            offset,
            tensor.nbytes,
            tensor.dtype,
            shape=ir.Shape(tensor.shape.numpy()),
            name=value.name or tensor.name or "",
        )
        offset += tensor.nbytes
    return layout


def _write_sidecar(data_path: Path, layout: list[tuple[int, ir.TensorProtocol]]) -> None:
    with data_path.open("wb") as f:
        for offset, tensor in layout:
            f.write(b"\0" * (offset - f.tell()))
            f.write(tensor.tobytes())
