import pytest
import torch
from torch_geometric.data import Batch, Data

from kubeseer.predictor import normalise, schema

DV, DE, DG = len(schema.NODE_FEATURES), len(schema.EDGE_FEATURES), len(schema.GLOBAL_FEATURES)


def sample(seed, y, mask):
    g = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.rand(4, DV, generator=g) * 10,
        edge_index=torch.tensor([[0, 0, 1, 2], [1, 2, 3, 3]]),
        edge_attr=torch.rand(4, DE, generator=g),
        u=torch.rand(1, DG, generator=g) + seed,
        y=torch.tensor([y], dtype=torch.float64),
        y_mask=torch.tensor([mask]),
    )


def samples():
    return [
        sample(0, [1e6, 0.01], [True, True]),
        sample(1, [1e8, 0.0], [True, False]),
        sample(2, [1e7, 0.1], [True, True]),
    ]


def test_targets_are_log_standardised_over_present_labels_only():
    norm = normalise.Normaliser.fit(samples(), ["a", "b"])
    logs_b = torch.tensor([0.01, 0.1], dtype=torch.float64).log()
    assert norm.target_mean[1] == pytest.approx(float(logs_b.mean()))
    assert norm.target_std[1] == pytest.approx(float(logs_b.std(unbiased=False)))
    assert norm.target_mean[0] == pytest.approx(7 * float(torch.tensor(10.0).log()))


def test_decode_inverts_encode():
    norm = normalise.Normaliser.fit(samples(), ["a", "b"])
    y = torch.tensor([[3e6, 0.05], [2e9, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(norm.decode_targets(norm.encode_targets(y)), y)


def test_features_are_standardised_with_training_statistics():
    data = samples()
    norm = normalise.Normaliser.fit(data, ["a", "b"])
    batch = norm.features(Batch.from_data_list(data))
    torch.testing.assert_close(batch.x.mean(dim=0), torch.zeros(DV), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        batch.u.std(dim=0, unbiased=False), torch.ones(DG), atol=1e-4, rtol=0
    )


def test_features_leave_the_original_batch_untouched():
    data = samples()
    norm = normalise.Normaliser.fit(data, ["a", "b"])
    original = data[0].x.clone()
    norm.features(data[0])
    assert torch.equal(data[0].x, original)


def test_constant_columns_keep_unit_scale():
    data = samples()
    for d in data:
        d.u[0, 0] = 5.0
    norm = normalise.Normaliser.fit(data, ["a", "b"])
    assert norm.u.std[0] == 1.0


def test_dropped_feature_group_becomes_zero():
    data = samples()
    dropped = normalise.dropped_columns(["node.c", "global.b"])
    norm = normalise.Normaliser.fit(data, ["a", "b"], drop_x=dropped["x"], drop_u=dropped["u"])
    batch = norm.features(Batch.from_data_list(data))
    assert torch.all(batch.x[:, schema.NODE_FEATURES.index("flops")] == 0)
    assert torch.all(batch.u[:, schema.GLOBAL_FEATURES.index("batch_size")] == 0)
    assert torch.any(batch.x[:, schema.NODE_FEATURES.index("mac_bytes")] != 0)


def test_feature_groups_cover_every_schema_column_once():
    columns = normalise.dropped_columns(list(normalise.FEATURE_GROUPS))
    assert columns == {
        "x": tuple(range(DV)),
        "edge_attr": tuple(range(DE)),
        "u": tuple(range(DG)),
    }
    sizes = sum(len(names) for _, names in normalise.FEATURE_GROUPS.values())
    assert sizes == DV + DE + DG


def test_unknown_feature_group_is_rejected():
    with pytest.raises(ValueError, match="feature group"):
        normalise.dropped_columns(["node.colour"])


def test_a_metric_without_any_label_cannot_be_fitted():
    data = samples()
    for d in data:
        d.y_mask[0, 1] = False
    with pytest.raises(ValueError, match="no training sample has a label for b"):
        normalise.Normaliser.fit(data, ["a", "b"])


def test_round_trips_through_a_plain_dict():
    norm = normalise.Normaliser.fit(samples(), ["a", "b"], drop_x=[1])
    assert normalise.Normaliser.from_dict(norm.to_dict()) == norm


def test_a_device_outside_the_step_labelled_ones_is_held_at_their_edge():
    """Two GPUs with step labels and one carrying only memory: the device range spans the two,
    and a device beyond it reaches the heads as the nearest edge of that range."""
    metrics = ["infer.memory_bytes", "infer.step_time_s"]
    data = samples()
    for s, row in zip(data, ([1.0, 5.0], [9.0, 9.0], [3.0, 1.0]), strict=True):
        s.device_x = torch.tensor([row])
    norm = normalise.Normaliser.fit(data, metrics)
    assert norm.device_range == ((1.0, 1.0), (3.0, 5.0))
    far, inside = data[1].clone(), data[0].clone()
    far.device_x = torch.tensor([[9.0, -4.0]])
    edge = data[0].clone()
    edge.device_x = torch.tensor([[3.0, 1.0]])
    torch.testing.assert_close(norm.features(far).device_x, norm.features(edge).device_x)
    torch.testing.assert_close(
        norm.features(inside).device_x, norm.device(torch.tensor([[1.0, 5.0]]))
    )
    loaded = normalise.Normaliser.from_dict(norm.to_dict())
    assert loaded.device_range == norm.device_range
    older = {k: v for k, v in norm.to_dict().items() if k != "device_range"}
    assert normalise.Normaliser.from_dict(older).device_range is None


def test_fine_tuning_on_a_new_device_widens_the_device_range():
    metrics = ["infer.memory_bytes", "infer.step_time_s"]
    data = samples()
    for s in data:
        s.device_x = torch.tensor([[1.0, 1.0]])
    norm = normalise.Normaliser.fit(data, metrics)
    new = samples()
    for s in new:
        s.device_x = torch.tensor([[4.0, 0.5]])
    tuned = norm.for_fine_tuning(metrics, new)
    assert tuned.device_range == ((1.0, 0.5), (4.0, 1.0))
