"""Synergistic Max-Mean aggregation (SynMM), PerfSeer section 3.2.

Max aggregation keeps what the most demanding operators say (the one huge convolution that
sets peak memory); mean aggregation keeps the model's overall character. SynMM learns, per
channel, how much of each to trust, so the readout neither drowns a dominant node in the
average nor ignores the bulk of the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import aggr


class SynMM(nn.Module):
    r"""Learned per-channel linear combination of max and mean aggregation.

    .. math::
        \bar{\mathbf{v}} = \boldsymbol{\alpha} \odot \max_{i \in V} \mathbf{v}_i
            + \boldsymbol{\beta} \odot \frac{1}{|V|} \sum_{i \in V} \mathbf{v}_i

    From Zhao et al., *PerfSeer: An Efficient and Accurate Deep Learning Models Performance
    Predictor*, section 3.2 ("Synergistic Max-Mean Aggregation", eq. 7). The paper calls the
    combination "linear aggregation" without fixing its form; per-channel weights are the
    smallest form that lets every channel choose its own mix, and they start at 0.5 each so an
    untrained SynMM is the midpoint of max and mean.

    Args:
        channels: size of each node feature vector.

    Shapes:
        - input: node features :math:`(|V|, F)`, graph index :math:`(|V|,)`, number of graphs
          :math:`B`
        - output: :math:`(B, F)`
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        if channels <= 0:
            raise ValueError(f"channels must be positive, got {channels}")
        self.channels = channels
        self.max_aggr = aggr.MaxAggregation()
        self.mean_aggr = aggr.MeanAggregation()
        self.alpha = nn.Parameter(torch.empty(channels))
        self.beta = nn.Parameter(torch.empty(channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Start halfway between max and mean pooling."""
        nn.init.constant_(self.alpha, 0.5)
        nn.init.constant_(self.beta, 0.5)
        self.max_aggr.reset_parameters()
        self.mean_aggr.reset_parameters()

    def forward(self, x: Tensor, index: Tensor, dim_size: int) -> Tensor:
        """Pool node features `x` into one vector per graph named by `index`."""
        maximum = self.max_aggr(x, index, dim_size=dim_size)
        mean = self.mean_aggr(x, index, dim_size=dim_size)
        out: Tensor = self.alpha * maximum + self.beta * mean
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.channels})"
