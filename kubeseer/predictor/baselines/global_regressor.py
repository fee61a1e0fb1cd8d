"""Global-feature regressors: predict a job's needs from whole-model numbers only.

From Gu et al., *Liquid: Intelligent Resource Estimation and Network-Efficient Scheduling for Deep
Learning Jobs on Distributed GPU Clusters* (IEEE TPDS 2021) and Yeung et al., *Horus:
Interference-Aware and Prediction-Based Scheduling in Deep Learning Systems* (IEEE TPDS 2021),
which estimate GPU memory and utilisation with tree ensembles over global features such as batch
size, FLOPs and parameter count; PerfSeer (section 2) cites both as the global-features class of
predictors. Two forms are here, both reading the sample's global vector ``u`` (the PerfGraph
global features and the precision one-hot):

- `GradientBoostedRegressor`: one gradient-boosted tree ensemble per metric (scikit-learn's
  histogram GBDT, the same family as Horus's XGBoost), on log targets, early-stopped on the
  validation split. scikit-learn is a development dependency, imported when fitting.
- `GlobalMLP`: the MLP variant (Bai et al.'s DNNAbacus, Lu et al.'s Augur, DNNPerf's MLP
  baseline widths 512-128-16), a torch module trained by `train.fit` like every other model.

Neither sees the graph, which is what makes them the control for "does topology matter".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data


class GlobalMLP(nn.Module):
    r"""An MLP on the global feature vector alone.

    .. math::
        \hat{\mathbf{y}} = \mathrm{MLP}(\mathbf{u})

    Args:
        global_channels: size of the global feature vector :math:`D_g`.
        out_channels: number of predicted metrics :math:`T`.
        hidden_channels: widths of the hidden layers (default ``(512, 128, 16)``, DNNPerf's MLP
            baseline).

    Shapes:
        - input: a `Batch` of :math:`B` graphs with ``u (B, D_g)``
        - output: :math:`(B, T)`
    """

    def __init__(
        self,
        global_channels: int,
        out_channels: int,
        *,
        hidden_channels: Sequence[int] = (512, 128, 16),
    ) -> None:
        super().__init__()
        if global_channels <= 0 or out_channels <= 0:
            raise ValueError(
                f"channels must be positive, got global_channels={global_channels}, "
                f"out_channels={out_channels}"
            )
        if not hidden_channels or any(w <= 0 for w in hidden_channels):
            raise ValueError(f"hidden_channels must be positive widths, got {hidden_channels}")
        self.global_channels = global_channels
        self.out_channels = out_channels
        self.hidden_channels = tuple(hidden_channels)
        layers: list[nn.Module] = []
        width = global_channels
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
        out: Tensor = self.mlp(batch.u)
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.global_channels}, {self.out_channels}, "
            f"hidden_channels={self.hidden_channels})"
        )


def _stack(samples: Sequence[Data], attr: str) -> npt.NDArray[Any]:
    if not samples:
        raise ValueError("no samples")
    rows = [torch.as_tensor(getattr(s, attr)).reshape(1, -1) for s in samples]
    return torch.cat(rows).detach().cpu().numpy()


class GradientBoostedRegressor:
    """One histogram gradient-boosted tree ensemble per metric on the global features.

    Trees split on thresholds, so they need no feature scaling; targets are fitted in log space
    because the metrics span orders of magnitude and the evaluation is relative error. Samples
    whose label is missing (``y_mask`` false) do not count for that metric.

    Args:
        feature_index: columns of ``u`` to use (default: all).
        max_iter: boosting rounds at most (default 500; early stopping usually ends sooner).
        learning_rate: shrinkage (default 0.05).
        max_leaf_nodes: leaves per tree (default 31).
        seed: random state of the early-stopping split when no validation set is given.
        threads: OpenMP threads for fitting and predicting (default 1). The ensembles are small;
            on a shared machine OpenMP's spinning worker threads make them tens of times slower,
            not faster.
    """

    def __init__(
        self,
        *,
        feature_index: Sequence[int] | None = None,
        max_iter: int = 500,
        learning_rate: float = 0.05,
        max_leaf_nodes: int = 31,
        seed: int = 0,
        threads: int = 1,
    ) -> None:
        if max_iter <= 0 or max_leaf_nodes < 2 or learning_rate <= 0 or threads <= 0:
            raise ValueError(
                f"need max_iter > 0, max_leaf_nodes >= 2, learning_rate > 0 and threads > 0, "
                f"got {max_iter}, {max_leaf_nodes}, {learning_rate}, {threads}"
            )
        self.feature_index = None if feature_index is None else tuple(feature_index)
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.seed = seed
        self.threads = threads
        self._models: list[Any | None] = []

    def _features(self, samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        u = _stack(samples, "u").astype(np.float64)
        if self.feature_index is not None:
            u = u[:, list(self.feature_index)]
        return u

    def fit(self, train: Sequence[Data], val: Sequence[Data] | None = None) -> Self:
        """Fit one ensemble per metric column of ``y`` that has at least one training label.

        Raises:
            ValueError: no training samples, or labels that are not positive.
        """
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        x_train = self._features(train)
        y_train = _stack(train, "y").astype(np.float64)
        m_train = _stack(train, "y_mask").astype(bool)
        if (y_train[m_train] <= 0).any():
            raise ValueError("labels must be positive: the ensembles fit log targets")
        validation = None
        if val:
            validation = (
                self._features(val),
                _stack(val, "y").astype(np.float64),
                _stack(val, "y_mask").astype(bool),
            )
        self._models = []
        for t in range(y_train.shape[1]):
            rows = m_train[:, t]
            if not rows.any():
                self._models.append(None)
                continue
            kwargs: dict[str, npt.NDArray[Any]] = {}
            if validation is not None:
                x_val, y_val, m_val = validation
                val_rows = m_val[:, t] & (y_val[:, t] > 0)
                if val_rows.sum() >= 2:
                    kwargs = {"X_val": x_val[val_rows], "y_val": np.log(y_val[val_rows, t])}
            # Without a validation split, stop early only where sklearn's own heuristic would
            # (large data): carving 10% out of a small training set costs more than it saves.
            model = HistGradientBoostingRegressor(
                max_iter=self.max_iter,
                learning_rate=self.learning_rate,
                max_leaf_nodes=self.max_leaf_nodes,
                early_stopping=True if kwargs else "auto",
                random_state=self.seed,
            )
            with threadpool_limits(limits=self.threads, user_api="openmp"):
                model.fit(x_train[rows], np.log(y_train[rows, t]), **kwargs)
            self._models.append(model)
        return self

    def predict(self, samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        """Predictions ``(N, T)`` in label units; NaN for metrics that had no training labels.

        Raises:
            RuntimeError: `fit` has not run.
        """
        from threadpoolctl import threadpool_limits

        if not self._models:
            raise RuntimeError("GradientBoostedRegressor.predict called before fit")
        x = self._features(samples)
        out = np.full((x.shape[0], len(self._models)), np.nan)
        with threadpool_limits(limits=self.threads, user_api="openmp"):
            for t, model in enumerate(self._models):
                if model is not None:
                    out[:, t] = np.exp(model.predict(x))
        return out

    @property
    def size(self) -> int:
        """Learned leaf values at most (trees fitted x leaves per tree): its "parameter count"."""
        return sum(int(m.n_iter_) for m in self._models if m is not None) * self.max_leaf_nodes

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(feature_index={self.feature_index}, "
            f"max_iter={self.max_iter}, learning_rate={self.learning_rate}, "
            f"max_leaf_nodes={self.max_leaf_nodes}, seed={self.seed}, threads={self.threads})"
        )
