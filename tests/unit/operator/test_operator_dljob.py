"""DLJob spec parsing: defaults, and errors that name the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from kubeseer.operator import dljob
from kubeseer.placement import policy
from kubeseer.prediction import Attention, Mode, Precision


def test_parses_a_configmap_model_with_defaults_applied(dljob_spec: Any) -> None:
    spec = dljob_spec()
    del spec["precision"], spec["replicas"], spec["placement"]
    parsed = dljob.parse_spec(spec)
    assert parsed.model == dljob.ModelSource(
        url=None, config_map=dljob.ConfigMapRef("resnet", "model.onnx"), sha256=None
    )
    assert parsed.mode is Mode.INFER
    assert parsed.precision is Precision.FP32
    assert parsed.attention is Attention.AUTO
    assert parsed.replicas == 1
    assert parsed.placement == policy.Request()


def test_inputs_are_sorted_so_equal_specs_share_a_cache_key(dljob_spec: Any) -> None:
    a = dljob.parse_spec(dljob_spec(inputs={"seq": 128, "image": 224}))
    b = dljob.parse_spec(dljob_spec(inputs={"image": 224, "seq": 128}))
    assert a.inputs == b.inputs == (("image", 224), ("seq", 128))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"model": {}}, "exactly one of spec.model.url and spec.model.configMapRef"),
        (
            {"model": {"url": "https://x/m.onnx", "configMapRef": {"name": "a", "key": "b"}}},
            "exactly one",
        ),
        ({"model": {"url": "ftp://x/m.onnx"}}, "spec.model.url"),
        ({"model": {"url": "https://x/m.onnx", "sha256": "ABC"}}, "spec.model.sha256"),
        ({"mode": "serve"}, "spec.mode must be one of train, infer"),
        ({"batchSize": 0}, "spec.batchSize must be at least 1"),
        ({"batchSize": True}, "spec.batchSize must be an integer"),
        ({"precision": "int8"}, "spec.precision"),
        (
            {"attention": "paged"},
            "spec.attention must be one of auto, flash, efficient, math, written",
        ),
        ({"inputs": {"seq": 0}}, "spec.inputs.seq"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
        ({"template": {"spec": {"containers": [{"name": "x"}]}}}, "containers[0]"),
        ({"placement": {"policy": "fixed"}}, "spec.placement"),
        ({"placement": {"policy": "auto", "profile": "1g.10gb"}}, "only used with policy"),
        ({"placement": {"coverage": 1.0}}, "coverage"),
        ({"placement": {"maxSlowdown": 0.5}}, "maxSlowdown"),
        ({"placement": {"gpuProducts": ["V100"]}}, "unknown GPU product"),
        ({"placement": {"allowWholeGPU": "yes"}}, "allowWholeGPU"),
    ],
)
def test_rejects_an_invalid_spec_naming_the_field(
    override: dict, field: str, dljob_spec: Any
) -> None:
    with pytest.raises(dljob.InvalidSpecError, match=field.replace("[", r"\[").replace(".", r"\.")):
        dljob.parse_spec(dljob_spec(**override))


def test_fixed_policy_takes_a_catalogue_profile(dljob_spec: Any) -> None:
    parsed = dljob.parse_spec(dljob_spec(placement={"policy": "fixed", "profile": "3g.40gb"}))
    assert parsed.placement.policy is policy.PolicyName.FIXED
    assert parsed.placement.profile == "3g.40gb"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://models.example/zoo/resnet50.onnx", "resnet50.onnx"),
        ("https://models.example/zoo/resnet50.onnx?sig=abc", "resnet50.onnx"),
        ("s3://bucket/key/bert.onnx", "bert.onnx"),
    ],
)
def test_model_column_shows_the_last_url_segment(url: str, shown: str) -> None:
    assert dljob.ModelSource(url=url, config_map=None, sha256=None).describe() == shown


def test_model_column_shows_configmap_and_key() -> None:
    source = dljob.ModelSource(url=None, config_map=dljob.ConfigMapRef("cm", "k"), sha256=None)
    assert source.describe() == "cm/k"


def test_only_succeeded_and_failed_are_terminal() -> None:
    assert {p for p in dljob.Phase if p.terminal} == {dljob.Phase.SUCCEEDED, dljob.Phase.FAILED}
