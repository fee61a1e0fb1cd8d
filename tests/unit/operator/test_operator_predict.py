"""The operator's prediction step with the real predictor: one cache (the predictor's), keyed by
the whole request, and every answer counted as computed, cached or failed."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.operator import dljob, predict
from kubeseer.predictor import api, errors


def sequence_onnx() -> bytes:
    """A ``[batch, seq, 256]`` model: what it costs depends on the bound sequence length."""
    tokens = helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 256])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 256])
    weight = numpy_helper.from_array(np.zeros((256, 256), np.float32), "w")
    node = helper.make_node("MatMul", ["tokens", "w"], ["out"])
    graph = helper.make_graph([node], "sequence", [tokens], [out], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def predictor() -> api.Predictor:
    return api.Predictor.load()


def test_each_job_gets_the_prediction_of_its_own_inputs_and_repeats_are_counted_cached(
    predictor: api.Predictor, dljob_spec: Callable[..., dict[str, Any]]
) -> None:
    registry = CollectorRegistry()
    step = predict.CachedPredictor(predictor, metrics.OperatorMetrics(registry))
    model = sequence_onnx()
    digest = hashlib.sha256(model).hexdigest()
    short = dljob.parse_spec(dljob_spec(mode="train", inputs={"seq": 16}))
    long = dljob.parse_spec(dljob_spec(mode="train", inputs={"seq": 65536}))
    first = step.predict(model, digest, short)
    assert step.lookup(digest, long) is None
    second = step.predict(model, digest, long)
    assert second.memory_bytes.point > 2 * first.memory_bytes.point
    assert step.lookup(digest, long) == second
    assert predictor.cached(digest, 8, "train", inputs={"seq": 65536}) == second

    def count(outcome: str) -> float | None:
        labels = {"mode": "train", "outcome": outcome}
        return registry.get_sample_value("kubeseer_operator_predictions_total", labels)

    assert (count("computed"), count("cached"), count("failed")) == (2, 1, 0)


def test_the_jobs_attention_kernel_is_part_of_the_question(
    predictor: api.Predictor, dljob_spec: Callable[..., dict[str, Any]]
) -> None:
    step = predict.CachedPredictor(predictor, metrics.OperatorMetrics(CollectorRegistry()))
    model = sequence_onnx()
    digest = hashlib.sha256(model).hexdigest()
    auto = dljob.parse_spec(dljob_spec(inputs={"seq": 32}))
    math = dljob.parse_spec(dljob_spec(inputs={"seq": 32}, attention="math"))
    step.predict(model, digest, auto)
    assert step.lookup(digest, math) is None
    made = step.predict(model, digest, math)
    assert predictor.cached(digest, 8, "infer", inputs={"seq": 32}, attention="math") == made


@pytest.mark.parametrize("inputs", [None, {"sequence": 16}])
def test_a_job_whose_inputs_do_not_bind_fails_after_one_whose_inputs_did(
    predictor: api.Predictor,
    dljob_spec: Callable[..., dict[str, Any]],
    inputs: dict[str, int] | None,
) -> None:
    registry = CollectorRegistry()
    step = predict.CachedPredictor(predictor, metrics.OperatorMetrics(registry))
    model = sequence_onnx()
    digest = hashlib.sha256(model).hexdigest()
    step.predict(model, digest, dljob.parse_spec(dljob_spec(inputs={"seq": 16})))
    unbound = dljob.parse_spec(dljob_spec(**({} if inputs is None else {"inputs": inputs})))
    with pytest.raises(errors.PredictionError) as caught:
        step.predict(model, digest, unbound)
    assert predict.reason(caught.value) is dljob.Reason.INVALID_INPUTS
    labels = {"mode": "infer", "outcome": "failed"}
    assert registry.get_sample_value("kubeseer_operator_predictions_total", labels) == 1


def _model(
    nodes: list[Any], inputs: list[Any], outputs: list[Any], initializers: list[Any], *domains: str
) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())


def _custom_domain() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    node = helper.make_node("Gelu2", ["x"], ["y"], domain="com.acme")
    return _model([node], [x], [y], [], "com.acme")


def _negative_weight() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16, -4])
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y], [weight])


def _negative_input() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", -16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", -16])
    return _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], [])


@pytest.mark.parametrize(
    ("model", "reason", "words"),
    [
        (_custom_domain, dljob.Reason.UNSUPPORTED_MODEL, "custom domain 'com.acme'"),
        (_negative_weight, dljob.Reason.CORRUPT_MODEL, "negative dimension -4"),
        (_negative_input, dljob.Reason.CORRUPT_MODEL, "negative dimension -16"),
    ],
)
def test_models_the_predictor_cannot_read_fail_with_the_reason_that_says_why(
    predictor: api.Predictor,
    dljob_spec: Callable[..., dict[str, Any]],
    model: Callable[[], bytes],
    reason: dljob.Reason,
    words: str,
) -> None:
    """Issue 17: a custom-domain operator failed as "has no inferred type" (CorruptModel), a
    negative dimension as "non-finite prediction" or a memory-estimate error."""
    step = predict.CachedPredictor(predictor, metrics.OperatorMetrics(CollectorRegistry()))
    data = model()
    with pytest.raises(errors.PredictionError) as raised:
        step.predict(data, hashlib.sha256(data).hexdigest(), dljob.parse_spec(dljob_spec()))
    assert predict.reason(raised.value) is reason
    assert words in str(raised.value)
