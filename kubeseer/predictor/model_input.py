"""What a model reads for one PerfGraph run at a precision with an optimizer, on a device.

Training samples (`dataset.build_samples`, `gpu_samples`) and served requests
(`api.Predictor`) are built by this one function, so the two can never read different columns.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from kubeseer.hardware import mig
from kubeseer.predictor import cost_model, targets
from kubeseer.predictor import device as device_mod


def build(graph: Data, precision: str, optimizer: str, device: mig.Device | None = None) -> Data:
    """What a model reads for `graph` run at `precision` with `optimizer`: the PerfGraph
    tensors with `targets.EXTRA_GLOBAL_FEATURES` appended to ``u``, and the graph's work per
    operator class (`cost_model.terms`) for a step-time prior.

    With `device` (a device-aware model), the work is counted in seconds at the device's peak
    rates (`cost_model.device_terms`) and the device's specs ride along as ``device_x``
    (`kubeseer.predictor.device.features`).
    """
    extra = torch.tensor([targets.extra_globals(precision, optimizer)], dtype=graph.u.dtype)
    sample = Data(
        x=graph.x,
        edge_index=graph.edge_index,
        edge_attr=graph.edge_attr,
        u=torch.cat([graph.u, extra], dim=1),
        cost_terms=(
            cost_model.terms(graph.x)
            if device is None
            else cost_model.device_terms(graph.x, device, precision)
        ),
        precision=precision,
        optimizer=optimizer,
    )
    if device is not None:
        sample.device_x = device_mod.features(device, precision)
    return sample
