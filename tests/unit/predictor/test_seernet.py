import pytest
import torch
from torch_geometric.data import Batch, Data

from kubeseer.predictor import seernet

DV, DE, DG = 5, 3, 4


def random_graph(seed: int, num_nodes: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    num_edges = 2 * num_nodes
    return Data(
        x=torch.randn(num_nodes, DV, generator=g),
        edge_index=torch.randint(0, num_nodes, (2, num_edges), generator=g),
        edge_attr=torch.randn(num_edges, DE, generator=g),
        u=torch.randn(1, DG, generator=g),
    )


def batch_of(*sizes: int) -> Batch:
    return Batch.from_data_list([random_graph(i, n) for i, n in enumerate(sizes)])


def test_seernet_predicts_one_row_per_graph():
    model = seernet.SeerNet(DV, DE, DG, out_channels=2, hidden_channels=16)
    assert model(batch_of(4, 7, 3)).shape == (3, 2)


def test_seernet_multi_has_one_head_per_task():
    model = seernet.SeerNetMulti(DV, DE, DG, num_tasks=6, hidden_channels=16)
    assert len(model.heads) == 6
    assert model(batch_of(4, 7)).shape == (2, 6)


def test_each_head_only_moves_its_own_task():
    torch.manual_seed(0)
    model = seernet.SeerNetMulti(DV, DE, DG, num_tasks=3, hidden_channels=16)
    batch = batch_of(4, 5)
    before = model(batch).detach()
    with torch.no_grad():
        for p in model.heads[1].parameters():
            p.add_(1.0)
    after = model(batch).detach()
    torch.testing.assert_close(after[:, [0, 2]], before[:, [0, 2]])
    assert not torch.allclose(after[:, 1], before[:, 1])


def test_a_lone_unbatched_graph_is_predicted_like_a_batch_of_one():
    torch.manual_seed(0)
    model = seernet.SeerNet(DV, DE, DG, hidden_channels=16)
    graph = random_graph(0, 4)
    torch.testing.assert_close(model(graph), model(Batch.from_data_list([graph])))


def test_prediction_of_a_graph_does_not_depend_on_its_batch_mates():
    torch.manual_seed(0)
    model = seernet.SeerNetMulti(DV, DE, DG, num_tasks=2, hidden_channels=16)
    alone = model(Batch.from_data_list([random_graph(5, 6)]))
    together = model(Batch.from_data_list([random_graph(1, 3), random_graph(5, 6)]))
    torch.testing.assert_close(together[1:], alone)


def test_paper_sized_seernet_has_about_the_papers_parameter_count():
    # The paper reports 1.02M for SeerNet with its own (unpublished) feature sizes; with ~40
    # node, 8 edge and 30 global features the same layer plan lands in the same range.
    count = seernet.parameter_count(seernet.SeerNet(40, 8, 30))
    assert 0.6e6 < count < 1.2e6


def test_all_parameters_receive_gradient():
    model = seernet.SeerNetMulti(DV, DE, DG, num_tasks=2, hidden_channels=16)
    model(batch_of(4, 6)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_repr_shows_constructor_arguments():
    assert repr(seernet.SeerNetMulti(5, 3, 4, 6, 32, gnpb=False)) == (
        "SeerNetMulti(5, 3, 4, num_tasks=6, hidden_channels=32, synmm=True, gnpb=False)"
    )
    assert repr(seernet.SeerNet(5, 3, 4)) == (
        "SeerNet(5, 3, 4, out_channels=1, hidden_channels=256, synmm=True, gnpb=True)"
    )


def test_rejects_zero_tasks():
    with pytest.raises(ValueError, match="num_tasks"):
        seernet.SeerNetMulti(DV, DE, DG, num_tasks=0)


def test_with_heads_keeps_the_block_and_the_chosen_heads_in_their_new_order():
    torch.manual_seed(0)
    model = seernet.SeerNetMulti(DV, DE, DG, num_tasks=4, hidden_channels=16).eval()
    narrowed = model.with_heads([3, 1]).eval()
    batch = batch_of(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(narrowed(batch), model(batch)[:, [3, 1]])
    assert narrowed.num_tasks == 2
    narrowed.heads[0][0].weight.data.zero_()
    assert model.heads[3][0].weight.abs().sum() > 0, "the copy shares no tensors"
    with pytest.raises(ValueError, match="subset"):
        model.with_heads([4])
    with pytest.raises(ValueError, match="subset"):
        model.with_heads([])


DD = 3


def with_device(batch: Batch, seed: int) -> Batch:
    batch.device_x = torch.randn(
        batch.num_graphs, DD, generator=torch.Generator().manual_seed(seed)
    )
    return batch


def test_only_the_device_tasks_heads_read_the_device():
    torch.manual_seed(0)
    model = seernet.SeerNetMulti(
        DV, DE, DG, num_tasks=4, hidden_channels=16, device_channels=DD, device_tasks=(1, 3)
    ).eval()
    on_one = model(with_device(batch_of(4, 6), seed=1)).detach()
    on_other = model(with_device(batch_of(4, 6), seed=2)).detach()
    # Memory (tasks 0 and 2) is the same tensors on every GPU; step time is not.
    torch.testing.assert_close(on_one[:, [0, 2]], on_other[:, [0, 2]])
    assert not torch.allclose(on_one[:, [1, 3]], on_other[:, [1, 3]])
    # A device head is MLP(u' || d): recompute it from the block's embedding.
    batch = with_device(batch_of(4, 6), seed=1)
    out = model.block(batch.x, batch.edge_index, batch.edge_attr, batch.u, batch.batch)
    by_hand = model.heads[1].mlp(torch.cat([out.u, batch.device_x], dim=-1))
    torch.testing.assert_close(on_one[:, [1]], by_hand.detach())


def test_device_heads_need_a_device_and_device_tasks_need_device_channels():
    model = seernet.SeerNetMulti(DV, DE, DG, 2, 16, device_channels=DD, device_tasks=(1,))
    with pytest.raises(ValueError, match="device_x"):
        model(batch_of(4))
    with pytest.raises(ValueError, match="device_tasks"):
        seernet.SeerNetMulti(DV, DE, DG, 2, 16, device_channels=DD)
    with pytest.raises(ValueError, match="device_tasks"):
        seernet.SeerNetMulti(DV, DE, DG, 2, 16, device_channels=DD, device_tasks=(2,))


def test_with_heads_keeps_which_heads_read_the_device():
    torch.manual_seed(0)
    model = seernet.SeerNetMulti(
        DV, DE, DG, num_tasks=4, hidden_channels=16, device_channels=DD, device_tasks=(1, 3)
    ).eval()
    batch = with_device(batch_of(4, 6), seed=3)
    narrowed = model.with_heads([3, 0]).eval()
    assert narrowed.device_tasks == (0,)
    with torch.no_grad():
        torch.testing.assert_close(narrowed(batch), model(batch)[:, [3, 0]])
    memory_only = model.with_heads([2])
    assert memory_only.device_channels == 0 and memory_only.device_tasks == ()
