"""MLP-Node: every node's features side by side in one fixed-length vector, then an MLP.

From Zhao et al., *PerfSeer: An Efficient and Accurate Deep Learning Models Performance
Predictor*, section 4.3 ("Baseline"): "MLP-Node uses an MLP to predict model performance,
concatenating features from all nodes in the graph and handling variable node numbers by
padding or truncating them to a fixed size." It is the no-topology control: it sees what every
operator costs but not how operators connect, and it depends on node order by construction
(nodes come in the graph's execution order). The paper gives only its size relative to SeerNet
("more than four times the parameters"); the defaults here (256 nodes, hidden 512 and 256) land
there for PerfGraph-sized node vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch_geometric.data import Batch
from torch_geometric.utils import to_dense_batch

from kubeseer.predictor import seernet


class MLPNode(nn.Module):
    r"""An MLP over the zero-padded (or truncated) concatenation of node features.

    .. math::
        \hat{\mathbf{y}} = \mathrm{MLP}(\mathbf{v}_1 \| \mathbf{v}_2 \| \dots \| \mathbf{v}_N),
        \quad \mathbf{v}_i = \mathbf{0} \text{ for } i > |V|

    Args:
        node_channels: size of each node feature vector :math:`D_v`.
        out_channels: number of predicted metrics :math:`T`.
        max_nodes: :math:`N`, nodes kept per graph; later nodes are dropped (default 256).
        hidden_channels: widths of the hidden layers (default ``(512, 256)``).

    Shapes:
        - input: a `Batch` of :math:`B` graphs with ``x (|V|, D_v)``
        - output: :math:`(B, T)`
    """

    def __init__(
        self,
        node_channels: int,
        out_channels: int,
        *,
        max_nodes: int = 256,
        hidden_channels: Sequence[int] = (512, 256),
    ) -> None:
        super().__init__()
        for name, value in (
            ("node_channels", node_channels),
            ("out_channels", out_channels),
            ("max_nodes", max_nodes),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not hidden_channels or any(w <= 0 for w in hidden_channels):
            raise ValueError(f"hidden_channels must be positive widths, got {hidden_channels}")
        self.node_channels = node_channels
        self.out_channels = out_channels
        self.max_nodes = max_nodes
        self.hidden_channels = tuple(hidden_channels)
        layers: list[nn.Module] = []
        width = max_nodes * node_channels
        for hidden in self.hidden_channels:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_channels))
        self.mlp = nn.Sequential(*layers)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every linear layer."""
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def forward(self, batch: Batch) -> Tensor:
        """Predict :math:`T` normalised metrics for every graph of `batch`."""
        dense, _ = to_dense_batch(
            batch.x,
            seernet.graph_index(batch),
            fill_value=0.0,
            max_num_nodes=self.max_nodes,
            batch_size=batch.u.size(0),
        )
        if dense.size(1) < self.max_nodes:
            dense = nn.functional.pad(dense, (0, 0, 0, self.max_nodes - dense.size(1)))
        out: Tensor = self.mlp(dense.flatten(1))
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.out_channels}, "
            f"max_nodes={self.max_nodes}, hidden_channels={self.hidden_channels})"
        )
