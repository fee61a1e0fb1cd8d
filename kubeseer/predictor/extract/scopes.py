"""The module path each operator ran under, wherever the exporter wrote it.

The eager reading of inference memory (`eager`, `analytic_memory.Rules.EAGER`) needs each
operator's module path: a module call holds its arguments until ``forward`` returns. PyTorch's
two ONNX exporters record that path in different places:

* TorchScript (``torch.onnx.export(..., dynamo=False)``) writes it into the node name,
  ``/layer1/layer1.0/conv1/Conv`` (`eager.scope_of`);
* dynamo (the default of ``torch.onnx.export`` from PyTorch 2.9) names nodes after their FX
  node (``node_conv2d_1``) and writes the path into the node's metadata: the
  ``pkg.torch.onnx.name_scopes`` entry is a Python list literal of the root module (``''``),
  each enclosing module by qualified name, and the FX node last
  (``['', 'stages', 'stages.0', ..., 'stages.0.blocks.0.conv_dw', 'conv2d_1']``).

Reading only names, a dynamo export had no module calls, and the same ConvNeXt-T was served
13.5 % less inference memory exported by dynamo than by TorchScript (docs/predictor.md,
"Module paths from either exporter"). A path is only ever compared by its ``/``-separated
prefixes, so the two spellings (TorchScript's attribute names, dynamo's qualified names) give
the same module calls.

The dynamo exporter's graph rewrites make some operators afresh, without metadata: the two
slices of a Llama's ``rotate_half`` become one Split with no path. Read as the top-level
``forward``, such an operator ends every module call around it, and each call's arguments were
held to the end of the graph: a Llama's inference memory was over-estimated 2.9 times
(docs/predictor.md). In a file whose operators carry paths in metadata, an operator without one
ran in the deepest module that holds all its neighbours (`module_paths`). The rewriter's
``FuseBatchNormIntoConv`` leaves the fused convolution the BatchNorm's path (``stem/stem.norm1``,
its rules listed under `REWRITE_RULES`): the convolution then reads as running inside the
norm-act module its output is given to, and maxvit_tiny_tf_224's inference estimate was 21 %
under its TorchScript export's. Its own module is its weight's: ``stem.conv1.weight`` ran in
``stem/stem.conv1``.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Final

import onnx

from kubeseer.predictor import eager

NAME_SCOPES: Final = "pkg.torch.onnx.name_scopes"
REWRITE_RULES: Final = "pkg.onnxscript.rewriter.rule_name"
"""The onnxscript rewrites that made a node, comma-separated."""
_FUSED_NORMALISATION: Final = "FuseBatchNormIntoConv"
_MAX_SCOPES_CHARS: Final = 1 << 16
"""Longer metadata is not a module stack an exporter wrote; it is ignored, not parsed."""


def module_path(node: onnx.NodeProto) -> str:
    """The module path `node` ran under, ``""`` when the file does not say."""
    metadata = {entry.key: entry.value for entry in node.metadata_props}
    if NAME_SCOPES not in metadata:
        return eager.scope_of(node.name)
    if _FUSED_NORMALISATION in metadata.get(REWRITE_RULES, "") and (owner := _weight_owner(node)):
        return owner
    return _dynamo_path(metadata[NAME_SCOPES])


def _weight_owner(node: onnx.NodeProto) -> str:
    """``'stem/stem.conv1'`` for a convolution whose weight is ``stem.conv1.weight``; ``""``
    for a weight not named by its module."""
    if len(node.input) < 2:
        return ""
    parts = node.input[1].split(".")
    if len(parts) < 2 or parts[-1] != "weight" or not all(parts) or "/" in node.input[1]:
        return ""
    return "/".join(".".join(parts[:depth]) for depth in range(1, len(parts)))


def module_paths(nodes: Sequence[onnx.NodeProto]) -> tuple[str, ...]:
    """Each node's module path (`module_path`); in a dynamo export, a node the exporter wrote no
    metadata for gets the longest path its producers and readers with metadata share."""
    written = [_has_metadata(node) for node in nodes]
    paths = [module_path(node) for node in nodes]
    if not any(written) or all(written):
        return tuple(paths)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    for i, node in enumerate(nodes):
        if written[i]:
            continue
        neighbours = [producer[name] for name in node.input if name in producer]
        neighbours += [r for name in node.output for r in readers.get(name, ())]
        paths[i] = _shared_path([paths[n] for n in neighbours if written[n]])
    return tuple(paths)


def _has_metadata(node: onnx.NodeProto) -> bool:
    return any(entry.key == NAME_SCOPES for entry in node.metadata_props)


def _shared_path(paths: Sequence[str]) -> str:
    """The longest ``/``-separated prefix of every path in `paths`, ``""`` for none."""
    if not paths:
        return ""
    shared = paths[0].split("/")
    for path in paths[1:]:
        parts = path.split("/")
        depth = 0
        while depth < min(len(shared), len(parts)) and shared[depth] == parts[depth]:
            depth += 1
        shared = shared[:depth]
    return "/".join(shared)


def _dynamo_path(value: str) -> str:
    """``'a/a.b'`` from ``"['', 'a', 'a.b', 'fx_node']"``; ``""`` for anything else."""
    if not isinstance(value, str) or len(value) > _MAX_SCOPES_CHARS:
        return ""
    try:
        scopes = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ""
    if (
        not isinstance(scopes, list)
        or len(scopes) < 2
        or scopes[0] != ""
        or not all(isinstance(scope, str) and scope and "/" not in scope for scope in scopes[1:])
    ):
        return ""
    return "/".join(scopes[1:-1])
