"""PMGNS, the predictor of DIPPM: GraphSAGE embeddings and static features into an MLP head.

From Panner Selvam and Brorsson, *DIPPM: a Deep Learning Inference Performance Predictive Model
using Graph Neural Networks* (Euro-Par 2023), section 3.4 and Table 3: three sequential
GraphSAGE blocks, a graph readout concatenated with the static feature vector F_s, three fully
connected blocks, hidden width 512, dropout 0.05. PerfSeer (section 4.3) compares against it as
its strongest GNN baseline.

What the paper leaves open is fixed as in the authors' published model: each GraphSAGE block is
two SAGE convolutions (mean aggregation, L2-normalised outputs, ReLU between), followed by ReLU
and dropout; the readout sums node embeddings. The paper's F_s is five numbers (MACs, batch
size, counts of convolution, dense and ReLU operators); here F_s is the columns of the sample's
global vector named by `static_index` (`dippm_static_columns` picks the DIPPM-like ones), so
the baseline reads the same data as SeerNet. The output layer is linear because targets are
already normalised (the authors' ``-logsigmoid`` positivity trick is for raw units).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch
from torch_geometric.nn import SAGEConv, aggr

from kubeseer.predictor import seernet

#: Global features closest to DIPPM's F_s (eq. 1): total FLOPs stand in for MACs (2 FLOPs per
#: multiply-accumulate), the batch size is the batch size, and the operator count stands in for
#: the convolution, dense and ReLU counts, which the PerfGraph does not keep.
DIPPM_STATIC_FEATURES: Final[tuple[str, ...]] = ("flops_total", "batch_size", "num_nodes")


def dippm_static_columns(global_features: Sequence[str]) -> tuple[int, ...]:
    """Columns of ``u`` that form DIPPM's static features, given ``u``'s column names.

    Precision and optimizer one-hot columns (``precision=...``, ``optimizer=...``) are kept as
    well: DIPPM measured inference at one precision, so it needed neither, but a sample set with
    several would otherwise give PMGNS identical inputs with different labels.

    Raises:
        ValueError: a DIPPM feature is missing from `global_features`.
    """
    missing = [name for name in DIPPM_STATIC_FEATURES if name not in global_features]
    if missing:
        raise ValueError(f"global features lack {missing}; have {list(global_features)}")
    columns = [list(global_features).index(name) for name in DIPPM_STATIC_FEATURES]
    columns += [
        i for i, name in enumerate(global_features) if name.startswith(("precision=", "optimizer="))
    ]
    return tuple(columns)


class PMGNS(nn.Module):
    r"""DIPPM's Performance Model Graph Network Structure.

    .. math::
        \mathbf{h} = \sum_{i \in V} \mathrm{SAGE}^{(3)} \circ \mathrm{SAGE}^{(2)} \circ
            \mathrm{SAGE}^{(1)}(X, A)_i, \qquad
        \hat{\mathbf{y}} = \mathrm{FC}^{(3)}(\mathbf{h} \,\|\, \mathcal{F}_s)

    Args:
        node_channels: size of each node feature vector :math:`D_v`.
        global_channels: size of the sample's global vector ``u`` :math:`D_g`.
        out_channels: number of predicted metrics :math:`T`.
        hidden_channels: width of every SAGE and FC layer (default 512, DIPPM Table 3).
        num_blocks: GraphSAGE blocks (default 3).
        convs_per_block: SAGE convolutions per block (default 2).
        num_fc: fully connected blocks before the output layer (default 3).
        dropout: dropout after every block (default 0.05).
        static_index: columns of ``u`` forming :math:`\mathcal{F}_s` (default: all of them).

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
        hidden_channels: int = 512,
        *,
        num_blocks: int = 3,
        convs_per_block: int = 2,
        num_fc: int = 3,
        dropout: float = 0.05,
        static_index: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("node_channels", node_channels),
            ("global_channels", global_channels),
            ("out_channels", out_channels),
            ("hidden_channels", hidden_channels),
            ("num_blocks", num_blocks),
            ("convs_per_block", convs_per_block),
            ("num_fc", num_fc),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        columns = tuple(range(global_channels)) if static_index is None else tuple(static_index)
        if not columns or any(not 0 <= c < global_channels for c in columns):
            raise ValueError(
                f"static_index must name columns of u in 0..{global_channels - 1}, got {columns}"
            )
        self.node_channels = node_channels
        self.global_channels = global_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.num_blocks = num_blocks
        self.convs_per_block = convs_per_block
        self.num_fc = num_fc
        self.dropout = dropout
        self.static_index = columns

        self.convs = nn.ModuleList()
        width = node_channels
        for _ in range(num_blocks * convs_per_block):
            self.convs.append(SAGEConv(width, hidden_channels, aggr="mean", normalize=True))
            width = hidden_channels
        self.readout = aggr.SumAggregation()
        fc: list[nn.Module] = []
        width = hidden_channels + len(columns)
        for _ in range(num_fc):
            fc += [nn.Linear(width, hidden_channels), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden_channels
        self.fc = nn.Sequential(*fc)
        self.out = nn.Linear(hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every convolution and linear layer."""
        for conv in self.convs:
            assert isinstance(conv, SAGEConv)
            conv.reset_parameters()
        for layer in self.fc:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        self.out.reset_parameters()

    def forward(self, batch: Batch) -> Tensor:
        """Predict :math:`T` normalised metrics for every graph of `batch`."""
        index = seernet.graph_index(batch)
        h: Tensor = batch.x
        for i, conv in enumerate(self.convs):
            h = torch.relu(conv(h, batch.edge_index))
            if (i + 1) % self.convs_per_block == 0:
                h = nn.functional.dropout(h, self.dropout, self.training)
        pooled = self.readout(h, index, dim_size=batch.u.size(0))
        static = batch.u[:, list(self.static_index)]
        out: Tensor = self.out(self.fc(torch.cat([pooled, static], dim=-1)))
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.global_channels}, "
            f"{self.out_channels}, hidden_channels={self.hidden_channels}, "
            f"num_blocks={self.num_blocks}, convs_per_block={self.convs_per_block}, "
            f"num_fc={self.num_fc}, dropout={self.dropout}, static_index={self.static_index})"
        )
