import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from kubeseer.hardware import mig
from kubeseer.predictor import (
    cost_model,
    dataset,
    model_input,
    normalise,
    perfgraph,
    schema,
    targets,
)

NODE_LOG = np.array([f.transform is schema.Transform.LOG1P for f in schema.NODE_SCHEMA])


def node(**raw: float) -> np.ndarray:
    row = np.zeros(len(schema.NODE_FEATURES))
    for name, value in raw.items():
        row[schema.NODE_FEATURES.index(name)] = value
    return row


def features(*rows: np.ndarray) -> torch.Tensor:
    """Node features as `perfgraph.to_pyg` gives them to every model."""
    return torch.from_numpy(perfgraph.transform(np.stack(rows), NODE_LOG).astype(np.float32))


def test_terms_sort_each_operators_work_into_its_class():
    x = features(
        node(kernel_h=3, weight_bytes=4608, group=1, flops=1e9, mac_bytes=1e6),  # conv
        node(kernel_h=3, weight_bytes=1152, group=32, flops=2e7, mac_bytes=3e6),  # depthwise
        node(kernel_h=2, flops=5e5, mac_bytes=4e6),  # max pool: a window, no weights
        node(gemm_k=768, weight_bytes=2e6, flops=4e9, mac_bytes=5e6),  # linear layer
        node(gemm_k=64, flops=1e8, mac_bytes=6e6),  # attention scores: no weights
        node(flops=1e5, mac_bytes=7e5),  # Relu
    )
    work = dict(zip(cost_model.TERMS, cost_model.terms(x)[0].tolist(), strict=True))
    expected = {
        "conv_flops": 1e9,
        "grouped_conv_flops": 2e7,
        "matmul_flops": 4.1e9,
        "other_flops": 1e5,
        "conv_mac_bytes": 4e6,
        "pool_mac_bytes": 4e6,
        "matmul_mac_bytes": 1.1e7,
        "other_mac_bytes": 7e5,
        "conv_operators": 2,
        "pool_operators": 1,
        "matmul_operators": 2,
        "other_operators": 1,
    }
    assert work == pytest.approx(expected, rel=1e-5)


def test_terms_reject_features_of_another_schema():
    with pytest.raises(cost_model.CostModelError, match="node features"):
        cost_model.terms(torch.zeros(3, len(schema.NODE_FEATURES) - 1))


def random_work(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    magnitudes = torch.tensor([1e9, 1e7, 1e9, 1e6, 1e7, 1e6, 1e7, 1e6, 50, 5, 20, 100])
    return torch.rand(n, len(cost_model.TERMS), generator=g, dtype=torch.float64) * magnitudes


TRUE_COSTS = (2e-11, 8e-11, 1e-11, 5e-10, 1e-10, 2e-10, 1e-10, 3e-10, 2e-5, 1e-5, 3e-5, 4e-6)


def test_fit_recovers_step_times_that_are_a_sum_of_class_costs():
    work = random_work(200, 0)
    seconds = work @ torch.tensor(TRUE_COSTS, dtype=torch.float64)
    model = cost_model.StepCostModel.fit(work, seconds, ["train"] * 200)
    assert set(model.seconds_per_unit) == {"train"}
    assert all(c >= 0 for c in model.seconds_per_unit["train"])
    estimate = model.log_estimate("train", random_work(20, 1))
    truth = random_work(20, 1) @ torch.tensor(TRUE_COSTS, dtype=torch.float64)
    assert estimate is not None
    torch.testing.assert_close(estimate.exp(), truth, rtol=1e-3, atol=0)


def test_a_line_search_that_would_overflow_still_fits_finite_costs():
    """Regression: the device terms and measured inference step times of the timm rows left in
    training when the RTX 5090 is left out (bench/gpu_predictor.py --splits gpus, twelfth
    session). L-BFGS stepped far enough to overflow: every coefficient came out inf or 0 and the
    fit raised."""
    data = np.load(Path(__file__).parent / "fixtures" / "cost_terms_rtx5090_left_out.npz")
    work = torch.from_numpy(data["work"])
    seconds = torch.from_numpy(data["labels"])
    model = cost_model.StepCostModel.fit(work, seconds, ["infer"] * len(seconds))
    estimate = model.log_estimate("infer", work)
    assert estimate is not None
    # a fit, not merely finite numbers: within a factor of 1.4 of the label, as a root mean square
    assert float(((estimate - seconds.log()) ** 2).mean().sqrt()) < math.log(1.4)


def test_a_mode_with_too_few_labels_gets_no_cost_model():
    n = cost_model.MIN_SAMPLES
    work = random_work(n + 3, 2)
    seconds = work @ torch.tensor(TRUE_COSTS, dtype=torch.float64)
    model = cost_model.StepCostModel.fit(work, seconds, ["infer"] * n + ["train"] * 3)
    assert set(model.seconds_per_unit) == {"infer"}
    assert model.log_estimate("train", work) is None


def test_fit_rejects_labels_it_cannot_take_a_log_of_and_misshapen_input():
    work = random_work(40, 3)
    with pytest.raises(cost_model.CostModelError, match="positive"):
        cost_model.StepCostModel.fit(work, torch.zeros(40, dtype=torch.float64), ["infer"] * 40)
    with pytest.raises(cost_model.CostModelError, match="one label per row"):
        cost_model.StepCostModel.fit(work[:, :3], torch.ones(40), ["infer"] * 40)
    with pytest.raises(cost_model.CostModelError, match="one mode per label"):
        cost_model.StepCostModel.fit(work, torch.ones(40), ["infer"])


def test_stored_models_round_trip_and_refuse_other_terms_or_negative_costs():
    model = cost_model.StepCostModel({"infer": TRUE_COSTS})
    assert cost_model.StepCostModel.from_dict(model.to_dict()) == model
    stored = model.to_dict()
    stored["terms"] = list(reversed(stored["terms"]))
    with pytest.raises(cost_model.CostModelError, match="differ"):
        cost_model.StepCostModel.from_dict(stored)
    with pytest.raises(cost_model.CostModelError, match="non-negative"):
        cost_model.StepCostModel({"infer": (-1.0, *TRUE_COSTS[1:])})
    with pytest.raises(cost_model.CostModelError, match="unknown mode"):
        cost_model.StepCostModel({"warmup": TRUE_COSTS})
    with pytest.raises(cost_model.CostModelError, match="not a step cost model"):
        cost_model.StepCostModel.from_dict({"terms": list(cost_model.TERMS)})


def random_graph(seed: int) -> Data:
    """A seeded four-node chain with random features."""
    g = torch.Generator().manual_seed(seed)
    graph = Data(
        x=torch.rand(4, len(schema.NODE_FEATURES), generator=g) * 20,
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        edge_attr=torch.rand(3, len(schema.EDGE_FEATURES), generator=g),
        u=torch.rand(1, len(schema.GLOBAL_FEATURES), generator=g),
    )
    return graph


def sample_with_work(seed: int, memory: float) -> Data:
    """A sample whose inference step time is exactly `TRUE_COSTS` applied to its work."""
    sample = model_input.build(random_graph(seed), "fp32", "none")
    step = float(sample.cost_terms[0] @ torch.tensor(TRUE_COSTS, dtype=torch.float64))
    sample.y = torch.tensor([[memory, step]], dtype=torch.float64)
    sample.y_mask = torch.ones(1, 2, dtype=torch.bool)
    return sample


METRICS = ["infer.memory_bytes", "infer.step_time_s"]


def test_a_step_prior_makes_step_targets_the_log_ratio_to_the_cost_model():
    data = [sample_with_work(i, 1e6 * (i + 1)) for i in range(40)]
    norm = normalise.Normaliser.fit(data, METRICS, step_prior=True)
    assert norm.prior_metrics == ("infer.step_time_s",)
    assert not norm.memory_prior
    assert norm.target_mean[1] == pytest.approx(0.0, abs=1e-3), "the costs explain every label"
    batch = Batch.from_data_list(data)
    log_priors = norm.log_priors(batch)
    assert log_priors is not None
    step = targets.METRICS.index("infer.step_time_s")
    torch.testing.assert_close(log_priors[:, step].exp(), batch.y[:, 1], rtol=1e-3, atol=0)
    memory = targets.METRICS.index("infer.memory_bytes")
    assert bool((log_priors[:, memory] == 0).all()), "memory keeps no prior of its own"
    encoded = norm.encode_targets(batch.y, log_priors)
    torch.testing.assert_close(norm.decode_targets(encoded, log_priors), batch.y)
    plain = normalise.Normaliser.fit(data, METRICS)
    assert norm.target_mean[0] == pytest.approx(plain.target_mean[0])
    assert normalise.Normaliser.from_dict(norm.to_dict()) == norm


def test_a_step_prior_needs_the_work_of_every_sample():
    data = [sample_with_work(i, 1e6) for i in range(40)]
    norm = normalise.Normaliser.fit(data, METRICS, step_prior=True)
    bare = Data(**{k: v for k, v in data[0].items() if k != "cost_terms"})
    with pytest.raises(ValueError, match="cost_terms"):
        norm.log_priors(bare)
    del data[3].cost_terms
    with pytest.raises(ValueError, match="cost_terms"):
        normalise.Normaliser.fit(data, METRICS, step_prior=True)


def test_too_few_step_labels_leave_step_time_without_a_prior():
    data = [sample_with_work(i, 1e6) for i in range(cost_model.MIN_SAMPLES - 1)]
    norm = normalise.Normaliser.fit(data, METRICS, step_prior=True)
    assert norm.prior_metrics == ()
    assert norm.step_costs is None
    assert norm.log_priors(Batch.from_data_list(data)) is None
    assert math.isfinite(norm.target_mean[1])


def test_a_fine_tune_keeps_the_scales_and_fits_the_step_prior_to_the_new_device():
    data = [sample_with_work(i, 1e6 * (i + 1)) for i in range(40)]
    norm = normalise.Normaliser.fit(data, METRICS, step_prior=True)
    faster = [sample_with_work(100 + i, 1e6) for i in range(40)]
    for sample in faster:
        sample.y[0, 1] /= 10  # the same work at a tenth of the time: another device
    faster = dataset.select_metrics(faster, METRICS, ["infer.step_time_s"])
    tuned = norm.for_fine_tuning(["infer.step_time_s"], faster)
    assert tuned.metrics == tuned.prior_metrics == ("infer.step_time_s",)
    assert (tuned.target_mean, tuned.target_std) == (norm.target_mean[1:], norm.target_std[1:])
    assert (tuned.x, tuned.edge_attr, tuned.u) == (norm.x, norm.edge_attr, norm.u)
    batch = Batch.from_data_list(faster)
    log_priors = tuned.log_priors(batch)
    assert log_priors is not None
    step = targets.METRICS.index("infer.step_time_s")
    torch.testing.assert_close(log_priors[:, step].exp(), batch.y[:, 0], rtol=1e-3, atol=0)
    with pytest.raises(ValueError, match="fine-tuning needs metrics among"):
        norm.for_fine_tuning(["train.step_time_s"], faster)
    with pytest.raises(ValueError, match="too few labels to refit"):
        norm.for_fine_tuning(["infer.step_time_s"], faster[: cost_model.MIN_SAMPLES - 1])


def device_sample(seed: int, gpu: str, efficiency: float) -> Data:
    """A sample on `gpu` whose inference step time is its convolution work at `efficiency` of
    the GPU's peak, its other bytes at full bandwidth, and 2 ms a step."""
    sample = model_input.build(random_graph(seed), "fp16", "none", mig.device(gpu))
    terms = dict(zip(cost_model.DEVICE_TERMS, sample.cost_terms[0].tolist(), strict=True))
    step = terms["conv_flops_at_peak"] / efficiency + terms["other_bytes_at_bandwidth"] + 2e-3
    sample.y = torch.tensor([[1e9, step]], dtype=torch.float64)
    sample.y_mask = torch.ones(1, 2, dtype=torch.bool)
    return sample


def test_a_device_aware_fine_tune_with_few_new_step_times_keeps_the_fit_it_had():
    seen = [device_sample(i, ("RTX-3090", "RTX-4090")[i % 2], 0.6) for i in range(60)]
    norm = normalise.Normaliser.fit(seen, METRICS, step_prior=True)
    assert norm.step_costs is not None and norm.step_costs.terms == cost_model.DEVICE_TERMS
    few = dataset.select_metrics(
        [device_sample(100 + i, "RTX-PRO-6000-MAXQ", 0.3) for i in range(5)],
        METRICS,
        ["infer.step_time_s"],
    )
    tuned = norm.for_fine_tuning(["infer.step_time_s"], few)
    assert tuned.step_costs == norm.step_costs
    many = dataset.select_metrics(
        [device_sample(200 + i, "RTX-PRO-6000-MAXQ", 0.3) for i in range(40)],
        METRICS,
        ["infer.step_time_s"],
    )
    refitted = norm.for_fine_tuning(["infer.step_time_s"], many)
    assert refitted.step_costs != norm.step_costs
    log_priors = refitted.log_priors(Batch.from_data_list(many))
    assert log_priors is not None
    step = targets.METRICS.index("infer.step_time_s")
    torch.testing.assert_close(
        log_priors[:, step].exp(), Batch.from_data_list(many).y[:, 0], rtol=0.05, atol=0
    )
