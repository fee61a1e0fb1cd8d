r"""Whether a graph is like the graphs a checkpoint learned from.

A memory head learns the correction to the analytic estimate from the families it was trained
on. On a graph unlike all of them the correction is an extrapolation: left out of training,
an MLP's training memory came out 1.0 % off with it against 0.4 % for the analytic estimate
alone (docs/accuracy.md, "Leave one family out"). What the network does know is where its own
training graphs lie: SeerBlock's global embedding :math:`\mathbf{u}'`, the vector every head
reads. A graph whose embedding is farther from its `neighbours`-th nearest training embedding
than a `quantile` of held-out graphs of the known families are from theirs is *novel*, and its
memory is never below the physics (`train.predict_flagged`): away from its training graphs the
correction may raise the estimate, which costs a larger slice, but not lower it, which would
cost an out-of-memory failure.

The threshold is the split-conformal quantile of those held-out distances, so on graphs like
the training data about ``1 - quantile`` of samples are flagged (and lose little: the analytic
estimate is within a few percent of every known family), while graphs of an unseen family are
flagged far more often. Distances are Euclidean on embeddings standardised per channel with
the training embeddings' statistics, so no channel dominates by scale alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor

DEFAULT_NEIGHBOURS: Final = 5
DEFAULT_QUANTILE: Final = 0.95


@dataclass(frozen=True, eq=False)
class NoveltyGate:
    """k-nearest-neighbour distance of a graph embedding to the training embeddings.

    Args:
        mean, std: per-channel statistics of the training embeddings.
        reference: the standardised training embeddings, ``(N, D)``; stored as float16 (a
            distance needs no more precision, and it halves the checkpoint's share).
        neighbours: which nearest reference embedding the distance is measured to.
        quantile: share of held-out graphs of the known families that are not novel.
        threshold: the distance above which a graph is novel.
    """

    mean: Tensor
    std: Tensor
    reference: Tensor
    neighbours: int
    quantile: float
    threshold: float

    @classmethod
    def fit(
        cls,
        training: Tensor,
        held_out: Tensor,
        *,
        neighbours: int = DEFAULT_NEIGHBOURS,
        quantile: float = DEFAULT_QUANTILE,
    ) -> NoveltyGate:
        """Reference the `training` embeddings, threshold at the `quantile` of `held_out`'s
        distances (split conformal: ``ceil((n + 1) * quantile)``-th smallest of n).

        Raises:
            ValueError: too few embeddings for the neighbours or the quantile.
        """
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if training.dim() != 2 or training.size(0) < neighbours or neighbours < 1:
            raise ValueError(
                f"need at least {neighbours} training embeddings (N, D), "
                f"got {tuple(training.shape)}"
            )
        rank = math.ceil((held_out.size(0) + 1) * quantile)
        if rank > held_out.size(0):
            raise ValueError(
                f"{held_out.size(0)} held-out embeddings cannot place a {quantile:.0%} threshold"
            )
        training = training.float()
        mean = training.mean(dim=0)
        std = training.std(dim=0, unbiased=False).clamp_min(1e-6)
        unfitted = cls(
            mean=mean,
            std=std,
            reference=((training - mean) / std).half(),
            neighbours=neighbours,
            quantile=quantile,
            threshold=math.inf,
        )
        distances = unfitted.distances(held_out).sort().values
        return cls(
            mean=mean,
            std=std,
            reference=unfitted.reference,
            neighbours=neighbours,
            quantile=quantile,
            threshold=float(distances[rank - 1]),
        )

    def distances(self, embeddings: Tensor) -> Tensor:
        """Distance of each row of `embeddings` ``(B, D)`` to its `neighbours`-th nearest
        reference embedding, ``(B,)``."""
        scaled = (embeddings.float() - self.mean) / self.std
        between = torch.cdist(scaled, self.reference.float())
        return between.topk(self.neighbours, dim=1, largest=False).values[:, -1]

    def novel(self, embeddings: Tensor) -> Tensor:
        """Whether each row of `embeddings` lies beyond the threshold, ``(B,)`` bool."""
        return self.distances(embeddings) > self.threshold

    def to_dict(self) -> dict[str, Any]:
        """Tensors and plain numbers only, so a checkpoint loads with ``weights_only=True``."""
        return {
            "mean": self.mean.clone(),
            "std": self.std.clone(),
            "reference": self.reference.clone(),
            "neighbours": self.neighbours,
            "quantile": self.quantile,
            "threshold": self.threshold,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NoveltyGate:
        """Inverse of `to_dict`."""
        try:
            gate = cls(
                mean=data["mean"].float(),
                std=data["std"].float(),
                reference=data["reference"].half(),
                neighbours=int(data["neighbours"]),
                quantile=float(data["quantile"]),
                threshold=float(data["threshold"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a novelty gate: {e}") from e
        width = gate.reference.size(-1)
        if gate.mean.shape != (width,) or gate.std.shape != (width,):
            raise ValueError("novelty gate statistics do not match its reference embeddings")
        if not 1 <= gate.neighbours <= gate.reference.size(0):
            raise ValueError(f"novelty gate has {gate.neighbours} neighbours out of range")
        return gate
