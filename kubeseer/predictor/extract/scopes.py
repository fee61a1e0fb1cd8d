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
"""

from __future__ import annotations

import ast
from typing import Final

import onnx

from kubeseer.predictor import eager

NAME_SCOPES: Final = "pkg.torch.onnx.name_scopes"
_MAX_SCOPES_CHARS: Final = 1 << 16
"""Longer metadata is not a module stack an exporter wrote; it is ignored, not parsed."""


def module_path(node: onnx.NodeProto) -> str:
    """The module path `node` ran under, ``""`` when the file does not say."""
    for entry in node.metadata_props:
        if entry.key == NAME_SCOPES:
            return _dynamo_path(entry.value)
    return eager.scope_of(node.name)


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
