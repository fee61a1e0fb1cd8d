"""`kubeseer dataset pull` writes the measured-dataset format that `kubeseer train --init` reads."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kubeseer import cli
from kubeseer.measure import records, storage
from kubeseer.observations import graphs, pull, record, store
from kubeseer.predictor import checkpoint, dataset, extract, targets

MIB = 1 << 20
CONTEXT = 500 * MIB


def mlp(widths: list[int]) -> bytes:
    """A real ONNX MLP (MatMul, Add, Relu per layer) with a symbolic batch dimension."""
    nodes, inits = [], []
    current = "input"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        w = numpy_helper.from_array(np.zeros((fan_in, fan_out), np.float32), f"w{i}")
        b = numpy_helper.from_array(np.zeros((fan_out,), np.float32), f"b{i}")
        inits += [w, b]
        nodes += [
            helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        current = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["batch", widths[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return model.SerializeToString()


def label(widths: list[int], batch: int, gpu_scale: float) -> int:
    """What NVML reports for the job's process: the CUDA context, then a reservation that grows
    with parameters and activations (what matters is the format)."""
    params = sum(a * b + b for a, b in itertools.pairwise(widths))
    return CONTEXT + int(gpu_scale * (300 * MIB + 16 * params + 12 * batch * sum(widths)))


@pytest.fixture
def cluster(tmp_path, make_observation):
    """A store of observations from two GPUs, and the ONNX files of a few of the jobs."""
    s = store.open_store(str(tmp_path / "store"))
    models = tmp_path / "models"
    models.mkdir()
    rng = np.random.default_rng(0)
    n = 0
    for k in range(32):
        widths = [int(x) for x in rng.integers(16, 512, size=int(rng.integers(2, 6)))]
        data = mlp(widths)
        digest = hashlib.sha256(data).hexdigest()
        from_file = k % 8 == 0  # these jobs' PerfGraphs were not stored: the ONNX file is
        if from_file:
            (models / f"model-{k}.onnx").write_bytes(data)
        for batch in (8, 64):
            ref = None
            if not from_file:
                ref = store.Store.graph_name(digest, "{}", batch)
                s.put_graph(ref, graphs.to_bytes(extract.from_onnx(data, batch_size=batch)))
            for product, name, scale in (
                ("A100-80GB", "NVIDIA A100-SXM4-80GB", 1.0),
                ("H100-80GB", "NVIDIA H100 80GB HBM3", 1.1),
            ):
                n += 1
                memory = label(widths, batch, scale)
                o = make_observation(
                    f"uid-{n}",
                    family=("mlp", "wide")[k % 2],
                    gpu_product=product,
                    predicted=memory * 0.9,
                    observed=memory,
                    gpu_model_name=name,
                    mig_profile=None,
                    model_digest=digest,
                    perfgraph_ref=ref,
                    batch_size=batch,
                )
                s.put(o)
    # What never becomes a row: a stand-in's observation, a failure, and a job without a graph.
    s.put(make_observation("uid-standin", model_digest=digest, observed_source="nvml-standin"))
    s.put(make_observation("uid-failed", model_digest=digest, outcome=record.Outcome.FAILED))
    s.put(make_observation("uid-nograph", model_digest="cd" * 32, mig_profile=None))
    # A configuration that only ran out of memory is a censored row.
    s.put(
        make_observation(
            "uid-oom",
            model_digest=digest,
            perfgraph_ref=None,
            observed=None,
            outcome=record.Outcome.OOM,
            limit=9856 * MIB,
            mig_profile="1g.10gb",
            batch_size=4096,
        )
    )
    (models / "last.onnx").write_bytes(data)
    return s, models


@pytest.mark.slow
def test_pulled_observations_fine_tune_a_checkpoint(tmp_path, cluster, monkeypatch, capsys):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    source, models = cluster
    out = tmp_path / "pulled"
    result = pull.pull(source, out, models=models)
    a100, h100 = "cuda-nvidia-a100-sxm4-80gb", "cuda-nvidia-h100-80gb-hbm3"
    assert result.rows == {a100: 64, h100: 64, "cuda-nvidia-a100-sxm4-80gb-1g-10gb": 1}
    assert result.graphs == 65  # one per (model, batch), shared by both GPUs
    reasons = "\n".join(result.skipped)
    assert "stand-in" in reasons and "failed" in reasons and "cd" * 32 in reasons
    rows = storage.read_records(out / a100)
    assert all(r.label_source is records.LabelSource.MEASURED for r in rows)
    assert {r.status for r in rows} == {records.Status.OK}
    (censored,) = storage.read_records(out / "cuda-nvidia-a100-sxm4-80gb-1g-10gb")
    assert censored.censored and censored.memory_bytes == 9856 * MIB

    common = ["--epochs", "2", "--hidden", "16", "--coverage", "0.8", "--threads", "1"]
    base, tuned = tmp_path / "a100.pt", tmp_path / "h100.pt"
    data = ["--data", str(out)]
    assert cli.main(["train", *data, "--device", a100, "--out", str(base), *common]) == 0
    assert (
        cli.main(
            ["train", *data, "--device", h100, "--out", str(tuned), "--init", str(base), *common]
        )
        == 0
    )
    made = checkpoint.load(tuned)
    assert made.label_device_name == "NVIDIA H100 80GB HBM3"
    assert made.train_config["init"]["label_device_name"] == "NVIDIA A100-SXM4-80GB"
    assert "train.memory_bytes" in made.metrics
    # The shipped checkpoint's memory label leaves the context out; a fine-tune on memory alone
    # trains the memory heads only (--tune auto) and keeps the heads the observations do not
    # label.
    reserved, kept = tmp_path / "reserved.pt", tmp_path / "kept.pt"
    learned = [*data, "--device", a100, "--out", str(reserved), "--memory-label", "reserved"]
    assert cli.main(["train", *learned, *common]) == 0
    tuned_memory = ["--init", str(reserved), "--metrics", "train.memory_bytes"]
    assert (
        cli.main(["train", *data, "--device", h100, "--out", str(kept), *tuned_memory, *common])
        == 0
    )
    assert checkpoint.load(kept).metrics == checkpoint.load(reserved).metrics
    assert checkpoint.load(kept).runtime_context_bytes == CONTEXT
    assert checkpoint.load(kept).train_config["heads_only"] is True
    assert cli.main(["train", *learned, "--tune", "heads", *common]) == 2
    # Replaying rows the base learned from: they join the split, and the sources say so.
    replayed = tmp_path / "replayed.pt"
    replay = ["--replay", str(out), "--replay-device", a100]
    argv = [*data, "--device", h100, "--out", str(replayed), *tuned_memory, *replay, *common]
    assert cli.main(["train", *argv]) == 0
    made = checkpoint.load(replayed)
    assert any("replayed: NVIDIA A100" in line for line in made.sources)
    counts = made.train_config["samples"]
    assert sum(counts.values()) == 2 * sum(checkpoint.load(kept).train_config["samples"].values())
    assert cli.main(["train", *learned, *replay, *common]) == 2


@pytest.mark.slow
def test_the_shipped_checkpoint_learns_from_every_device_a_cluster_observed(
    tmp_path, cluster, monkeypatch, capsys
):
    """The chart's retraining job names no device: a cluster's GPUs and MIG slices are one
    sample set for a device-aware checkpoint, and a job that ran out of memory on a slice
    (a dataset of its own) is learned as a lower bound."""
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    source, models = cluster
    out = tmp_path / "pulled"
    assert len(pull.pull(source, out, models=models).rows) == 3
    tuned = tmp_path / "tuned.pt"
    argv = ["--data", str(out), "--init", "default", "--out", str(tuned), "--epochs", "1"]
    assert cli.main(["train", *argv, "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "1 out of memory, 1 of them learned as lower bounds" in printed
    made = checkpoint.load(tuned)
    assert made.label_device == ",".join(sorted(pull.pull(source, out, models=models).rows))
    assert made.label_device_name == "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3"
    assert made.sources[-2:] == (
        "fine-tuned on NVIDIA A100-SXM4-80GB (measured): 64 records",
        "fine-tuned on NVIDIA H100 80GB HBM3 (measured): 64 records",
    )
    assert made.train_config["heads_only"] is True
    # Its own devices are what `eval` scores by default.
    assert cli.main(["eval", "--ckpt", str(tuned), "--data", str(out), "--all"]) in (0, 1)
    assert "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3 (measured)" in capsys.readouterr().out


def test_pulled_rows_carry_the_runtime_context_so_a_reserved_label_can_be_learned(
    tmp_path, cluster, monkeypatch
):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    source, models = cluster
    a100 = "cuda-nvidia-a100-sxm4-80gb"
    pull.pull(source, tmp_path / "documented", models=models)
    rows = storage.read_records(tmp_path / "documented" / a100)
    assert {r.context_bytes for r in rows} == {pull.documented_context_bytes()} == {CONTEXT}
    pull.pull(source, tmp_path / "older", models=models, context_bytes=1200 * MIB)
    assert {r.context_bytes for r in storage.read_records(tmp_path / "older" / a100)} == {
        1200 * MIB
    }
    samples, info = dataset.build_samples(
        rows, memory_label=targets.MemoryLabel.RESERVED, learnable=("train.memory_bytes",)
    )
    assert info.metrics == ("train.memory_bytes",)
    assert info.left_out == ("train.sm_util_percent",)
    assert info.context_bytes == CONTEXT
    assert sorted(float(s.y[0, 0]) for s in samples) == pytest.approx(
        sorted(float(r.memory_bytes - CONTEXT) for r in rows)
    )
    with pytest.raises(dataset.DatasetError, match=r"no labels of infer\.memory_bytes"):
        dataset.build_samples(
            rows, memory_label=targets.MemoryLabel.RESERVED, learnable=("infer.memory_bytes",)
        )


def test_the_command_reports_what_it_wrote(tmp_path, cluster, monkeypatch, capsys):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    source, models = cluster
    code = cli.main(
        [
            "dataset",
            "pull",
            "--store",
            str(source),
            "--out",
            str(tmp_path / "o"),
            "--models",
            str(models),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "cuda-nvidia-h100-80gb-hbm3: 64 rows" in printed
    assert "skipped:" in printed
    refused = ["dataset", "pull", "--store", str(source), "--out", str(tmp_path / "n")]
    assert cli.main([*refused, "--context-mib", "-1"]) == 2


def test_a_stored_graph_round_trips():
    data = mlp([32, 64, 10])
    graph = extract.from_onnx(data, batch_size=8)
    back = graphs.from_bytes(graphs.to_bytes(graph))
    assert back.op_types == graph.op_types and back.flops == graph.flops
    assert back.scopes == graph.scopes and len(back.scopes) == graph.num_nodes
    assert np.array_equal(back.node_features, graph.node_features)
    with pytest.raises(graphs.GraphFileError):
        graphs.from_bytes(b"not an archive")


def test_an_empty_store_pulls_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert (
        cli.main(
            ["dataset", "pull", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]
        )
        == 1
    )
    assert dataclasses.asdict(
        pull.pull(store.open_store(str(tmp_path / "empty")), tmp_path / "o")
    ) == {
        "rows": {},
        "graphs": 0,
        "skipped": [],
    }
