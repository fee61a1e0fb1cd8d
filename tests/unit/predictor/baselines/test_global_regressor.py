import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from kubeseer.predictor.baselines import global_regressor


def sample(seed: int, *, labelled: tuple[bool, bool] = (True, True)) -> Data:
    """Two metrics that are exact functions of u: exp(u0 + u1) and 10 * exp(u0)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(1, 3, generator=g) * 3
    y = torch.stack([torch.exp(u[0, 0] + u[0, 1]), 10 * torch.exp(u[0, 0])]).reshape(1, 2)
    return Data(
        x=torch.zeros(1, 1),
        edge_index=torch.empty(2, 0, dtype=torch.long),
        u=u,
        y=y,
        y_mask=torch.tensor([labelled]),
    )


def fitted(train, val=None):
    model = global_regressor.GradientBoostedRegressor(max_iter=100, learning_rate=0.2, seed=0)
    return model.fit(train, val)


def test_boosted_trees_learn_a_function_of_the_global_features():
    train = [sample(i) for i in range(150)]
    test = [sample(1000 + i) for i in range(50)]
    predicted = fitted(train, [sample(500 + i) for i in range(40)]).predict(test)
    truth = np.concatenate([s.y.numpy() for s in test])
    mape = np.mean(np.abs(predicted - truth) / truth, axis=0)
    assert predicted.shape == (50, 2)
    assert (mape < 0.15).all()


def test_missing_labels_are_ignored_and_unlabelled_metrics_predict_nan():
    train = [sample(i, labelled=(True, False)) for i in range(60)]
    # Garbage in the masked column must not matter.
    for s in train:
        s.y[0, 1] = -1.0
    predicted = fitted(train).predict([sample(999)])
    assert np.isfinite(predicted[0, 0])
    assert np.isnan(predicted[0, 1])


def test_feature_index_restricts_what_the_trees_see():
    train = [sample(i) for i in range(150)]
    test = [sample(1000 + i) for i in range(40)]
    truth = np.array([s.y[0, 0].item() for s in test])

    def mape(columns: list[int]) -> float:
        model = global_regressor.GradientBoostedRegressor(feature_index=columns, max_iter=100)
        predicted = model.fit(train).predict(test)[:, 0]
        return float(np.mean(np.abs(predicted - truth) / truth))

    # Metric 0 depends on u0 and u1 only: trees that see just u2 cannot follow it.
    assert mape([2]) > 3 * mape([0, 1])


def test_size_counts_fitted_leaves():
    model = fitted([sample(i) for i in range(60)])
    assert 0 < model.size <= 2 * 100 * model.max_leaf_nodes


def test_predict_before_fit_is_an_error():
    with pytest.raises(RuntimeError, match="before fit"):
        global_regressor.GradientBoostedRegressor().predict([sample(0)])


def test_non_positive_labels_are_rejected():
    bad = sample(0)
    bad.y[0, 0] = 0.0
    with pytest.raises(ValueError, match="positive"):
        fitted([bad, sample(1)])


def test_bad_hyper_parameters_are_rejected():
    with pytest.raises(ValueError):
        global_regressor.GradientBoostedRegressor(max_leaf_nodes=1)
