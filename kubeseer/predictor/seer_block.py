"""SeerBlock: one graph-network update of a PerfGraph's edges, nodes, global node and globals.

From Zhao et al., *PerfSeer: An Efficient and Accurate Deep Learning Models Performance
Predictor*, section 3.2, equations 1-8 (a Battaglia-style graph network block with the
paper's two additions, SynMM and the GNPB global node).

Dimension choices the paper leaves open, fixed here and in docs/predictor.md:

- "an MLP with one layer of 256 hidden units" is read as one hidden layer: ``Linear(in, 256)
  -> ReLU -> Linear(256, 256)``; MLP_z has two hidden layers. Every update therefore outputs
  ``hidden_channels`` features.
- GNPB's global node ``z`` starts as the softmax aggregation of the *raw* node features, so it
  lives in node-feature space (size ``node_channels``) and eq. 4's ``v_i + z`` is well defined.
  Eq. 6 adds the aggregated updated nodes (size ``hidden_channels``) to ``z``; a bias-free
  linear map ``W_z`` lifts ``z`` into the hidden space first. Because MLP_z starts with a linear
  layer, this only factorises that layer: it adds no expressive power the paper lacks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch_geometric.nn import aggr

from kubeseer.predictor import synmm as synmm_lib


def mlp(in_channels: int, hidden_channels: int, hidden_layers: int) -> nn.Sequential:
    """`hidden_layers` x (Linear -> ReLU), then a Linear back to `hidden_channels`."""
    if hidden_layers < 1:
        raise ValueError(f"an MLP needs at least one hidden layer, got {hidden_layers}")
    layers: list[nn.Module] = []
    width = in_channels
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, hidden_channels), nn.ReLU()]
        width = hidden_channels
    layers.append(nn.Linear(hidden_channels, hidden_channels))
    return nn.Sequential(*layers)


def reset_mlp(module: nn.Sequential) -> None:
    """Re-initialise every linear layer of an `mlp`."""
    for layer in module:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()


class SeerBlockOutput(NamedTuple):
    """The updated PerfGraph :math:`G' = (u', V', E')` and the updated global node."""

    x: Tensor
    edge_attr: Tensor
    u: Tensor
    z: Tensor | None


class SeerBlock(nn.Module):
    r"""PerfSeer's SeerBlock (equations 1-8).

    .. math::
        \mathbf{e}'_j &= \mathrm{MLP}_e(\mathbf{e}_j \,\|\, \mathbf{v}_{s_j} \,\|\,
            \mathbf{v}_{t_j}) \\
        \bar{\mathbf{e}}'_i &= \frac{1}{|E'_i|} \sum_{j:\, t_j = i} \mathbf{e}'_j \\
        \mathbf{v}'_i &= \mathrm{MLP}_v(\bar{\mathbf{e}}'_i \,\|\, (\mathbf{v}_i + \mathbf{z})
            \,\|\, \mathbf{u}) \\
        \mathbf{z}' &= \mathrm{MLP}_z(\mathrm{softmax}(V') + W_z \mathbf{z}) \\
        \bar{\mathbf{v}}'_u &= \mathrm{SynMM}(V') \\
        \mathbf{u}' &= \mathrm{MLP}_u(\bar{\mathbf{v}}'_u \,\|\, \mathbf{z}' \,\|\, \mathbf{u})

    with :math:`\mathbf{z} = \mathrm{softmax}(V)` over the input node features (GNPB).
    ``softmax`` is PyG's `SoftmaxAggregation` with a learned temperature.

    Args:
        node_channels: size of each input node feature vector :math:`D_v`.
        edge_channels: size of each input edge feature vector :math:`D_e`.
        global_channels: size of the input global feature vector :math:`D_g`.
        hidden_channels: width of every MLP and of every output (default 256, the paper's).
        synmm: pool nodes into the globals with SynMM; ``False`` uses mean pooling (the
            paper's "no SynMM" ablation).
        gnpb: use the global node ``z``; ``False`` drops it from eq. 4 and eq. 8 (the paper's
            "no GNPB" ablation).

    Shapes:
        - input: node features :math:`(|V|, D_v)`, edge index :math:`(2, |E|)`, edge features
          :math:`(|E|, D_e)`, globals :math:`(B, D_g)`, graph index of each node
          :math:`(|V|,)`
        - output: :math:`V'\ (|V|, H)`, :math:`E'\ (|E|, H)`, :math:`u'\ (B, H)`,
          :math:`z'\ (B, H)` or ``None``
    """

    def __init__(
        self,
        node_channels: int,
        edge_channels: int,
        global_channels: int,
        hidden_channels: int = 256,
        *,
        synmm: bool = True,
        gnpb: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (
            ("node_channels", node_channels),
            ("edge_channels", edge_channels),
            ("global_channels", global_channels),
            ("hidden_channels", hidden_channels),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.node_channels = node_channels
        self.edge_channels = edge_channels
        self.global_channels = global_channels
        self.hidden_channels = hidden_channels
        self.synmm = synmm
        self.gnpb = gnpb

        hidden = hidden_channels
        self.mlp_e = mlp(edge_channels + 2 * node_channels, hidden, 1)
        self.edge_to_node = aggr.MeanAggregation()
        self.mlp_v = mlp(hidden + node_channels + global_channels, hidden, 1)
        self.node_to_global: nn.Module = (
            synmm_lib.SynMM(hidden) if synmm else aggr.MeanAggregation()
        )
        z_channels = hidden if gnpb else 0
        self.mlp_u = mlp(hidden + z_channels + global_channels, hidden, 1)
        self.z_init: aggr.SoftmaxAggregation | None = None
        self.node_to_z: aggr.SoftmaxAggregation | None = None
        self.lift_z: nn.Linear | None = None
        self.mlp_z: nn.Sequential | None = None
        if gnpb:
            self.z_init = aggr.SoftmaxAggregation(learn=True)
            self.node_to_z = aggr.SoftmaxAggregation(learn=True)
            self.lift_z = nn.Linear(node_channels, hidden, bias=False)
            self.mlp_z = mlp(hidden, hidden, 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every MLP, aggregation and the global node's lift."""
        reset_mlp(self.mlp_e)
        reset_mlp(self.mlp_v)
        reset_mlp(self.mlp_u)
        self.edge_to_node.reset_parameters()
        reset = getattr(self.node_to_global, "reset_parameters", None)
        if reset is not None:
            reset()
        if self.gnpb:
            assert self.z_init is not None and self.node_to_z is not None
            assert self.lift_z is not None and self.mlp_z is not None
            self.z_init.reset_parameters()
            self.node_to_z.reset_parameters()
            self.lift_z.reset_parameters()
            reset_mlp(self.mlp_z)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor,
        u: Tensor,
        batch: Tensor,
    ) -> SeerBlockOutput:
        """Update edges, nodes, the global node and the globals of a batch of PerfGraphs."""
        num_nodes = x.size(0)
        num_graphs = u.size(0)
        source, target = edge_index[0], edge_index[1]

        edges = self.mlp_e(torch.cat([edge_attr, x[source], x[target]], dim=-1))
        incoming = self.edge_to_node(edges, target, dim_size=num_nodes)

        z: Tensor | None = None
        node_self = x
        if self.gnpb:
            assert self.z_init is not None
            z = self.z_init(x, batch, dim_size=num_graphs)
            node_self = x + z[batch]
        nodes = self.mlp_v(torch.cat([incoming, node_self, u[batch]], dim=-1))

        z_new: Tensor | None = None
        if self.gnpb:
            assert z is not None and self.node_to_z is not None
            assert self.lift_z is not None and self.mlp_z is not None
            pooled_z = self.node_to_z(nodes, batch, dim_size=num_graphs)
            z_new = self.mlp_z(pooled_z + self.lift_z(z))

        pooled_u = self.node_to_global(nodes, batch, dim_size=num_graphs)
        parts = [pooled_u, u] if z_new is None else [pooled_u, z_new, u]
        globals_new = self.mlp_u(torch.cat(parts, dim=-1))
        return SeerBlockOutput(x=nodes, edge_attr=edges, u=globals_new, z=z_new)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.edge_channels}, "
            f"{self.global_channels}, hidden_channels={self.hidden_channels}, "
            f"synmm={self.synmm}, gnpb={self.gnpb})"
        )
