import pytest
import torch

from kubeseer.predictor import synmm


def four_nodes() -> torch.Tensor:
    return torch.tensor([[1.0, -2.0], [3.0, 0.0], [-1.0, 4.0], [5.0, 2.0]])


def test_untrained_synmm_is_midpoint_of_max_and_mean():
    pool = synmm.SynMM(2)
    out = pool(four_nodes(), torch.zeros(4, dtype=torch.long), dim_size=1)
    expected = 0.5 * torch.tensor([[5.0, 4.0]]) + 0.5 * torch.tensor([[2.0, 1.0]])
    torch.testing.assert_close(out, expected)


def test_weights_select_max_or_mean_per_channel():
    pool = synmm.SynMM(2)
    with torch.no_grad():
        pool.alpha.copy_(torch.tensor([1.0, 0.0]))
        pool.beta.copy_(torch.tensor([0.0, 2.0]))
    out = pool(four_nodes(), torch.zeros(4, dtype=torch.long), dim_size=1)
    torch.testing.assert_close(out, torch.tensor([[5.0, 2.0]]))


def test_pools_each_graph_separately():
    pool = synmm.SynMM(2)
    index = torch.tensor([0, 0, 1, 1])
    out = pool(four_nodes(), index, dim_size=2)
    first = 0.5 * torch.tensor([3.0, 0.0]) + 0.5 * torch.tensor([2.0, -1.0])
    second = 0.5 * torch.tensor([5.0, 4.0]) + 0.5 * torch.tensor([2.0, 3.0])
    torch.testing.assert_close(out, torch.stack([first, second]))


def test_is_invariant_to_node_order():
    pool = synmm.SynMM(2)
    perm = torch.tensor([2, 0, 3, 1])
    index = torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(
        pool(four_nodes(), index, dim_size=1), pool(four_nodes()[perm], index, dim_size=1)
    )


def test_reset_parameters_restores_the_midpoint():
    pool = synmm.SynMM(3)
    with torch.no_grad():
        pool.alpha.fill_(7.0)
    pool.reset_parameters()
    assert torch.equal(pool.alpha, torch.full((3,), 0.5))


def test_repr_shows_channels():
    assert repr(synmm.SynMM(16)) == "SynMM(16)"


def test_rejects_non_positive_channels():
    with pytest.raises(ValueError, match="channels"):
        synmm.SynMM(0)
