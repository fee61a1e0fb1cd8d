"""Eagle-style GCN: graph convolutions over the operator graph, read out at a global node.

From Dudziak et al., *BRP-NAS: Prediction-based NAS using GCNs* (NeurIPS 2020), section 4, whose
latency predictor ("Eagle") is four GCN layers (Kipf and Welling) of 600 hidden units, then a
fully connected layer, with a global node connected to every operator whose final embedding is
the graph's embedding. Eagle was built for NAS cells with one-hot operator features; PerfSeer
(section 4.3) runs it on whole models with DIPPM's features (Eagle-p) and with PerfSeer's
(Eagle-s). This module is Eagle-s: nodes carry the PerfGraph node features, and the global node
starts from the PerfGraph global features, laid out in disjoint columns so that the first
convolution learns one projection for each.

Every operator feeds the global node through one directed edge, so after the first layer the
global node has seen every operator and after four it has seen four hops of context around
each. Convolutions follow the data-flow direction, with self-loops and GCN's symmetric degree
normalisation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch
from torch_geometric.nn import GCNConv

from kubeseer.predictor import seernet


class EagleGCN(nn.Module):
    r"""BRP-NAS's GCN predictor on PerfGraph features.

    .. math::
        H^{(l+1)} = \mathrm{ReLU}\big(\hat{D}^{-1/2} \hat{A} \hat{D}^{-1/2} H^{(l)} W^{(l)}\big),
        \qquad \hat{\mathbf{y}} = W_{out}\, H^{(L)}_{g}

    where :math:`\hat{A}` is the operator graph plus one global node :math:`g` per graph with an
    edge from every operator, and self-loops.

    Args:
        node_channels: size of each node feature vector :math:`D_v`.
        global_channels: size of the global feature vector :math:`D_g`.
        out_channels: number of predicted metrics :math:`T`.
        hidden_channels: width of every GCN layer (default 600).
        num_layers: GCN layers (default 4).
        dropout: dropout after every GCN layer (default 0.2).

    Shapes:
        - input: a `Batch` of :math:`B` graphs with ``x (|V|, D_v)``, ``edge_index (2, |E|)``,
          ``u (B, D_g)``
        - output: :math:`(B, T)`
    """

    def __init__(
        self,
        node_channels: int,
        global_channels: int,
        out_channels: int,
        hidden_channels: int = 600,
        *,
        num_layers: int = 4,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        for name, value in (
            ("node_channels", node_channels),
            ("global_channels", global_channels),
            ("out_channels", out_channels),
            ("hidden_channels", hidden_channels),
            ("num_layers", num_layers),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.node_channels = node_channels
        self.global_channels = global_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.num_layers = num_layers
        self.dropout = dropout
        self.convs = nn.ModuleList()
        width = node_channels + global_channels
        for _ in range(num_layers):
            self.convs.append(GCNConv(width, hidden_channels))
            width = hidden_channels
        self.out = nn.Linear(hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every convolution and the output layer."""
        for conv in self.convs:
            assert isinstance(conv, GCNConv)
            conv.reset_parameters()
        self.out.reset_parameters()

    def forward(self, batch: Batch) -> Tensor:
        """Predict :math:`T` normalised metrics for every graph of `batch`."""
        x: Tensor = batch.x
        u: Tensor = batch.u
        index = seernet.graph_index(batch)
        num_nodes, num_graphs = x.size(0), u.size(0)
        h = torch.cat(
            [
                torch.cat([x, x.new_zeros(num_nodes, self.global_channels)], dim=1),
                torch.cat([u.new_zeros(num_graphs, self.node_channels), u], dim=1),
            ]
        )
        operators = torch.arange(num_nodes, device=x.device)
        to_global = torch.stack([operators, num_nodes + index])
        edge_index = torch.cat([batch.edge_index, to_global], dim=1)
        for conv in self.convs:
            h = torch.relu(conv(h, edge_index))
            h = nn.functional.dropout(h, self.dropout, self.training)
        out: Tensor = self.out(h[num_nodes:])
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.global_channels}, "
            f"{self.out_channels}, hidden_channels={self.hidden_channels}, "
            f"num_layers={self.num_layers}, dropout={self.dropout})"
        )
