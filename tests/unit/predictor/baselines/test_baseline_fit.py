"""Every torch baseline trains with the shared loop and learns a learnable target."""

import math

import pytest
import torch
from torch_geometric.data import Data

from kubeseer.predictor import evaluate, train
from kubeseer.predictor.baselines import eagle_gcn, global_regressor, mlp_node, pmgns

METRICS = ("train.memory_bytes", "infer.step_time_s")
DV, DE, DG = 4, 2, 3


def synthetic(n: int, seed: int) -> list[Data]:
    """Labels are exact functions of node and global features."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        nodes = int(torch.randint(3, 8, (1,), generator=g))
        x = torch.rand(nodes, DV, generator=g)
        u = torch.rand(1, DG, generator=g)
        memory = 1e6 * math.exp(0.5 * float(x[:, 0].sum()) + float(u[0, 1]))
        step = 1e-2 * math.exp(2 * float(u[0, 0]))
        out.append(
            Data(
                x=x,
                edge_index=torch.stack([torch.arange(nodes - 1), torch.arange(1, nodes)]),
                edge_attr=torch.rand(nodes - 1, DE, generator=g),
                u=u,
                y=torch.tensor([[memory, step]], dtype=torch.float64),
                y_mask=torch.tensor([[True, True]]),
                family="synthetic",
                config_hash=f"c{seed}x{i}",
            )
        )
    return out


BUILDERS = {
    "pmgns": lambda: pmgns.PMGNS(DV, DG, 2, hidden_channels=32, dropout=0.0),
    "eagle": lambda: eagle_gcn.EagleGCN(DV, DG, 2, hidden_channels=32, dropout=0.0),
    "mlp_node": lambda: mlp_node.MLPNode(DV, 2, max_nodes=8, hidden_channels=(32,)),
    "global_mlp": lambda: global_regressor.GlobalMLP(DG, 2, hidden_channels=(32, 16)),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_shared_training_loop_lowers_each_baselines_loss(name):
    torch.manual_seed(0)
    config = train.TrainConfig(lr=1e-2, batch_size=16, max_epochs=30, patience=30, pcgrad=False)
    result = train.fit(
        BUILDERS[name](), synthetic(64, 0), synthetic(16, 1), config, metrics=METRICS
    )
    first, last = result.history[0], result.history[-1]
    assert last.train_loss < 0.5 * first.train_loss
    predicted = result.predict(synthetic(8, 2))
    assert predicted.shape == (8, 2)
    assert (predicted > 0).all()


def test_boosted_trees_are_scored_by_the_shared_evaluation():
    model = global_regressor.GradientBoostedRegressor(max_iter=50).fit(
        synthetic(64, 0), synthetic(16, 1)
    )
    table = evaluate.evaluate(model.predict, synthetic(16, 2), METRICS)
    # The step time depends on u alone, which the trees see; the memory label also depends on
    # node features they cannot see.
    assert table.row("infer.step_time_s").mape < table.row("train.memory_bytes").mape
