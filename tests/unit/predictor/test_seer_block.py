import pytest
import torch

from kubeseer.predictor import seer_block

# A 4-node diamond: 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3.
EDGE_INDEX = torch.tensor([[0, 0, 1, 2], [1, 2, 3, 3]])
DV, DE, DG, H = 3, 2, 2, 8


def graph():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, DV, generator=g)
    edge_attr = torch.randn(4, DE, generator=g)
    u = torch.randn(1, DG, generator=g)
    return x, edge_attr, u


def softmax_pool(values, t):
    weights = torch.softmax(values * t, dim=0)
    return (weights * values).sum(dim=0, keepdim=True)


def test_matches_equations_2_to_8_on_a_hand_written_graph():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H)
    x, edge_attr, u = graph()
    out = block(x, EDGE_INDEX, edge_attr, u, torch.zeros(4, dtype=torch.long))

    e = torch.stack(
        [
            block.mlp_e(torch.cat([edge_attr[j], x[s], x[t]]))
            for j, (s, t) in enumerate(EDGE_INDEX.T.tolist())
        ]
    )
    e_bar = torch.stack([torch.zeros(H), e[0], e[1], (e[2] + e[3]) / 2])
    z = softmax_pool(x, block.z_init.t)
    v = torch.stack([block.mlp_v(torch.cat([e_bar[i], x[i] + z[0], u[0]])) for i in range(4)])
    z_new = block.mlp_z(softmax_pool(v, block.node_to_z.t) + block.lift_z(z))
    synmm = 0.5 * v.max(dim=0).values + 0.5 * v.mean(dim=0)
    u_new = block.mlp_u(torch.cat([synmm, z_new[0], u[0]]))

    torch.testing.assert_close(out.edge_attr, e)
    torch.testing.assert_close(out.x, v)
    torch.testing.assert_close(out.z, z_new)
    torch.testing.assert_close(out.u, u_new.unsqueeze(0))


def test_without_synmm_and_gnpb_the_globals_see_only_mean_pooled_nodes():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H, synmm=False, gnpb=False)
    x, edge_attr, u = graph()
    out = block(x, EDGE_INDEX, edge_attr, u, torch.zeros(4, dtype=torch.long))
    e = block.mlp_e(torch.cat([edge_attr, x[EDGE_INDEX[0]], x[EDGE_INDEX[1]]], dim=1))
    e_bar = torch.stack([torch.zeros(H), e[0], e[1], (e[2] + e[3]) / 2])
    v = block.mlp_v(torch.cat([e_bar, x, u.expand(4, -1)], dim=1))
    u_new = block.mlp_u(torch.cat([v.mean(dim=0, keepdim=True), u], dim=1))
    assert out.z is None
    torch.testing.assert_close(out.u, u_new)


def test_is_invariant_to_edge_order():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H)
    x, edge_attr, u = graph()
    batch = torch.zeros(4, dtype=torch.long)
    perm = torch.tensor([3, 1, 0, 2])
    a = block(x, EDGE_INDEX, edge_attr, u, batch)
    b = block(x, EDGE_INDEX[:, perm], edge_attr[perm], u, batch)
    torch.testing.assert_close(a.x, b.x)
    torch.testing.assert_close(a.u, b.u)
    torch.testing.assert_close(a.edge_attr[perm], b.edge_attr)


def test_is_invariant_to_node_relabelling():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H)
    x, edge_attr, u = graph()
    batch = torch.zeros(4, dtype=torch.long)
    new_id = torch.tensor([2, 0, 3, 1])  # old node i becomes new node new_id[i]
    x_perm = torch.empty_like(x)
    x_perm[new_id] = x
    a = block(x, EDGE_INDEX, edge_attr, u, batch)
    b = block(x_perm, new_id[EDGE_INDEX], edge_attr, u, batch)
    torch.testing.assert_close(a.u, b.u)
    torch.testing.assert_close(a.x, b.x[new_id])


def test_batched_graphs_do_not_leak_into_each_other():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H)
    x, edge_attr, u = graph()
    x2, edge_attr2, u2 = x * 2 + 1, edge_attr - 1, u + 3
    alone = block(x, EDGE_INDEX, edge_attr, u, torch.zeros(4, dtype=torch.long))
    both = block(
        torch.cat([x, x2]),
        torch.cat([EDGE_INDEX, EDGE_INDEX + 4], dim=1),
        torch.cat([edge_attr, edge_attr2]),
        torch.cat([u, u2]),
        torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
    )
    torch.testing.assert_close(both.u[:1], alone.u)
    assert both.u.shape == (2, H) and both.z is not None and both.z.shape == (2, H)


def test_reset_parameters_reinitialises_every_mlp():
    torch.manual_seed(0)
    block = seer_block.SeerBlock(DV, DE, DG, H)
    before = [p.detach().clone() for p in block.parameters()]
    block.reset_parameters()
    changed = [not torch.equal(a, b) for a, b in zip(before, block.parameters(), strict=True)]
    assert sum(changed) >= len(before) - 4  # SynMM weights and temperatures reset to constants


def test_repr_shows_constructor_arguments():
    block = seer_block.SeerBlock(3, 2, 5, 16, synmm=False)
    assert repr(block) == "SeerBlock(3, 2, 5, hidden_channels=16, synmm=False, gnpb=True)"


@pytest.mark.parametrize(
    "field", ["node_channels", "edge_channels", "global_channels", "hidden_channels"]
)
def test_rejects_non_positive_sizes(field):
    sizes = {"node_channels": 3, "edge_channels": 2, "global_channels": 2, "hidden_channels": 8}
    sizes[field] = 0
    with pytest.raises(ValueError, match=field):
        seer_block.SeerBlock(**sizes)


def test_mlp_needs_a_hidden_layer():
    with pytest.raises(ValueError, match="hidden layer"):
        seer_block.mlp(3, 8, 0)
