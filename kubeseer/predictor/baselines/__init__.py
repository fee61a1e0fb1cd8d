"""Baselines SeerNet is measured against, each from the paper that proposed it.

Every torch baseline follows the predictor's contract, ``forward(batch) -> Tensor (B, T)`` on
normalised targets, so `train.fit` trains it and `evaluate.evaluate` scores it exactly like
SeerNet. The gradient-boosted regressor is not trained by gradient descent and brings its own
``fit``. The analytic memory estimator, the fourth non-learned comparison, is production code
(the prior of every memory prediction) and lives in `kubeseer.predictor.analytic_memory`.
"""

from kubeseer.predictor.baselines.eagle_gcn import EagleGCN
from kubeseer.predictor.baselines.global_regressor import GlobalMLP, GradientBoostedRegressor
from kubeseer.predictor.baselines.mlp_node import MLPNode
from kubeseer.predictor.baselines.pmgns import PMGNS

__all__ = ["PMGNS", "EagleGCN", "GlobalMLP", "GradientBoostedRegressor", "MLPNode"]
