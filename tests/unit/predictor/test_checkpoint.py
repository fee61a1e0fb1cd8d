import dataclasses

import pytest
import torch
from torch_geometric.data import Batch, Data

from kubeseer.predictor import (
    analytic_memory,
    calibration,
    checkpoint,
    normalise,
    report,
    schema,
    targets,
)

DV, DE = len(schema.NODE_FEATURES), len(schema.EDGE_FEATURES)
DG = len(schema.GLOBAL_FEATURES) + len(targets.EXTRA_GLOBAL_FEATURES)
METRICS = ("infer.memory_bytes", "infer.step_time_s")


def sample(seed):
    g = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.rand(4, DV, generator=g),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        edge_attr=torch.rand(3, DE, generator=g),
        u=torch.rand(1, DG, generator=g),
        y=torch.tensor([[1e6 * (seed + 1), 1e-3 * (seed + 1)]], dtype=torch.float64),
        y_mask=torch.tensor([[True, True]]),
    )


def make_checkpoint():
    config = checkpoint.ModelConfig("seernet_multi", DV, DE, DG, len(METRICS), hidden_channels=8)
    torch.manual_seed(0)
    model = config.build()
    return checkpoint.Checkpoint(
        model_config=config,
        state_dict=model.state_dict(),
        normaliser=normalise.Normaliser.fit([sample(i) for i in range(4)], METRICS),
        calibration=calibration.Calibration(0.95, METRICS, (0.1, 0.2), (30, 30)),
        label_device="cpu-test-cpu",
        label_device_name="Test CPU",
        label_source="measured",
        train_optimizers=("adam",),
        data_digest="ab" * 32,
        evaluations=(
            report.EvaluationTable("t", (report.Row("m", "all", 3, 1.0, 0.5, 0.9, None),)),
        ),
        train_config={"seed": 3, "split": "random"},
    )


def test_round_trip_restores_every_field_and_the_same_predictions(tmp_path):
    original = make_checkpoint()
    path = checkpoint.save(original, tmp_path / "sub" / "model.pt")
    loaded = checkpoint.load(path)
    assert loaded.normaliser == original.normaliser
    assert loaded.calibration == original.calibration
    assert loaded.evaluations == original.evaluations
    assert loaded.train_config == original.train_config
    assert loaded.target_definitions == targets.TARGET_DEFINITIONS
    batch = Batch.from_data_list([sample(7)])
    torch.testing.assert_close(loaded.model()(batch), original.model()(batch))


def test_memory_label_and_label_ranges_round_trip_with_defaults_for_older_files(tmp_path):
    import dataclasses

    allocator = dataclasses.replace(
        make_checkpoint(),
        memory_label=targets.MemoryLabel.ALLOCATOR,
        label_ranges={"infer.memory_bytes": (1e3, 5e8)},
    )
    loaded = checkpoint.load(checkpoint.save(allocator, tmp_path / "a.pt"))
    assert loaded.memory_label is targets.MemoryLabel.ALLOCATOR
    assert loaded.label_ranges == {"infer.memory_bytes": (1e3, 5e8)}
    older = make_checkpoint().to_dict()
    del older["memory_label"], older["label_ranges"]
    torch.save(older, tmp_path / "old.pt")
    loaded = checkpoint.load(tmp_path / "old.pt")
    assert loaded.memory_label is targets.MemoryLabel.DEVICE and loaded.label_ranges == {}


def test_a_checkpoint_keeps_the_prior_rules_it_learned_against(tmp_path):
    fresh = make_checkpoint()
    assert fresh.prior_rules is analytic_memory.DEFAULT_RULES is analytic_memory.Rules.EAGER
    loaded = checkpoint.load(checkpoint.save(fresh, tmp_path / "new.pt"))
    assert loaded.prior_rules is analytic_memory.Rules.EAGER
    runtime = dataclasses.replace(fresh, prior_rules=analytic_memory.Rules.RUNTIME)
    reloaded = checkpoint.load(checkpoint.save(runtime, tmp_path / "runtime.pt"))
    assert reloaded.prior_rules is analytic_memory.Rules.RUNTIME
    older = fresh.to_dict()
    del older["prior_rules"]
    torch.save(older, tmp_path / "old.pt")
    # written before the rules existed: its memory heads learned against the graph as written
    assert checkpoint.load(tmp_path / "old.pt").prior_rules is analytic_memory.Rules.WRITTEN


def test_file_is_a_plain_dict_loadable_with_weights_only(tmp_path):
    path = checkpoint.save(make_checkpoint(), tmp_path / "m.pt")
    data = torch.load(path, weights_only=True)
    assert data["format"] == checkpoint.FORMAT
    assert data["schema_version"] == schema.SCHEMA_VERSION


def test_other_feature_schema_is_a_clear_error(tmp_path):
    data = make_checkpoint().to_dict()
    data["schema_version"] = schema.SCHEMA_VERSION + 1
    torch.save(data, tmp_path / "old.pt")
    with pytest.raises(
        checkpoint.SchemaMismatchError, match=r"schema v\d+, this kubeseer extracts"
    ):
        checkpoint.load(tmp_path / "old.pt")


def test_same_version_with_other_columns_is_a_schema_mismatch(tmp_path):
    data = make_checkpoint().to_dict()
    data["node_features"] = data["node_features"][::-1]
    torch.save(data, tmp_path / "shuffled.pt")
    with pytest.raises(checkpoint.SchemaMismatchError, match="different columns"):
        checkpoint.load(tmp_path / "shuffled.pt")


def test_missing_file_and_foreign_file_are_checkpoint_errors(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        checkpoint.load(tmp_path / "absent.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        checkpoint.load(tmp_path / "junk.pt")
    torch.save({"format": "something-else"}, tmp_path / "other.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not a kubeseer-predictor"):
        checkpoint.load(tmp_path / "other.pt")


def test_weights_of_another_shape_are_a_checkpoint_error(tmp_path):
    data = make_checkpoint().to_dict()
    data["model_config"]["hidden_channels"] = 16
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(checkpoint.CheckpointError, match="do not fit"):
        checkpoint.load(tmp_path / "bad.pt").model()


def test_model_config_builds_both_kinds_and_rejects_others():
    assert checkpoint.ModelConfig("seernet", DV, DE, DG, 2, 8).build()(
        Batch.from_data_list([sample(0)])
    ).shape == (1, 2)
    with pytest.raises(checkpoint.CheckpointError, match="unknown model kind"):
        checkpoint.ModelConfig("gcn", DV, DE, DG, 2).build()
