"""Baselines SeerNet is measured against, each from the paper that proposed it.

Every torch baseline follows the predictor's contract, ``forward(batch) -> Tensor (B, T)`` on
normalised targets, so `train.fit` trains it and `evaluate.evaluate` scores it exactly like
SeerNet. The gradient-boosted regressor and the analytic memory estimator are not trained by
gradient descent and bring their own ``fit``/``estimate``.
"""

from kubeseer.predictor.baselines.analytic_memory import (
    DEVICE_PROFILES,
    DeviceProfile,
    MemoryBreakdown,
    MemoryEstimateError,
    MemoryGraph,
    OpNode,
    Optimizer,
    calibrate,
    estimate,
)
from kubeseer.predictor.baselines.eagle_gcn import EagleGCN
from kubeseer.predictor.baselines.global_regressor import GlobalMLP, GradientBoostedRegressor
from kubeseer.predictor.baselines.mlp_node import MLPNode
from kubeseer.predictor.baselines.pmgns import PMGNS

__all__ = [
    "DEVICE_PROFILES",
    "PMGNS",
    "DeviceProfile",
    "EagleGCN",
    "GlobalMLP",
    "GradientBoostedRegressor",
    "MLPNode",
    "MemoryBreakdown",
    "MemoryEstimateError",
    "MemoryGraph",
    "OpNode",
    "Optimizer",
    "calibrate",
    "estimate",
]
