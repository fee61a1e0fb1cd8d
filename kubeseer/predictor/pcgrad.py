"""PCGrad: projecting conflicting gradients for SeerNet-Multi's multi-metric training.

From Yu et al., *Gradient Surgery for Multi-Task Learning* (NeurIPS 2020), as used by
PerfSeer section 3.2 ("SeerNet-Multi"). Memory, utilisation and step time pull the shared
SeerBlock in different directions; where two task gradients point against each other (negative
cosine) one is projected onto the normal plane of the other, so no task's update undoes
another's. Tasks are visited in a fresh random order for each task, as in the paper's
algorithm, so no task is systematically favoured.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def project_conflicting(grads: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""Sum of task gradients after projecting away every pairwise conflict.

    .. math::
        \mathbf{g}_i^{PC} \leftarrow \mathbf{g}_i^{PC}
            - \frac{\mathbf{g}_i^{PC} \cdot \mathbf{g}_j}{\lVert \mathbf{g}_j \rVert^2}
            \mathbf{g}_j \quad \text{if } \mathbf{g}_i^{PC} \cdot \mathbf{g}_j < 0,
        \qquad \mathbf{g} = \sum_i \mathbf{g}_i^{PC}

    for every other task :math:`j` in a random order; :math:`\mathbf{g}_j` is always the
    original (unprojected) gradient of task :math:`j`.

    Args:
        grads: one flattened gradient per task.
        generator: random source for the task orders (seeded training is reproducible).

    Shapes:
        - input: :math:`(T, P)`
        - output: :math:`(P,)`
    """
    if grads.dim() != 2:
        raise ValueError(f"expected task gradients of shape (T, P), got {tuple(grads.shape)}")
    num_tasks = grads.size(0)
    projected = grads.clone()
    squared_norms = (grads * grads).sum(dim=1)
    for i in range(num_tasks):
        order = torch.randperm(num_tasks, generator=generator).tolist()
        for j in order:
            if j == i or squared_norms[j] == 0:
                continue
            dot = projected[i] @ grads[j]
            if dot < 0:
                projected[i] -= (dot / squared_norms[j]) * grads[j]
    return projected.sum(dim=0)


class PCGrad:
    """Fills `.grad` of `parameters` with the PCGrad combination of several task losses.

    Use it in place of ``sum(losses).backward()``; the optimizer step is unchanged.

    Args:
        parameters: the parameters to differentiate (all of the model's: a head that a task
            does not use gets a zero gradient from it, which never conflicts).
        generator: random source for the task orders.
    """

    def __init__(
        self, parameters: Sequence[nn.Parameter], generator: torch.Generator | None = None
    ) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise ValueError("PCGrad needs at least one trainable parameter")
        self.generator = generator

    def backward(self, losses: Sequence[Tensor]) -> None:
        """Write the de-conflicted, summed gradient of `losses` into each parameter's `.grad`."""
        if not losses:
            raise ValueError("PCGrad.backward needs at least one task loss")
        rows = []
        for k, loss in enumerate(losses):
            grads = torch.autograd.grad(
                loss, self.parameters, retain_graph=k < len(losses) - 1, allow_unused=True
            )
            rows.append(
                torch.cat(
                    [
                        (torch.zeros_like(p) if g is None else g).reshape(-1)
                        for p, g in zip(self.parameters, grads, strict=True)
                    ]
                )
            )
        combined = project_conflicting(torch.stack(rows), self.generator)
        offset = 0
        for p in self.parameters:
            size = p.numel()
            p.grad = combined[offset : offset + size].view_as(p).clone()
            offset += size

    def __repr__(self) -> str:
        count = sum(p.numel() for p in self.parameters)
        return f"{type(self).__name__}(parameters={count})"
