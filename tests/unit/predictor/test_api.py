import hashlib

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch_geometric.data import Data

from kubeseer import prediction, units
from kubeseer.predictor import (
    api,
    calibration,
    checkpoint,
    errors,
    extract,
    figures,
    normalise,
    prior,
    schema,
    targets,
)

DV, DE = len(schema.NODE_FEATURES), len(schema.EDGE_FEATURES)
DG = len(schema.GLOBAL_FEATURES) + len(targets.EXTRA_GLOBAL_FEATURES)


def tiny_onnx(hidden=32):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    weights = [
        numpy_helper.from_array(np.zeros((16, hidden), np.float32), "w1"),
        numpy_helper.from_array(np.zeros((hidden, 4), np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def make_predictor(
    metrics=targets.METRICS,
    device="cpu-test",
    name="Test CPU",
    memory_label=targets.MemoryLabel.DEVICE,
    label_ranges=None,
):
    g = torch.Generator().manual_seed(0)
    samples = [
        Data(
            x=torch.rand(3, DV, generator=g),
            edge_index=torch.tensor([[0, 1], [1, 2]]),
            edge_attr=torch.rand(2, DE, generator=g),
            u=torch.rand(1, DG, generator=g),
            # Labels of a few MB, so that the learned memory sits above the toy models' state.
            y=(torch.rand(1, len(metrics), generator=g, dtype=torch.float64) * 100 + 1) * 1e6,
            y_mask=torch.ones(1, len(metrics), dtype=torch.bool),
        )
        for _ in range(4)
    ]
    config = checkpoint.ModelConfig("seernet_multi", DV, DE, DG, len(metrics), hidden_channels=8)
    torch.manual_seed(0)
    ckpt = checkpoint.Checkpoint(
        model_config=config,
        state_dict=config.build().state_dict(),
        normaliser=normalise.Normaliser.fit(samples, metrics),
        calibration=calibration.Calibration(
            0.95, tuple(metrics), (0.1,) * len(metrics), (40,) * len(metrics)
        ),
        label_device=device,
        label_device_name=name,
        label_source="measured",
        train_optimizers=("adam",),
        data_digest="cd" * 32,
        memory_label=memory_label,
        label_ranges=label_ranges or {},
    )
    return api.Predictor(ckpt)


def test_prediction_has_points_bounds_and_provenance():
    model = tiny_onnx()
    made = make_predictor().predict(model, 8, "infer", "fp32")
    assert made.mode is prediction.Mode.INFER and made.batch_size == 8
    assert made.memory_bytes.upper == pytest.approx(made.memory_bytes.point * np.exp(0.1))
    assert made.step_time_s.upper >= made.step_time_s.point > 0
    assert made.coverage == 0.95
    assert made.model_digest == hashlib.sha256(model).hexdigest()
    assert made.label_device == "Test CPU"
    assert any("not a GPU" in w for w in made.warnings)


def test_path_bytes_and_perfgraph_give_the_same_prediction(tmp_path):
    model = tiny_onnx()
    (tmp_path / "m.onnx").write_bytes(model)
    predictor = make_predictor()
    from_bytes = make_predictor().predict(model, 4, "train")
    from_path = predictor.predict(tmp_path / "m.onnx", 4, "train")
    from_graph = make_predictor().predict(extract.from_onnx(model, batch_size=4), 4, "train")
    assert from_bytes == from_path == from_graph


def test_repeated_questions_are_answered_from_the_cache(monkeypatch):
    predictor = make_predictor()
    model = tiny_onnx()
    first = predictor.predict(model, 4, "train")
    monkeypatch.setattr(extract, "from_onnx", lambda *a, **k: pytest.fail("extracted twice"))
    assert predictor.predict(model, 4, "train") is first


def test_cache_key_separates_batch_mode_precision_and_optimizer():
    predictor = make_predictor()
    model = tiny_onnx()
    answers = {
        predictor.predict(model, 4, "train").memory_bytes.point,
        predictor.predict(model, 8, "train").memory_bytes.point,
        predictor.predict(model, 4, "train", "fp16").memory_bytes.point,
        predictor.predict(model, 4, "train", optimizer="sgd").memory_bytes.point,
    }
    assert len(answers) == 4
    assert len(predictor.cache) == 4


def sequence_onnx(width=256):
    """A ``[batch, seq, 256]`` model: what it costs depends on the bound sequence length."""
    tokens = helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", width])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", width])
    weights = [
        numpy_helper.from_array(np.zeros((width, width), np.float32), "w1"),
        numpy_helper.from_array(np.zeros((width, width), np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["tokens", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "sequence", [tokens], [out], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_longer_sequence_is_not_answered_with_a_shorter_ones_prediction():
    """Regression: the cache key left out `inputs`, so seq=65536 after seq=16 came back with
    the seq-16 figures (597 MiB and 0.15 ms, where a fresh predictor says 2,132 MiB, 1.04 s).

    On the CPU checkpoint, whose step time scales with the step's work down to the smallest
    job; the GPU default's does not below its fitted fixed cost per step (docs/accuracy.md)."""
    model = sequence_onnx()
    predictor = api.Predictor.load("cpu")
    short = predictor.predict(model, 8, "train", inputs={"seq": 16})
    long = predictor.predict(model, 8, "train", inputs={"seq": 65536})
    assert long == api.Predictor.load("cpu").predict(model, 8, "train", inputs={"seq": 65536})
    assert long.memory_bytes.point > 2 * short.memory_bytes.point
    assert long.step_time_s.point > 100 * short.step_time_s.point


@pytest.mark.parametrize(
    ("inputs", "cause", "message"),
    [
        (None, errors.SymbolicDimensionError, "'seq'"),
        ({"sequence": 16}, errors.BindingError, "sequence"),
    ],
)
def test_a_request_that_does_not_bind_fails_even_after_one_that_did(inputs, cause, message):
    """Regression: a DLJob without `inputs`, or naming a dimension the model lacks, was served
    the figures of an earlier job that bound `seq`."""
    model = sequence_onnx()
    predictor = make_predictor()
    predictor.predict(model, 8, "train", inputs={"seq": 16})
    with pytest.raises(cause, match=message):
        predictor.predict(model, 8, "train", inputs=inputs)


def test_concurrent_requests_share_one_bounded_cache_and_get_their_own_answers():
    """The operator's worker threads share one predictor: with more keys than the cache holds,
    every thread still gets the answer a lone predictor gives for its own request."""
    import concurrent.futures

    model = sequence_onnx(32)
    lengths = [1 << k for k in range(12)]
    alone = make_predictor()
    expected = {n: alone.predict(model, 2, "infer", inputs={"seq": n}) for n in lengths}
    shared = api.Predictor(make_predictor().checkpoint, cache_size=3)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        asked = [n for _ in range(4) for n in lengths]
        answers = list(
            pool.map(lambda n: shared.predict(model, 2, "infer", inputs={"seq": n}), asked)
        )
    for n, answer in zip(asked, answers, strict=True):
        assert answer == expected[n]
    assert len(shared.cache) <= 3


def test_predict_many_matches_one_by_one():
    model_a, model_b = tiny_onnx(32), tiny_onnx(64)
    requests = [api.Request(model_a, 2, "infer"), api.Request(model_b, 16, "train", "bf16")]
    many = make_predictor().predict_many(requests)
    single = make_predictor()
    one_by_one = [single.predict(model_a, 2, "infer"), single.predict(model_b, 16, "train", "bf16")]
    for a, b in zip(many, one_by_one, strict=True):
        # Batched and single forward passes differ only in float summation order.
        assert a.memory_bytes.point == pytest.approx(b.memory_bytes.point, rel=1e-5)
        assert a.step_time_s.upper == pytest.approx(b.step_time_s.upper, rel=1e-5)
        assert (a.mode, a.batch_size, a.warnings) == (b.mode, b.batch_size, b.warnings)


def test_warns_when_the_requested_gpu_is_not_the_label_device():
    predictor = make_predictor(device="cuda-nvidia-a100-sxm4-80gb", name="NVIDIA A100-SXM4-80GB")
    same = predictor.predict(tiny_onnx(), 4, "infer", gpu="a100-80gb")
    other = predictor.predict(tiny_onnx(), 4, "infer", gpu="H100-80GB-SXM")
    assert not any("requested GPU" in w for w in same.warnings)
    assert any("requested GPU H100-80GB-SXM" in w for w in other.warnings)


def test_unlearned_utilisation_is_a_stated_conservative_default():
    metrics = ("infer.memory_bytes", "infer.step_time_s")
    made = make_predictor(metrics).predict(tiny_onnx(), 4, "infer")
    assert made.sm_util_percent == prediction.Estimate(100.0, 100.0)
    assert any("not a prediction" in w for w in made.warnings)


def test_a_mode_the_checkpoint_never_learned_is_an_error():
    predictor = make_predictor(("infer.memory_bytes", "infer.step_time_s"))
    with pytest.raises(errors.PredictionError, match=r"does not predict train\.memory_bytes"):
        predictor.predict(tiny_onnx(), 4, "train")


def test_unlearned_optimizer_is_flagged():
    made = make_predictor().predict(tiny_onnx(), 4, "train", optimizer="sgd")
    assert any("sgd optimizer" in w for w in made.warnings)


@pytest.mark.parametrize(
    ("model", "batch", "message"),
    [(b"not onnx", 4, "not an ONNX model"), (None, 0, "at least 1")],
)
def test_bad_requests_are_prediction_errors(model, batch, message):
    with pytest.raises(errors.PredictionError, match=message):
        make_predictor().predict(model if model is not None else tiny_onnx(), batch, "infer")


def test_perfgraph_of_another_batch_size_is_refused():
    graph = extract.from_onnx(tiny_onnx(), batch_size=4)
    with pytest.raises(errors.PredictionError, match="batch size 4, not 8"):
        make_predictor().predict(graph, 8, "infer")


def test_max_batch_finds_the_boundary_of_each_limit():
    predictor = make_predictor()
    model = tiny_onnx()

    def upper(batch):
        return predictor.predict(model, batch, "infer").memory_bytes.upper

    limit = upper(1) * 1.5
    answers = predictor.max_batch(
        model, {"small": int(upper(1)) - 1, "some": int(limit)}, "infer", ceiling=256
    )
    assert answers["small"] == 0
    best = answers["some"]
    assert upper(best) <= int(limit)
    assert best == 256 or upper(best + 1) > int(limit)


def depthwise_onnx(side):
    """A depthwise 3x3 convolution over 8 channels of `side` x `side`, between two ReLUs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, side, side])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, side, side])
    weight = numpy_helper.from_array(np.zeros((8, 1, 3, 3), np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Conv", ["a", "w"], ["c"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "depthwise", [x], [y], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_depthwise_tensor_past_2_31_is_a_warning_that_does_not_cap_max_batch():
    model = depthwise_onnx(1024)  # 8 x 1024 x 1024 elements an example: 2^31 at batch 256
    predictor = make_predictor()
    below, at = predictor.predict(model, 255, "infer"), predictor.predict(model, 256, "infer")
    assert not any("depthwise" in w for w in below.warnings)
    assert any("depthwise" in w and "batch 255 or less" in w for w in at.warnings)
    assert at.launch_limits == ()
    assert predictor.max_batch(model, {"plenty": 2**62}, "infer", ceiling=512) == {"plenty": 512}


class ManyWindows(torch.nn.Module):
    """SDPA over 1,024 windows of 4 tokens per example: 65,536 sequences at batch 64."""

    def forward(self, x):
        q = x.reshape(-1, 1, 4, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q).reshape(x.shape)


def test_fused_attention_past_the_grid_limit_is_reported_and_max_batch_stays_below_it(
    torchscript_onnx,
):
    model = torchscript_onnx(ManyWindows(), torch.randn(2, 1024 * 16))
    predictor = make_predictor()
    assert predictor.predict(model, 63, "infer").launch_limits == ()
    (failure,) = predictor.predict(model, 64, "infer").launch_limits
    assert "65,536 sequences" in failure and "batch 63 or less" in failure
    assert predictor.predict(model, 64, "infer", attention="math").launch_limits == ()
    assert predictor.max_batch(model, {"plenty": 2**62}, "infer", ceiling=1024) == {"plenty": 63}


def test_max_batch_command_names_the_launch_limit_that_stopped_it(
    torchscript_onnx, tmp_path, capsys
):
    import json

    ckpt = checkpoint.save(make_predictor().checkpoint, tmp_path / "m.pt")
    (tmp_path / "windows.onnx").write_bytes(torchscript_onnx(ManyWindows(), torch.randn(2, 16384)))
    code = run_command(
        "predict", str(tmp_path / "windows.onnx"), "--max-batch", "--gpu", "a100-80gb",
        "--mode", "infer", "--ckpt", str(ckpt), "--json",
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert max(out["max_batch"].values()) == 63  # the whole GPU holds more, memory-wise
    assert "batch 64 launches fused attention" in out["launch_limits"][0]


def run_command(*argv):
    import argparse

    from kubeseer.predictor import commands

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.handler(args)


def test_predict_command_prints_json_with_points_and_bounds(tmp_path, capsys):
    import json

    ckpt = checkpoint.save(make_predictor().checkpoint, tmp_path / "m.pt")
    (tmp_path / "tiny.onnx").write_bytes(tiny_onnx())
    code = run_command(
        "predict",
        str(tmp_path / "tiny.onnx"),
        "--batch",
        "8",
        "--mode",
        "infer",
        "--ckpt",
        str(ckpt),
        "--json",
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["batch_size"] == 8 and out["mode"] == "infer"
    assert out["memory_bytes"]["upper"] >= out["memory_bytes"]["point"] > 0


def test_max_batch_command_answers_for_every_profile_of_the_gpu(tmp_path, capsys):
    import json

    from kubeseer.placement import catalogue

    ckpt = checkpoint.save(make_predictor().checkpoint, tmp_path / "m.pt")
    (tmp_path / "tiny.onnx").write_bytes(tiny_onnx())
    code = run_command(
        "predict",
        str(tmp_path / "tiny.onnx"),
        "--max-batch",
        "--gpu",
        "a100-80gb",
        "--ckpt",
        str(ckpt),
        "--json",
    )
    out = json.loads(capsys.readouterr().out)
    gpu = catalogue.resolve_product("a100-80gb")
    assert code == 0
    assert set(out["max_batch"]) == {p.label for p in (gpu.whole, *gpu.profiles)}
    assert all(isinstance(v, int) and v >= 0 for v in out["max_batch"].values())


def test_max_batch_command_answers_for_a_whole_card_the_placement_catalogue_lacks(tmp_path, capsys):
    import json

    from kubeseer.hardware import gpus

    ckpt = checkpoint.save(make_predictor().checkpoint, tmp_path / "m.pt")
    (tmp_path / "tiny.onnx").write_bytes(tiny_onnx())
    args = ("predict", str(tmp_path / "tiny.onnx"), "--max-batch", "--ckpt", str(ckpt))
    code = run_command(*args, "--gpu", "rtx4090", "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["gpu"] == "RTX-4090" and set(out["max_batch"]) == {"whole GPU"}
    # the card's whole memory is the limit: its answer is the one for that many bytes
    predictor = api.Predictor(checkpoint.load(ckpt))
    memory = gpus.by_key("RTX-4090").memory_bytes
    expected = predictor.max_batch(tmp_path / "tiny.onnx", {"card": memory}, "train")
    assert out["max_batch"]["whole GPU"] == expected["card"]
    assert run_command(*args, "--gpu", "no-such-gpu") == 2
    assert "unknown GPU product 'no-such-gpu'" in capsys.readouterr().err


def test_predict_command_reports_a_bad_model_on_stderr(tmp_path, capsys):
    ckpt = checkpoint.save(make_predictor().checkpoint, tmp_path / "m.pt")
    (tmp_path / "bad.onnx").write_bytes(b"garbage")
    assert (
        run_command("predict", str(tmp_path / "bad.onnx"), "--batch", "1", "--ckpt", str(ckpt)) == 2
    )
    assert "not an ONNX model" in capsys.readouterr().err


def test_shipped_checkpoint_loads_and_says_where_its_labels_come_from():
    predictor = api.Predictor.load()
    assert predictor.checkpoint.schema_version == schema.SCHEMA_VERSION
    assert predictor.checkpoint.evaluations, "the shipped checkpoint carries its test table"
    made = predictor.predict(tiny_onnx(), 8, "infer", gpu="a100-80gb")
    assert made.memory_bytes.upper >= made.memory_bytes.point > 0
    assert made.label_device == predictor.checkpoint.label_device_name
    # GPU labels, named by source; an A100 has none, so its step time comes from its specs
    assert predictor.checkpoint.device_aware
    assert predictor.checkpoint.label_device.startswith("cuda")
    sources = " ".join(predictor.checkpoint.sources)
    assert "derived-allocator-replay" in sources and "timm" in sources
    assert not any("not a GPU" in w or "requested GPU" in w for w in made.warnings)
    assert any("no step time was measured on A100" in w for w in made.warnings)


def test_memory_is_never_below_the_models_own_state():
    """The toy checkpoint predicts at most ~110 MB; this model's Adam state alone is 160 MB."""
    hidden = 500_000
    params = 16 * hidden + hidden * 4
    predictor = make_predictor()
    infer = predictor.predict(tiny_onnx(hidden), 8, "infer")
    train_adam = predictor.predict(tiny_onnx(hidden), 8, "train", optimizer="adam")
    assert infer.memory_bytes.point >= params * 4
    # Adam: weights, gradients and two moments, all fp32.
    assert train_adam.memory_bytes.point >= params * 4 * 4
    assert train_adam.memory_bytes.upper >= train_adam.memory_bytes.point
    assert any("model's state alone" in w for w in train_adam.warnings)


def test_allocator_checkpoints_add_the_gpu_runtime_overhead():
    """Same weights; only what the memory head learned differs, so the gap is the overhead,
    and the input batch where the labels did not count it (CPU labels, not measured GPUs)."""
    device = make_predictor().predict(tiny_onnx(), 8, "train")
    gpu = make_predictor(
        memory_label=targets.MemoryLabel.ALLOCATOR, device="cuda-test", name="Test GPU"
    ).predict(tiny_onnx(), 8, "train")
    cpu = make_predictor(memory_label=targets.MemoryLabel.ALLOCATOR).predict(
        tiny_onnx(), 8, "train"
    )
    batch = 8 * 16 * 4
    assert figures.RUNTIME_OVERHEAD_BYTES >= 500 * units.MIB
    assert gpu.memory_bytes.point - device.memory_bytes.point == figures.RUNTIME_OVERHEAD_BYTES
    assert gpu.memory_bytes.upper - device.memory_bytes.upper == figures.RUNTIME_OVERHEAD_BYTES
    gap = cpu.memory_bytes.point - device.memory_bytes.point
    assert gap == figures.RUNTIME_OVERHEAD_BYTES + batch
    assert gpu.step_time_s == device.step_time_s
    assert any("CUDA context" in w for w in gpu.warnings)
    assert not any("CUDA context" in w for w in device.warnings)
    assert any("input batch" in w for w in cpu.warnings)
    assert not any("input batch" in w for w in gpu.warnings)


def test_far_beyond_the_training_labels_memory_is_the_analytic_estimate():
    """Labels of tens of MB say nothing about a 320 MB model: the physics answers instead."""
    hidden = 1_000_000
    learned = make_predictor(memory_label=targets.MemoryLabel.ALLOCATOR)
    small_learned = learned.predict(tiny_onnx(), 8, "train").memory_bytes.point
    largest = small_learned - figures.RUNTIME_OVERHEAD_BYTES
    assert 4 * largest < hidden * 20 * 4 * 4, "the big model's Adam state is beyond the range"
    ranges = {m: (1.0, largest) if "memory" in m else (1e-4, 1e-3) for m in targets.METRICS}
    bounded = make_predictor(memory_label=targets.MemoryLabel.ALLOCATOR, label_ranges=ranges)
    graph = extract.from_onnx(tiny_onnx(hidden), batch_size=8)
    analytic = prior.breakdown(graph, prediction.Mode.TRAIN, prediction.Precision.FP32, "adam")
    tensors = prior.tensor_bytes(analytic)
    made = bounded.predict(graph, 8, "train")
    assert made.memory_bytes.point == tensors + figures.RUNTIME_OVERHEAD_BYTES
    assert made.memory_bytes.upper > made.memory_bytes.point
    assert any("analytic estimate" in w for w in made.warnings)
    assert not any("analytic estimate" in w for w in learned.predict(graph, 8, "train").warnings)
    small = bounded.predict(tiny_onnx(), 8, "train")
    assert not any("analytic estimate" in w for w in small.warnings), "in range: learned figure"
    assert any("extrapolates beyond the slowest" in w for w in made.warnings + small.warnings)


def trained_checkpoint(samples, normaliser, *, epochs):
    """A small SeerNet-Multi fitted to `samples` (train = validation: the tests check what
    the priors carry beyond the data, not generalisation), packed as an allocator checkpoint."""
    from kubeseer.predictor import train

    metrics = normaliser.metrics
    config = checkpoint.ModelConfig("seernet_multi", DV, DE, DG, len(metrics), hidden_channels=8)
    torch.manual_seed(0)
    model = config.build()
    settings = train.TrainConfig(batch_size=8, max_epochs=epochs, patience=epochs)
    train.fit(model, samples, samples, settings, metrics=metrics, normaliser=normaliser)
    return checkpoint.Checkpoint(
        model_config=config,
        state_dict=model.state_dict(),
        normaliser=normaliser,
        calibration=calibration.Calibration(
            0.95, metrics, (0.1,) * len(metrics), (40,) * len(metrics)
        ),
        label_device="cpu-test",
        label_device_name="Test CPU",
        label_source="measured",
        train_optimizers=(),
        data_digest="ef" * 32,
        memory_label=targets.MemoryLabel.ALLOCATOR,
    )


ESTIMATE_METRICS = ("infer.memory_bytes", "infer.step_time_s")


def times_the_estimate(factor, *, batches):
    """Inference samples of `tiny_onnx` MLPs 16-512 wide at `batches`, whose memory labels are
    `factor` times the analytic estimate (CPU allocator labels: the CPU's profile, without the
    batch)."""
    import math

    from kubeseer.predictor import model_input, perfgraph

    samples = []
    for hidden in (16, 32, 64, 128, 256, 512):
        for batch in batches:
            graph = extract.from_onnx(tiny_onnx(hidden), batch_size=batch)
            sample = model_input.build(perfgraph.to_pyg(graph), "fp32", "none")
            terms = prior.breakdowns(
                graph, prediction.Precision.FP32, "none", prior.label_device("cpu")
            )
            logs = prior.log_priors(terms, with_batch=False)
            sample.prior_log = torch.tensor([logs], dtype=torch.float64)
            memory = factor * math.exp(logs[targets.METRICS.index("infer.memory_bytes")])
            sample.y = torch.tensor([[memory, 1e-5 * hidden]], dtype=torch.float64)
            sample.y_mask = torch.ones(1, 2, dtype=torch.bool)
            samples.append(sample)
    return samples


def test_a_prior_checkpoint_scales_memory_with_the_analytic_estimate():
    """Labels twice the analytic estimate: learned as a constant correction, which carries the
    prediction to a model 8x wider than any it was trained on."""
    samples = times_the_estimate(2, batches=(8,))
    normaliser = normalise.Normaliser.fit(samples, ESTIMATE_METRICS, prior=True)
    ckpt = trained_checkpoint(samples, normaliser, epochs=80)
    wide = tiny_onnx(4096)
    terms = prior.breakdown(
        extract.from_onnx(wide, batch_size=8),
        prediction.Mode.INFER,
        prediction.Precision.FP32,
        "none",
        prior.label_device("cpu"),
    )
    made = api.Predictor(ckpt).predict(wide, 8, "infer")
    learned = made.memory_bytes.point - figures.RUNTIME_OVERHEAD_BYTES - terms.batch
    assert learned == pytest.approx(2 * prior.tensor_bytes(terms, with_batch=False), rel=0.05)


def test_a_step_prior_checkpoint_scales_step_time_with_the_operators_work():
    """Step times that are a sum of class costs: the cost model carries the prediction to a
    model 8x wider than any it was trained on, where the network alone cannot know."""
    from kubeseer.predictor import cost_model, model_input, perfgraph

    costs = torch.zeros(len(cost_model.TERMS), dtype=torch.float64)
    costs[cost_model.TERMS.index("matmul_flops")] = 1e-10
    costs[cost_model.TERMS.index("other_mac_bytes")] = 1e-9
    costs[cost_model.TERMS.index("matmul_operators")] = 2e-6
    metrics = ("infer.memory_bytes", "infer.step_time_s")
    samples = []
    for hidden in (16, 32, 64, 128, 256, 512):
        for batch in (1, 2, 4, 8, 16, 32):
            graph = extract.from_onnx(tiny_onnx(hidden), batch_size=batch)
            sample = model_input.build(perfgraph.to_pyg(graph), "fp32", "none")
            step = float(sample.cost_terms @ costs)
            sample.y = torch.tensor([[1e6 * hidden * batch, step]], dtype=torch.float64)
            sample.y_mask = torch.ones(1, 2, dtype=torch.bool)
            samples.append(sample)
    normaliser = normalise.Normaliser.fit(samples, metrics, step_prior=True)
    assert normaliser.prior_metrics == ("infer.step_time_s",)
    ckpt = trained_checkpoint(samples, normaliser, epochs=40)
    wide = tiny_onnx(4096)
    work = model_input.build(
        perfgraph.to_pyg(extract.from_onnx(wide, batch_size=8)), "fp32", "none"
    ).cost_terms
    truth = float(work @ costs)
    made = api.Predictor(ckpt).predict(wide, 8, "infer")
    assert made.step_time_s.point == pytest.approx(truth, rel=0.05)


def test_a_learned_correction_may_raise_memory_above_the_analytic_estimate_not_lower_it():
    """Labels half the estimate teach a correction that would halve memory: the prediction
    stays at the estimate (labels above it are learned as they are, the test above)."""
    samples = times_the_estimate(0.5, batches=(8,))
    normaliser = normalise.Normaliser.fit(samples, ESTIMATE_METRICS, prior=True)
    ckpt = trained_checkpoint(samples, normaliser, epochs=80)
    graph = extract.from_onnx(tiny_onnx(256), batch_size=8)
    terms = prior.breakdown(
        graph, prediction.Mode.INFER, prediction.Precision.FP32, "none", prior.label_device("cpu")
    )
    made = api.Predictor(ckpt).predict(graph, 8, "infer")
    learned = made.memory_bytes.point - figures.RUNTIME_OVERHEAD_BYTES - terms.batch
    assert learned == pytest.approx(prior.tensor_bytes(terms, with_batch=False), rel=1e-9)


def device_samples(count: int = 20):
    """Hand-made samples of inference memory on both cards and step time twice as long on the
    RTX 3090 as on the RTX 4090."""
    from kubeseer.hardware import mig
    from kubeseer.predictor import model_input

    g = torch.Generator().manual_seed(0)
    samples = []
    for i, gpu in enumerate(["RTX-4090", "RTX-3090"] * count):
        graph = Data(
            x=torch.rand(3, DV, generator=g) * 5,
            edge_index=torch.tensor([[0, 1], [1, 2]]),
            edge_attr=torch.rand(2, DE, generator=g),
            u=torch.rand(1, len(schema.GLOBAL_FEATURES), generator=g),
        )
        sample = model_input.build(graph, "fp16", "none", mig.device(gpu))
        sample.y = torch.tensor([[(1 + i % 7) * 1e7, 1e-3 * (2.0 if gpu == "RTX-3090" else 1.0)]])
        sample.y_mask = torch.ones(1, 2, dtype=torch.bool)
        sample.family, sample.config_hash = "synthetic", f"c{i}"
        samples.append(sample)
    return samples


DEVICE_METRICS = ("infer.memory_bytes", "infer.step_time_s")


def device_info(records: int, **fields):
    """The `DatasetInfo` of `records` device-aware samples (`device_samples`), with `fields`."""
    from kubeseer.predictor import dataset

    fields = {"metrics": DEVICE_METRICS, **fields}
    return dataset.DatasetInfo(
        device_kind="cuda",
        device="cuda-public-gpus",
        device_name="GPUs: test",
        label_source="measured",
        optimizers=("sgd",),
        records=records,
        censored=0,
        samples=records,
        digest="test",
        memory_label=targets.MemoryLabel.RESERVED,
        **fields,
    )


def make_device_predictor(context_mib: int = 500):
    """A device-aware checkpoint (step heads read the GPU's specs, memory learned as the
    allocator's reservation), untrained, on `device_samples`."""
    from kubeseer.predictor import device, train

    metrics = DEVICE_METRICS
    options = train.Options(hidden_channels=8)
    normaliser, config, model = train.fresh_start(device_samples(), metrics, options, seed=0)
    assert config.device_tasks == (1,)
    ckpt = checkpoint.Checkpoint(
        model_config=config,
        state_dict=model.state_dict(),
        normaliser=normaliser,
        calibration=calibration.Calibration(0.95, metrics, (0.1, 0.2), (40, 40)),
        label_device="cuda-public-gpus",
        label_device_name="GPUs: test",
        label_source="measured+derived-allocator-replay",
        train_optimizers=("sgd",),
        data_digest="ef" * 32,
        memory_label=targets.MemoryLabel.RESERVED,
        device_features=device.FEATURES,
        runtime_context_bytes=context_mib * units.MIB,
        sources=("memory: derived", "step time: measured on RTX-3090, RTX-4090"),
        step_time_gpus=("RTX-3090", "RTX-4090"),
    )
    return api.Predictor(ckpt)


def test_a_device_aware_checkpoint_predicts_step_time_per_gpu_and_memory_for_all():
    predictor = make_device_predictor()
    model = tiny_onnx()
    on_4090 = predictor.predict(model, 8, "infer", "fp16", gpu="RTX-4090")
    on_h100 = predictor.predict(model, 8, "infer", "fp16", gpu="H100-80GB-SXM")
    on_slice = predictor.predict(model, 8, "infer", "fp16", gpu="H100-80GB-SXM/1g.10gb")
    assert on_4090.memory_bytes == on_h100.memory_bytes == on_slice.memory_bytes
    assert (
        len({on_4090.step_time_s.point, on_h100.step_time_s.point, on_slice.step_time_s.point}) == 3
    )
    assert not any("not a GPU" in w or "labels came from" in w for w in on_4090.warnings)
    assert any("no step time was measured on H100-SXM5-80GB" in w for w in on_slice.warnings)
    assert on_4090.work == device_work(model, 8)


def test_a_gpu_without_step_labels_gets_the_measured_wider_step_bound_and_memory_does_not(
    tmp_path,
):
    import dataclasses
    import math

    plain = make_device_predictor()
    ckpt = dataclasses.replace(
        plain.checkpoint, unseen_gpu_margins={"infer.step_time_s": math.log(1.5)}
    )
    ckpt = checkpoint.load(checkpoint.save(ckpt, tmp_path / "wide.pt"))
    assert ckpt.unseen_gpu_margins == {"infer.step_time_s": pytest.approx(math.log(1.5))}
    widened = api.Predictor(ckpt)
    model = tiny_onnx()
    for gpu, factor in (("RTX-4090", 1.0), ("H100-80GB-SXM", 1.5), ("H100-80GB-SXM/1g.10gb", 1.5)):
        before = plain.predict(model, 8, "infer", "fp16", gpu=gpu)
        after = widened.predict(model, 8, "infer", "fp16", gpu=gpu)
        assert after.step_time_s.point == before.step_time_s.point
        assert after.step_time_s.upper == pytest.approx(before.step_time_s.upper * factor)
        assert after.memory_bytes == before.memory_bytes
        said = any("widened (infer.step_time_s x1.50)" in w for w in after.warnings)
        assert said == (factor > 1.0)
    # one batch for several GPUs (a fresh predictor: no cached answers): each row gets its own
    # GPU's margins
    many = api.Predictor(ckpt).predict_many(
        [
            api.Request(model, 8, "infer", "fp16", gpu="RTX-4090"),
            api.Request(model, 8, "infer", "fp16", gpu="H100-80GB-SXM"),
        ]
    )
    assert many[1].step_time_s.upper / many[1].step_time_s.point == pytest.approx(
        1.5 * many[0].step_time_s.upper / many[0].step_time_s.point
    )
    # no GPU named: the reference H100 has no step labels either
    bare = widened.predict(model, 8, "infer", "fp16")
    assert bare.step_time_s.upper == pytest.approx(
        plain.predict(model, 8, "infer", "fp16").step_time_s.upper * 1.5
    )


def test_a_fine_tune_keeps_its_bases_unseen_gpu_margins_and_the_gpus_it_adds_are_seen():
    import dataclasses

    from kubeseer.predictor import train

    base = dataclasses.replace(
        make_device_predictor().checkpoint, unseen_gpu_margins={"infer.step_time_s": 0.3}
    )
    info = device_info(records=1, step_time_gpus=("A100-SXM4-80GB",))
    fields = train._provenance_fields(info, base)
    assert fields["unseen_gpu_margins"] == {"infer.step_time_s": 0.3}
    tuned = dataclasses.replace(base, **fields)
    assert tuned.step_calibration("A100-SXM4-80GB") == base.calibration
    assert tuned.step_calibration("H100-SXM5-80GB").margin("infer.step_time_s") > (
        base.calibration.margin("infer.step_time_s")
    )


def test_step_heads_blind_to_the_device_still_predict_per_gpu_through_the_step_prior():
    from kubeseer.predictor import train

    made = train.train_checkpoint(
        device_samples(60),
        device_info(records=120),
        train.TrainConfig(batch_size=16, max_epochs=1, seed=0),
        train.Options(hidden_channels=8, step_prior=True, device_heads=False),
    )
    assert made.device_aware
    assert made.model_config.device_tasks == () and made.model_config.device_channels == 0
    predictor = api.Predictor(made)
    model = tiny_onnx()
    on_3090 = predictor.predict(model, 8, "infer", "fp16", gpu="RTX-3090")
    on_h100 = predictor.predict(model, 8, "infer", "fp16", gpu="H100-80GB-SXM")
    assert on_3090.memory_bytes == on_h100.memory_bytes
    assert on_3090.step_time_s.point > on_h100.step_time_s.point
    with pytest.raises(ValueError, match="same on every GPU"):
        train.fresh_start(
            device_samples(), DEVICE_METRICS, train.Options(device_heads=False), seed=0
        )


def device_work(model, batch):
    from kubeseer.predictor import device

    graph = extract.from_onnx(model, batch_size=batch)
    return device.work(graph, prediction.Mode.INFER, "fp16")


def test_without_a_gpu_a_device_aware_checkpoint_predicts_for_the_reference_gpu():
    predictor = make_device_predictor()
    model = tiny_onnx()
    bare = predictor.predict(model, 8, "infer", "fp16")
    named = predictor.predict(model, 8, "infer", "fp16", gpu="H100-SXM5-80GB")
    assert bare.step_time_s == named.step_time_s
    assert any("whole H100-SXM5-80GB (no GPU named)" in w for w in bare.warnings)
    with pytest.raises(errors.PredictionError, match="unknown GPU"):
        predictor.predict(model, 8, "infer", "fp16", gpu="Voodoo-5")


def test_reserved_memory_adds_the_checkpoints_runtime_context_back():
    model = tiny_onnx()
    small = make_device_predictor(context_mib=500).predict(model, 8, "infer", "fp16")
    large = make_device_predictor(context_mib=1200).predict(model, 8, "infer", "fp16")
    assert large.memory_bytes.point - small.memory_bytes.point == pytest.approx(700 * units.MIB)
    assert large.memory_bytes.upper - small.memory_bytes.upper == pytest.approx(700 * units.MIB)


def test_a_device_aware_checkpoint_round_trips_and_the_cpu_one_stays_available_by_name(tmp_path):
    ckpt = make_device_predictor().checkpoint
    loaded = checkpoint.load(checkpoint.save(ckpt, tmp_path / "gpu.pt"))
    assert checkpoint.fingerprint(loaded) == checkpoint.fingerprint(ckpt)
    assert loaded.device_aware and loaded.model_config.device_tasks == (1,)
    cpu = api.Predictor.load("cpu").checkpoint
    assert not cpu.device_aware and cpu.label_device_kind == "cpu"
    with pytest.raises(checkpoint.CheckpointError, match="shipped"):
        api.shipped_checkpoint_path("tpu")


def test_a_checkpoint_reading_other_device_features_is_refused(tmp_path):
    data = make_device_predictor().checkpoint.to_dict()
    data["device_features"] = ["log_peak_flops"]
    torch.save(data, tmp_path / "other.pt")
    with pytest.raises(checkpoint.SchemaMismatchError, match="device features"):
        checkpoint.load(tmp_path / "other.pt")


def test_a_heads_only_fine_tune_keeps_every_metric_and_what_it_did_not_relearn():
    """A cluster's observations label memory only: the fine-tune must not cost step time."""
    from kubeseer.predictor import dataset, train

    base = make_device_predictor().checkpoint
    memory = ("infer.memory_bytes",)
    observed = dataset.select_metrics(device_samples(30), DEVICE_METRICS, memory)
    for sample in observed:
        sample.y = sample.y * 1.5  # the observed family needs more than the base predicts
    info = device_info(records=60, metrics=memory, step_time_gpus=())
    made = train.train_checkpoint(
        observed,
        info,
        train.TrainConfig(batch_size=16, max_epochs=3, seed=0),
        train.Options(heads_only=True),
        base=base,
    )
    assert made.metrics == base.metrics
    assert made.model_config == base.model_config
    changed = {k for k, v in made.state_dict.items() if not torch.equal(v, base.state_dict[k])}
    assert changed and all(k.startswith("heads.0.") for k in changed)
    assert made.calibration.margin("infer.step_time_s") == base.calibration.margin(
        "infer.step_time_s"
    )
    assert made.calibration.margin("infer.memory_bytes") >= base.calibration.margin(
        "infer.memory_bytes"
    )
    assert made.normaliser.step_costs == base.normaliser.step_costs
    model = tiny_onnx()
    before = api.Predictor(base).predict(model, 8, "infer", "fp16", gpu="RTX-4090")
    after = api.Predictor(made).predict(model, 8, "infer", "fp16", gpu="RTX-4090")
    assert after.step_time_s == before.step_time_s
    assert after.memory_bytes != before.memory_bytes
    # the whole network fine-tuned on the same labels drops the heads it cannot relearn
    whole = train.train_checkpoint(
        observed,
        info,
        train.TrainConfig(batch_size=16, max_epochs=1, seed=0),
        train.Options(),
        base=base,
    )
    assert whole.metrics == memory
