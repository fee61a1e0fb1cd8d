import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch_geometric.data import Batch, Data

from kubeseer.predictor import inference, normalise, seernet, train

METRICS = ("train.memory_bytes", "infer.step_time_s")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny graphs train far faster on one thread, above all on a shared, loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def synthetic(n, seed, missing_every=0):
    """Graphs whose labels are exact functions of their features, so a model can learn them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        nodes = int(torch.randint(3, 8, (1,), generator=g))
        x = torch.rand(nodes, 4, generator=g)
        u = torch.rand(1, 3, generator=g)
        memory = 1e6 * math.exp(0.5 * float(x[:, 0].sum()))
        step = 1e-2 * math.exp(2 * float(u[0, 0]))
        present = [True, not (missing_every and i % missing_every == 0)]
        out.append(
            Data(
                x=x,
                edge_index=torch.stack([torch.arange(nodes - 1), torch.arange(1, nodes)]),
                edge_attr=torch.rand(nodes - 1, 2, generator=g),
                u=u,
                y=torch.tensor([[memory, step if present[1] else 0.0]], dtype=torch.float64),
                y_mask=torch.tensor([present]),
                family="synthetic",
                config_hash=f"c{seed}x{i}",
            )
        )
    return out


def model():
    torch.manual_seed(0)
    return seernet.SeerNetMulti(4, 2, 3, num_tasks=2, hidden_channels=32)


@pytest.mark.slow
def test_fit_learns_a_learnable_target():
    data_train, data_val = synthetic(96, 0), synthetic(32, 1)
    config = train.TrainConfig(batch_size=32, max_epochs=40, seed=0)
    result = train.fit(model(), data_train, data_val, config, metrics=METRICS)
    assert result.history[0].val_mape > 2 * result.best_val_mape
    assert result.best_val_mape < 25.0
    assert result.predict(data_val).shape == (32, 2)


def test_one_graph_predicts_what_it_predicts_in_a_batch():
    graphs = synthetic(5, 3)
    norm = normalise.Normaliser.fit(graphs, METRICS)
    net = model().eval()
    together = inference.predict(net, norm, graphs)
    alone = np.concatenate([inference.predict(net, norm, [g]) for g in graphs])
    np.testing.assert_allclose(alone, together, rtol=1e-5)


def test_best_epoch_weights_are_restored():
    data_train, data_val = synthetic(64, 0), synthetic(16, 1)
    result = train.fit(
        model(),
        data_train,
        data_val,
        train.TrainConfig(batch_size=32, max_epochs=8),
        metrics=METRICS,
    )
    predicted = result.predict(data_val)
    true = torch.cat([s.y for s in data_val]).numpy()
    mape = 100 * (abs(predicted - true) / true).mean(axis=0).mean()
    assert mape == pytest.approx(result.best_val_mape, rel=1e-5)


def test_missing_labels_never_reach_the_loss():
    data_train, data_val = synthetic(64, 0, missing_every=2), synthetic(16, 1)
    garbage = synthetic(64, 0, missing_every=2)
    for s in garbage:
        if not s.y_mask[0, 1]:
            s.y[0, 1] = 1e30
    config = train.TrainConfig(batch_size=32, max_epochs=3)
    a = train.fit(model(), data_train, data_val, config, metrics=METRICS)
    b = train.fit(model(), garbage, data_val, config, metrics=METRICS)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_masked_task_losses_skip_tasks_without_labels():
    prediction = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    target = torch.zeros(2, 2)
    mask = torch.tensor([[True, False], [False, False]])
    losses = train.masked_task_losses(prediction, target, mask)
    assert len(losses) == 1
    assert float(losses[0]) == 1.0


def test_a_bound_costs_only_the_distance_by_which_the_prediction_crosses_it():
    prediction = torch.tensor([[1.0], [3.0], [1.0], [3.0], [1.0]])
    target = torch.full((5, 1), 2.0)
    mask = torch.ones(5, 1, dtype=torch.bool)
    # above 2 (ran out of memory there), at most 2 (ran), at most 2, above 2, exact
    censor = torch.tensor([[1], [-1], [-1], [1], [0]], dtype=torch.int8)
    (loss,) = train.masked_task_losses(prediction, target, mask, censor)
    # 1 below the first lower bound, 1 above the first upper bound, 1 off the exact label;
    # the other two are on their bound's side
    assert float(loss) == pytest.approx((1.0 + 1.0 + 0.0 + 0.0 + 1.0) / 5)
    (exact,) = train.masked_task_losses(prediction, target, mask)
    assert float(exact) == pytest.approx(1.0)


def test_censored_samples_pull_predictions_to_their_side_and_are_never_fitted_on():
    # the labels say one thing, the evidence another: every training graph ran out of memory
    # at 100x its label, and the held-out graphs really do need 100x theirs
    data_train, data_val = synthetic(64, 0), synthetic(16, 1)
    bounds = synthetic(64, 0)
    for s in [*bounds, *data_val]:
        s.y = s.y.clone()
        s.y[0, 0] *= 100
    for s in bounds:
        s.y_mask = torch.tensor([[True, False]])
        s.y_censor = torch.tensor([[1, 0]], dtype=torch.int8)
    config = train.TrainConfig(batch_size=32, max_epochs=6, seed=0)
    plain = train.fit(model(), data_train, data_val, config, metrics=METRICS)
    pushed = train.fit(model(), data_train, data_val, config, metrics=METRICS, censored=bounds)
    assert pushed.normaliser.target_mean == plain.normaliser.target_mean
    assert (pushed.predict(data_val)[:, 0] > plain.predict(data_val)[:, 0]).mean() > 0.9
    assert not hasattr(data_train[0], "y_censor")


def test_without_pcgrad_training_also_runs_and_differs():
    data_train, data_val = synthetic(64, 0), synthetic(16, 1)
    base = train.TrainConfig(batch_size=32, max_epochs=2)
    with_pc = train.fit(model(), data_train, data_val, base, metrics=METRICS)
    without = train.fit(
        model(),
        data_train,
        data_val,
        train.TrainConfig(batch_size=32, max_epochs=2, pcgrad=False),
        metrics=METRICS,
    )
    assert with_pc.history[-1].train_loss != without.history[-1].train_loss


class GlobalsOnly(nn.Module):
    """A baseline-shaped model: any module with forward(batch) -> (B, T) trains."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.net(batch.u)


def test_fit_trains_any_module_with_the_batch_interface():
    data_train, data_val = synthetic(64, 0), synthetic(16, 1)
    result = train.fit(
        GlobalsOnly(),
        data_train,
        data_val,
        train.TrainConfig(batch_size=32, max_epochs=5),
        metrics=METRICS,
    )
    assert len(result.history) == 5


def test_time_limit_stops_after_the_first_epoch():
    data_train, data_val = synthetic(32, 0), synthetic(8, 1)
    config = train.TrainConfig(batch_size=32, max_epochs=50, time_limit_s=0.0)
    assert len(train.fit(model(), data_train, data_val, config, metrics=METRICS).history) == 1


def test_patience_stops_training_when_validation_stalls():
    data_train, data_val = synthetic(32, 0), synthetic(8, 1)
    config = train.TrainConfig(batch_size=32, max_epochs=200, patience=2, lr=1e-9, min_lr=1e-9)
    result = train.fit(GlobalsOnly(), data_train, data_val, config, metrics=METRICS)
    assert len(result.history) < 200


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        train.TrainConfig(lr=0)
    with pytest.raises(ValueError):
        train.TrainConfig(batch_size=0)


def _record(config, family, batch, mode, memory, step, *, derived=False):
    """A CPU record, or with `derived` a fake-CUDA row that has only an allocator peak."""
    from kubeseer.measure import records

    unset = {f.name: None for f in dataclasses.fields(records.Record)}
    device = records.DeviceDescriptor(
        records.DeviceKind.CPU, "Test CPU", 1 << 34, None, 2, None, None, None, "2.13.0"
    )
    if derived:
        device = records.DeviceDescriptor(
            records.DeviceKind.CUDA,
            "NVIDIA H100 80GB HBM3",
            80 << 30,
            132,
            None,
            None,
            None,
            None,
            "2.13.0",
        )
    source = records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR if derived else None
    return records.Record(
        **{
            **unset,
            "schema_version": records.SCHEMA_VERSION,
            "config_hash": config,
            "family": family,
            "spec_json": "{}",
            "batch_size": batch,
            "mode": mode,
            "precision": "fp32",
            "optimizer": "adam" if mode == "train" else "none",
            "device": device,
            "label_source": source or records.LabelSource.MEASURED,
            "status": records.Status.OK,
            "plan": "test",
            "warmup_iterations": 1,
            "timed_iterations": 3,
            "step_time_median_s": None if derived else step,
            "step_cpu_time_median_s": None if derived else step,
            "memory_bytes": None if derived else int(memory),
            "allocator_peak_allocated_bytes": int(memory / 2),
            "started_at": "2026-11-22T00:00:00Z",
            "finished_at": "2026-11-22T00:00:01Z",
        }
    )


@pytest.mark.slow
def test_train_then_eval_commands_round_trip(tmp_path, monkeypatch, capsys):
    """`kubeseer train` and `kubeseer eval` on a Parquet dataset whose graphs are pre-cached."""
    import argparse
    import json

    from kubeseer.measure import storage
    from kubeseer.predictor import analytic_memory as am
    from kubeseer.predictor import checkpoint, commands, dataset, schema

    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    cache = dataset.GraphCache()
    g = torch.Generator().manual_seed(0)
    rows, derived = [], []
    for c in range(48):
        config, family = f"c{c}", ("resnet", "vit")[c % 2]
        for batch in (1, 8):
            nodes = 3 + c % 5
            x = torch.rand(nodes, len(schema.NODE_FEATURES), generator=g)
            cache.put(
                config,
                batch,
                Data(
                    x=x,
                    edge_index=torch.stack([torch.arange(nodes - 1), torch.arange(1, nodes)]),
                    edge_attr=torch.rand(nodes - 1, len(schema.EDGE_FEATURES), generator=g),
                    u=torch.full((1, len(schema.GLOBAL_FEATURES)), float(batch)),
                ),
            )
            scale = math.exp(float(x[:, 0].sum())) * batch
            cache.put_memory(
                config, batch, am.MemoryGraph((am.OpNode("MatMul", int(1e4 * scale), 64),), ())
            )
            rows.append(_record(config, family, batch, "infer", 1e6 * scale, 1e-3 * scale))
            rows.append(_record(config, family, batch, "train", 3e6 * scale, 3e-3 * scale))
            derived.append(_record(config, family, batch, "infer", 1e6 * scale, 0, derived=True))
    storage.write_part(tmp_path / "data", rows)
    storage.write_part(tmp_path / "derived", derived)

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.handler(args)

    ckpt = tmp_path / "model.pt"
    assert (
        run(
            "train",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(ckpt),
            "--epochs",
            "3",
            "--hidden",
            "16",
            "--coverage",
            "0.8",
            "--threads",
            "1",
        )
        == 0
    )
    saved = checkpoint.load(ckpt)
    assert saved.metrics == (
        "train.memory_bytes",
        "train.step_time_s",
        "infer.memory_bytes",
        "infer.step_time_s",
    )
    assert saved.label_device_name == "Test CPU"
    assert saved.train_config["epochs_run"] == 3
    assert set(saved.label_ranges) == set(saved.metrics)
    assert all(0 < low < high for low, high in saved.label_ranges.values())
    capsys.readouterr()
    code = run("eval", "--ckpt", str(ckpt), "--data", str(tmp_path / "data"), "--json")
    table = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert {r["family"] for r in table["rows"]} >= {"all"}
    stored = saved.evaluations[0]
    assert table["rows"][0]["mape"] == pytest.approx(stored.rows[0].mape)

    # The allocator-peak variant, scored across devices on derived rows that label only it.
    allocator_ckpt = tmp_path / "allocator.pt"
    common = ("--epochs", "2", "--hidden", "16", "--coverage", "0.8", "--threads", "1")
    data = ("--data", str(tmp_path / "data"))
    assert (
        run("train", *data, "--out", str(allocator_ckpt), "--memory-label", "allocator", *common)
        == 0
    )
    allocator = checkpoint.load(allocator_ckpt)
    assert allocator.memory_label.value == "allocator"
    assert "live tensors" in allocator.target_definitions["memory_bytes"]
    assert allocator.data_digest != saved.data_digest
    capsys.readouterr()
    code = run(
        "eval",
        "--ckpt",
        str(allocator_ckpt),
        "--data",
        str(tmp_path / "derived"),
        "--device",
        "cuda-nvidia-h100-80gb-hbm3",
        "--all",
        "--json",
    )
    cross = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert {r["metric"] for r in cross["rows"]} == {"infer.memory_bytes"}

    # Memory learned as a correction to the analytic estimate, and scored the same way.
    prior_ckpt = tmp_path / "prior.pt"
    assert run("train", *data, "--out", str(prior_ckpt), "--memory-prior", *common) == 0
    assert checkpoint.load(prior_ckpt).normaliser.prior_metrics == (
        "train.memory_bytes",
        "infer.memory_bytes",
    )
    capsys.readouterr()
    assert run("eval", "--ckpt", str(prior_ckpt), *data, "--json") in (0, 1)
    assert json.loads(capsys.readouterr().out)["rows"]

    # Step time learned as a correction to the operator-class cost model as well.
    priors_ckpt = tmp_path / "priors.pt"
    argv = ("--out", str(priors_ckpt), "--memory-prior", "--step-prior")
    assert run("train", *data, *argv, *common) == 0
    normaliser = checkpoint.load(priors_ckpt).normaliser
    assert normaliser.prior_metrics == saved.metrics
    assert normaliser.step_costs is not None
    assert set(normaliser.step_costs.seconds_per_unit) == {"train", "infer"}
    capsys.readouterr()
    assert run("eval", "--ckpt", str(priors_ckpt), *data, "--json") in (0, 1)
    assert json.loads(capsys.readouterr().out)["rows"]
    assert next(r for r in cross["rows"] if r["family"] == "all")["n"] == 96

    # A fine-tune of a CPU allocator-peak checkpoint on the derived H100 rows, which label only
    # inference memory: by default it trains that head alone and keeps the others; fine-tuned
    # whole, it keeps the base's priors without being told and drops the heads the new device
    # has no labels for.
    base_ckpt, tuned_ckpt = tmp_path / "base.pt", tmp_path / "tuned.pt"
    allocator_priors = ("--memory-label", "allocator", "--memory-prior", "--step-prior")
    assert run("train", *data, "--out", str(base_ckpt), *allocator_priors, *common) == 0
    derived_data = ("--data", str(tmp_path / "derived"))
    heads = tmp_path / "heads.pt"
    assert run("train", *derived_data, "--out", str(heads), "--init", str(base_ckpt), *common) == 0
    assert checkpoint.load(heads).metrics == checkpoint.load(base_ckpt).metrics
    whole = ("--out", str(tuned_ckpt), "--init", str(base_ckpt), "--tune", "network")
    assert run("train", *derived_data, *whole, *common) == 0
    tuned = checkpoint.load(tuned_ckpt)
    assert tuned.metrics == ("infer.memory_bytes",)
    assert tuned.model_config.num_tasks == 1
    assert tuned.normaliser.prior_metrics == ("infer.memory_bytes",)
    assert tuned.label_device_name == "NVIDIA H100 80GB HBM3"
    assert tuned.train_config["memory_prior"] is True
    assert tuned.train_config["step_prior"] is False, "no step metric was fine-tuned"
    assert tuned.train_config["init"]["label_device_name"] == "Test CPU"
    assert tuned.train_config["init"]["metrics"] == list(saved.metrics)
    capsys.readouterr()
    assert run("eval", "--ckpt", str(tuned_ckpt), *derived_data, "--json") in (0, 1)
    assert {r["metric"] for r in json.loads(capsys.readouterr().out)["rows"]} == {
        "infer.memory_bytes"
    }

    # What a fine-tune cannot mean is refused with the reason, before any training.
    refused = tmp_path / "refused.pt"
    capsys.readouterr()
    argv = ("--out", str(refused), "--init", str(base_ckpt), "--memory-label", "device")
    assert run("train", *derived_data, *argv, *common) == 2
    assert "learned allocator memory, not device" in capsys.readouterr().err
    argv = ("--out", str(refused), "--init", str(tuned_ckpt), "--metrics", "train.step_time_s")
    assert run("train", *data, *argv, *common) == 2
    assert "fine-tuning needs metrics among infer.memory_bytes" in capsys.readouterr().err
    assert not refused.exists()


def test_a_metric_labelled_on_few_configurations_still_gets_a_calibrated_bound():
    """Step time labelled on 40 configurations of 160 (a GPU benchmark that trains on one GPU
    of four): the random split leaves it about 5 calibration configurations, fewer than the 19
    a 95 % bound needs. Configurations move from training to calibration instead of the
    checkpoint failing or the bound being dropped."""
    from kubeseer.predictor import conformal, dataset, targets

    data = synthetic(160, 7)
    for i, sample in enumerate(data):
        if i % 4:
            sample.y_mask = torch.tensor([[True, False]])
            sample.y = torch.tensor([[float(sample.y[0, 0]), 0.0]], dtype=torch.float64)
    info = dataset.DatasetInfo(
        device_kind="cpu",
        device="test-cpu",
        device_name="Test CPU",
        label_source="measured",
        optimizers=("adam",),
        metrics=METRICS,
        records=len(data),
        censored=0,
        samples=len(data),
        digest="test",
        memory_label=targets.MemoryLabel.DEVICE,
    )
    made = train.train_checkpoint(
        data,
        info,
        train.TrainConfig(batch_size=64, max_epochs=1, seed=0),
        train.Options(hidden_channels=16),
    )
    needed = conformal.minimum_calibration(conformal.DEFAULT_COVERAGE)
    assert needed == 19
    assert min(made.calibration.samples) >= needed
    assert made.calibration.margin("infer.step_time_s") >= 1.0
    assert made.train_config["calibration_moved"]["infer.step_time_s"] > 0
    assert made.train_config["samples"]["calibration"] > 160 // 8


def test_bounds_of_configurations_held_out_for_validation_calibration_or_test_are_not_trained_on():
    from kubeseer.predictor import dataset, splits, targets

    data = synthetic(80, 3)
    info = dataset.DatasetInfo(
        device_kind="cpu",
        device="test-cpu",
        device_name="Test CPU",
        label_source="measured",
        optimizers=("adam",),
        metrics=METRICS,
        records=len(data),
        censored=0,
        samples=len(data),
        digest="test",
        memory_label=targets.MemoryLabel.DEVICE,
    )
    split = splits.random_split(data, 0)

    def bound_of(sample: Data) -> Data:
        bound = sample.clone()
        bound.y_mask = torch.tensor([[True, False]])
        bound.y_censor = torch.tensor([[1, 0]], dtype=torch.int8)
        return bound

    held = [*split.val, *split.calibration, *split.test]
    # one bound per configuration of every part, and one of a configuration no part holds
    # (a job that only ever ran out of memory)
    only_failed = bound_of(data[0])
    only_failed.config_hash = "never-ran"
    censored = [bound_of(s) for s in (*split.train, *held)] + [only_failed]
    made = train.train_checkpoint(
        data,
        info,
        train.TrainConfig(batch_size=64, max_epochs=1, seed=0),
        train.Options(hidden_channels=16),
        split=split,
        censored=censored,
    )
    # the training part (after calibration took what it needed), one bound a configuration
    samples = made.train_config["samples"]
    assert samples["censored"] == samples["train"] + 1 < len(censored)
