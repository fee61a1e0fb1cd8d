"""SeerNet and SeerNet-Multi: a SeerBlock followed by MLP prediction heads.

From Zhao et al., *PerfSeer: An Efficient and Accurate Deep Learning Models Performance
Predictor*, section 3.2 ("SeerNet", "SeerNet-Multi"). Both read a PyG `Batch` of PerfGraph
samples (``x``, ``edge_index``, ``edge_attr``, ``u``, ``batch``) and return one row of
predictions per graph, in whatever normalised target space they were trained in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch

from kubeseer.predictor import seer_block


def head(hidden_channels: int, out_channels: int) -> nn.Sequential:
    """The paper's prediction head: a two-layer MLP of `hidden_channels` units, then the output."""
    return nn.Sequential(
        nn.Linear(hidden_channels, hidden_channels),
        nn.ReLU(),
        nn.Linear(hidden_channels, hidden_channels),
        nn.ReLU(),
        nn.Linear(hidden_channels, out_channels),
    )


def graph_index(batch: Batch) -> Tensor:
    """The graph each node belongs to (all zeros for a lone graph that was never batched)."""
    index: Tensor | None = batch.batch
    if index is None:
        return torch.zeros(batch.x.size(0), dtype=torch.long, device=batch.x.device)
    return index


class SeerNet(nn.Module):
    r"""SeerBlock embedding :math:`\mathbf{u}'` followed by one two-layer MLP head.

    .. math::
        \hat{\mathbf{y}} = \mathrm{MLP}_{head}(\mathrm{SeerBlock}(G).\mathbf{u}')

    Args:
        node_channels: size of each node feature vector :math:`D_v`.
        edge_channels: size of each edge feature vector :math:`D_e`.
        global_channels: size of the global feature vector :math:`D_g`.
        out_channels: number of predicted metrics :math:`T` (default 1: the paper trains one
            SeerNet per metric).
        hidden_channels: width of every MLP (default 256).
        synmm: see `SeerBlock`.
        gnpb: see `SeerBlock`.

    Shapes:
        - input: a `Batch` of :math:`B` graphs
        - output: :math:`(B, T)`
    """

    def __init__(
        self,
        node_channels: int,
        edge_channels: int,
        global_channels: int,
        out_channels: int = 1,
        hidden_channels: int = 256,
        *,
        synmm: bool = True,
        gnpb: bool = True,
    ) -> None:
        super().__init__()
        if out_channels <= 0:
            raise ValueError(f"out_channels must be positive, got {out_channels}")
        self.node_channels = node_channels
        self.edge_channels = edge_channels
        self.global_channels = global_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.synmm = synmm
        self.gnpb = gnpb
        self.block = seer_block.SeerBlock(
            node_channels, edge_channels, global_channels, hidden_channels, synmm=synmm, gnpb=gnpb
        )
        self.head = head(hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise the block and the head."""
        self.block.reset_parameters()
        seer_block.reset_mlp(self.head)

    def forward(self, batch: Batch) -> Tensor:
        """Predict :math:`T` normalised metrics for every graph of `batch`."""
        out = self.block(batch.x, batch.edge_index, batch.edge_attr, batch.u, graph_index(batch))
        prediction: Tensor = self.head(out.u)
        return prediction

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.edge_channels}, "
            f"{self.global_channels}, out_channels={self.out_channels}, "
            f"hidden_channels={self.hidden_channels}, synmm={self.synmm}, gnpb={self.gnpb})"
        )


class SeerNetMulti(nn.Module):
    r"""One shared SeerBlock and one two-layer MLP head per metric.

    .. math::
        \hat{y}_t = \mathrm{MLP}_{head,t}(\mathrm{SeerBlock}(G).\mathbf{u}'), \quad
        t = 1 \dots T

    Heads are separate so that, under PCGrad, each metric keeps parameters of its own while the
    block's parameters receive the de-conflicted sum of the task gradients.

    **Device-aware heads** (kubeseer's extension, not in the paper): the heads of the tasks in
    `device_tasks` also read the device the job runs on, :math:`\mathbf{d}` (``device_x``: its
    specs, `kubeseer.predictor.device`), concatenated to the embedding:

    .. math::
        \hat{y}_t = \mathrm{MLP}_{head,t}(\mathbf{u}' \,\|\, \mathbf{d}), \quad
        t \in \text{device\_tasks}

    The graph's embedding does not depend on the device, so a step-time head learns how one
    graph's cost moves with the device while memory heads (the same tensors on every GPU) stay
    blind to it.

    Args:
        node_channels: size of each node feature vector :math:`D_v`.
        edge_channels: size of each edge feature vector :math:`D_e`.
        global_channels: size of the global feature vector :math:`D_g`.
        num_tasks: number of metrics :math:`T` (6 in the paper: train/infer x memory, SM
            utilisation, step time).
        hidden_channels: width of every MLP (default 256).
        synmm: see `SeerBlock`.
        gnpb: see `SeerBlock`.
        device_channels: size of ``device_x`` :math:`D_d` (default 0: no head reads a device).
        device_tasks: the tasks whose heads read it (default none).

    Shapes:
        - input: a `Batch` of :math:`B` graphs (with ``device_x`` :math:`(B, D_d)` when
          `device_tasks` is not empty)
        - output: :math:`(B, T)`
    """

    def __init__(
        self,
        node_channels: int,
        edge_channels: int,
        global_channels: int,
        num_tasks: int,
        hidden_channels: int = 256,
        *,
        synmm: bool = True,
        gnpb: bool = True,
        device_channels: int = 0,
        device_tasks: Sequence[int] = (),
    ) -> None:
        super().__init__()
        if num_tasks <= 0:
            raise ValueError(f"num_tasks must be positive, got {num_tasks}")
        if any(not 0 <= k < num_tasks for k in device_tasks) or (
            bool(device_tasks) != (device_channels > 0)
        ):
            raise ValueError(
                f"device_tasks {tuple(device_tasks)} must be tasks of 0..{num_tasks - 1}, and "
                f"given exactly when device_channels ({device_channels}) is positive"
            )
        self.node_channels = node_channels
        self.edge_channels = edge_channels
        self.global_channels = global_channels
        self.num_tasks = num_tasks
        self.hidden_channels = hidden_channels
        self.synmm = synmm
        self.gnpb = gnpb
        self.device_channels = device_channels
        self.device_tasks = tuple(sorted(set(device_tasks)))
        self.block = seer_block.SeerBlock(
            node_channels, edge_channels, global_channels, hidden_channels, synmm=synmm, gnpb=gnpb
        )
        self.heads = nn.ModuleList(
            _DeviceHead(hidden_channels, device_channels)
            if k in self.device_tasks
            else head(hidden_channels, 1)
            for k in range(num_tasks)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise the block and every head."""
        self.block.reset_parameters()
        for task_head in self.heads:
            if isinstance(task_head, _DeviceHead):
                task_head.reset_parameters()
            else:
                assert isinstance(task_head, nn.Sequential)
                seer_block.reset_mlp(task_head)

    def forward(self, batch: Batch) -> Tensor:
        """Predict :math:`T` normalised metrics for every graph of `batch`."""
        out = self.block(batch.x, batch.edge_index, batch.edge_attr, batch.u, graph_index(batch))
        device_x: Tensor | None = getattr(batch, "device_x", None) if self.device_tasks else None
        if self.device_tasks and device_x is None:
            raise ValueError("device-aware heads need the batch's device_x")
        return torch.cat(
            [
                task_head(out.u, device_x)
                if isinstance(task_head, _DeviceHead)
                else task_head(out.u)
                for task_head in self.heads
            ],
            dim=-1,
        )

    def with_heads(self, tasks: Sequence[int]) -> SeerNetMulti:
        """A copy with this block and only the heads of `tasks`, in that order.

        The start of a fine-tune on data that labels fewer metrics than this model predicts
        (a new device measured for some of them): the block carries what graphs cost, which
        transfers; a head with no labels would drift untrained as the block moves under it, so
        it is left out rather than kept stale.
        """
        if not tasks or any(not 0 <= k < self.num_tasks for k in tasks):
            raise ValueError(f"tasks must be a non-empty subset of 0..{self.num_tasks - 1}")
        out = SeerNetMulti(
            self.node_channels,
            self.edge_channels,
            self.global_channels,
            len(tasks),
            self.hidden_channels,
            synmm=self.synmm,
            gnpb=self.gnpb,
            device_channels=self.device_channels if set(tasks) & set(self.device_tasks) else 0,
            device_tasks=[i for i, k in enumerate(tasks) if k in self.device_tasks],
        )
        out.block.load_state_dict(self.block.state_dict())
        for new_head, k in zip(out.heads, tasks, strict=True):
            new_head.load_state_dict(self.heads[k].state_dict())
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.node_channels}, {self.edge_channels}, "
            f"{self.global_channels}, num_tasks={self.num_tasks}, "
            f"hidden_channels={self.hidden_channels}, synmm={self.synmm}, gnpb={self.gnpb}"
            + (
                f", device_channels={self.device_channels}, device_tasks={self.device_tasks})"
                if self.device_channels
                else ")"
            )
        )


class _DeviceHead(nn.Module):
    """A prediction head that reads the graph embedding and the device's features."""

    def __init__(self, hidden_channels: int, device_channels: int) -> None:
        super().__init__()
        self.hidden_channels = hidden_channels
        self.device_channels = device_channels
        self.mlp = nn.Sequential(
            nn.Linear(hidden_channels + device_channels, hidden_channels),
            nn.ReLU(),
            nn.Linear(hidden_channels, hidden_channels),
            nn.ReLU(),
            nn.Linear(hidden_channels, 1),
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise the MLP."""
        seer_block.reset_mlp(self.mlp)

    def forward(self, embedding: Tensor, device_x: Tensor | None) -> Tensor:
        r""":math:`\mathrm{MLP}(\mathbf{u}' \| \mathbf{d})`, ``(B, 1)``."""
        assert device_x is not None
        out: Tensor = self.mlp(torch.cat([embedding, device_x.to(embedding)], dim=-1))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.hidden_channels}, {self.device_channels})"


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters, the figure the paper compares models by."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
