import math

import pytest
import torch
from torch_geometric.data import Data

from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import normalise, prior, schema, targets

TRAIN_MEMORY = targets.METRICS.index("train.memory_bytes")
INFER_MEMORY = targets.METRICS.index("infer.memory_bytes")


def mlp_graph(hidden: int = 64) -> am.MemoryGraph:
    return am.MemoryGraph(
        nodes=(
            am.OpNode("MatMul", 8 * hidden, 16 * hidden),
            am.OpNode("Relu", 8 * hidden, 0),
            am.OpNode("MatMul", 8 * 4, hidden * 4),
        ),
        edges=((0, 1), (1, 2)),
        input_elements=8 * 16,
    )


def test_memory_metrics_get_the_log_analytic_tensor_bytes_and_others_none():
    graph = mlp_graph()
    logs = prior.log_priors(prior.breakdowns(graph, Precision.FP32, "adam"))
    train = prior.breakdown(graph, Mode.TRAIN, Precision.FP32, "adam")
    infer = prior.breakdown(graph, Mode.INFER, Precision.FP32, "adam")
    assert len(logs) == len(targets.METRICS)
    assert logs[TRAIN_MEMORY] == pytest.approx(math.log(prior.tensor_bytes(train)))
    assert logs[INFER_MEMORY] == pytest.approx(math.log(prior.tensor_bytes(infer)))
    assert [v for k, v in enumerate(logs) if k not in (TRAIN_MEMORY, INFER_MEMORY)] == [0.0] * 4
    assert prior.tensor_bytes(train) == train.total - train.cuda_context - train.workspace
    assert train.batch == 8 * 16 * 4
    without = prior.tensor_bytes(train, with_batch=False)
    assert without == prior.tensor_bytes(train) - train.batch
    unbatched = prior.log_priors(prior.breakdowns(graph, Precision.FP32, "adam"), with_batch=False)
    assert unbatched[TRAIN_MEMORY] == pytest.approx(math.log(without))


def test_the_optimizer_changes_the_training_prior_and_none_means_inference_only():
    graph = mlp_graph()

    def logs(optimizer):
        return prior.log_priors(prior.breakdowns(graph, Precision.FP32, optimizer))

    adam, sgd = (logs(o)[TRAIN_MEMORY] for o in ("adam", "sgd"))
    assert adam > sgd, "Adam keeps two moments, momentum SGD one"
    assert logs("none")[INFER_MEMORY] == pytest.approx(logs("adam")[INFER_MEMORY])


def with_prior(seed, y, infer_memory_log_prior):
    log_prior = [0.0] * len(targets.METRICS)
    log_prior[INFER_MEMORY] = infer_memory_log_prior
    g = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.rand(3, len(schema.NODE_FEATURES), generator=g),
        edge_index=torch.tensor([[0, 1], [1, 2]]),
        edge_attr=torch.rand(2, len(schema.EDGE_FEATURES), generator=g),
        u=torch.rand(1, len(schema.GLOBAL_FEATURES), generator=g),
        y=torch.tensor([y], dtype=torch.float64),
        y_mask=torch.ones(1, len(y), dtype=torch.bool),
        prior_log=torch.tensor([log_prior], dtype=torch.float64),
    )


def test_a_prior_makes_memory_targets_the_log_ratio_to_it():
    """Labels exactly twice the prior: the memory target is constant, step time untouched."""
    data = [
        with_prior(i, [2 * 10.0 ** (6 + i), 0.01 * (i + 1)], (6 + i) * math.log(10))
        for i in range(3)
    ]
    names = ["infer.memory_bytes", "infer.step_time_s"]
    norm = normalise.Normaliser.fit(data, names, prior=True)
    plain = normalise.Normaliser.fit(data, names)
    assert norm.prior_metrics == ("infer.memory_bytes",)
    assert norm.target_mean[0] == pytest.approx(math.log(2))
    assert norm.target_std[0] == 1.0, "a constant ratio has no spread (kept at scale 1)"
    assert norm.target_mean[1] == pytest.approx(plain.target_mean[1])
    y = torch.cat([s.y for s in data])
    log_prior = torch.cat([s.prior_log for s in data])
    encoded = norm.encode_targets(y, log_prior)
    torch.testing.assert_close(encoded[:, 0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(norm.decode_targets(encoded, log_prior), y)


def test_a_prior_normaliser_refuses_samples_without_priors_and_round_trips():
    data = [with_prior(i, [1e6 * (i + 1), 0.01], 13.0) for i in range(3)]
    norm = normalise.Normaliser.fit(data, ["infer.memory_bytes", "infer.step_time_s"], prior=True)
    with pytest.raises(ValueError, match="relative to a prior"):
        norm.decode_targets(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="columns"):
        norm.decode_targets(torch.zeros(1, 2), torch.zeros(1, 2))
    assert normalise.Normaliser.from_dict(norm.to_dict()) == norm
    del data[0].prior_log
    with pytest.raises(ValueError, match="prior_log"):
        normalise.Normaliser.fit(data, ["infer.memory_bytes", "infer.step_time_s"], prior=True)


def test_without_a_prior_priors_on_samples_are_ignored():
    data = [with_prior(i, [1e6 * (i + 1), 0.01], 13.0) for i in range(3)]
    norm = normalise.Normaliser.fit(data, ["infer.memory_bytes", "infer.step_time_s"])
    y = torch.tensor([[1e6, 0.01]], dtype=torch.float64)
    torch.testing.assert_close(norm.encode_targets(y, data[0].prior_log), norm.encode_targets(y))


def test_priors_are_estimated_for_the_kind_of_device_the_labels_come_from():
    assert prior.label_device("cpu") == am.DEVICE_PROFILES["cpu"]
    assert prior.label_device("cuda") == am.DEFAULT_DEVICE
    # A CPU's Adam loops over parameters: its step holds two temporaries of the largest one,
    # a GPU's foreach step one of every parameter.
    graph = mlp_graph()
    cpu = prior.breakdown(graph, Mode.TRAIN, Precision.FP32, "adam", prior.label_device("cpu"))
    gpu = prior.breakdown(graph, Mode.TRAIN, Precision.FP32, "adam", prior.label_device("cuda"))
    assert prior.tensor_bytes(cpu) != prior.tensor_bytes(gpu)


def test_memory_below_its_prior_is_raised_to_it_and_nothing_else_is_touched():
    data = [with_prior(i, [1e6 * (i + 1), 0.01], math.log(1e6 * (i + 1))) for i in range(3)]
    names = ["infer.memory_bytes", "infer.step_time_s"]
    norm = normalise.Normaliser.fit(data, names, prior=True)
    log_prior = torch.cat([s.prior_log for s in data])
    prior = torch.exp(log_prior[:, INFER_MEMORY])
    decoded = torch.tensor(
        [[0.5 * prior[0], 1e-3], [2.0 * prior[1], 2e-3], [prior[2], 3e-3]], dtype=torch.float64
    )
    floored = norm.at_least_memory_prior(decoded, log_prior)
    torch.testing.assert_close(floored[:, 0], torch.stack([prior[0], 2 * prior[1], prior[2]]))
    torch.testing.assert_close(floored[:, 1], decoded[:, 1])
    plain = normalise.Normaliser.fit(data, names)
    torch.testing.assert_close(plain.at_least_memory_prior(decoded, None), decoded)
    with pytest.raises(ValueError, match="relative to a prior"):
        norm.at_least_memory_prior(decoded, None)
