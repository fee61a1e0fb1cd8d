import pytest
import torch
from torch import nn

from kubeseer.predictor import pcgrad


def test_conflicting_gradients_are_projected_onto_each_others_normal_plane():
    grads = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
    # g1 . g2 = -1: g1' = g1 + 0.5 g2 = (0.5, 0.5); g2' = g2 + 1 g1 = (0, 1).
    combined = pcgrad.project_conflicting(grads, torch.Generator().manual_seed(0))
    torch.testing.assert_close(combined, torch.tensor([0.5, 1.5]))


def test_projected_gradient_no_longer_conflicts():
    grads = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
    first_only = pcgrad.project_conflicting(grads[[0, 1]], None) - torch.tensor([0.0, 1.0])
    assert first_only @ grads[1] == pytest.approx(0.0)


def test_agreeing_gradients_are_summed_unchanged():
    grads = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    torch.testing.assert_close(pcgrad.project_conflicting(grads), torch.tensor([2.0, 3.0]))


def test_task_order_is_random_and_each_order_gives_its_hand_computed_sum():
    grads = torch.tensor([[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]])
    # g1 ends at (0.5, 0) or (0.5, 0.5), g2 at (0, 0), g3 at (0, -0.5) or (-0.5, -0.5),
    # depending on the order in which the other tasks are visited.
    possible = {
        (g1x + g3x, g1y + g3y)
        for g1x, g1y in ((0.5, 0.0), (0.5, 0.5))
        for g3x, g3y in ((0.0, -0.5), (-0.5, -0.5))
    }
    seen = set()
    for seed in range(20):
        combined = pcgrad.project_conflicting(grads, torch.Generator().manual_seed(seed))
        seen.add(tuple(round(v, 6) for v in combined.tolist()))
    assert seen <= possible
    assert len(seen) > 1


def test_zero_gradient_task_never_projects_others():
    grads = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    torch.testing.assert_close(pcgrad.project_conflicting(grads), torch.tensor([1.0, 2.0]))


def test_rejects_gradients_that_are_not_a_matrix():
    with pytest.raises(ValueError, match=r"\(T, P\)"):
        pcgrad.project_conflicting(torch.zeros(3))


def test_backward_writes_the_projected_sum_into_grad():
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.0, 0.0]]))
    x = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
    out = layer(x).squeeze(-1)
    # d(-out_k)/dw = -x_k: task gradients are -(1,0) and -(-1,1), which conflict.
    losses = [-out[0], -out[1]]
    pcgrad.PCGrad(list(layer.parameters())).backward(losses)
    expected = pcgrad.project_conflicting(-x)
    assert layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad.reshape(-1), expected)


def test_unused_parameter_gets_zero_gradient():
    used, unused = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    pcgrad.PCGrad([used, unused]).backward([used.sum(), (2 * used).sum()])
    assert unused.grad is not None and torch.equal(unused.grad, torch.zeros(3))
    assert used.grad is not None and torch.equal(used.grad, torch.full((2,), 3.0))


def test_backward_needs_a_loss():
    with pytest.raises(ValueError, match="at least one task loss"):
        pcgrad.PCGrad([nn.Parameter(torch.ones(1))]).backward([])
