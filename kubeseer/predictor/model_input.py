"""What a model reads for one PerfGraph run at a precision with an optimizer.

Training samples (`dataset.build_samples`) and served requests (`api.Predictor`) are built by
this one function, so the two can never read different columns.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from kubeseer.predictor import cost_model, targets


def build(graph: Data, precision: str, optimizer: str) -> Data:
    """What a model reads for `graph` run at `precision` with `optimizer`: the PerfGraph
    tensors with `targets.EXTRA_GLOBAL_FEATURES` appended to ``u``, and the graph's work per
    operator class (`cost_model.terms`) for a step-time prior."""
    extra = torch.tensor([targets.extra_globals(precision, optimizer)], dtype=graph.u.dtype)
    return Data(
        x=graph.x,
        edge_index=graph.edge_index,
        edge_attr=graph.edge_attr,
        u=torch.cat([graph.u, extra], dim=1),
        cost_terms=cost_model.terms(graph.x),
        precision=precision,
        optimizer=optimizer,
    )
