import dataclasses
import random

import pytest
import torch

from kubeseer import zoo
from kubeseer.zoo import registry


@pytest.mark.parametrize("family", zoo.FAMILIES)
def test_sampler_draws_two_thousand_distinct_valid_specs_without_building(family, monkeypatch):
    real_family = registry.family

    def no_build(spec):
        raise AssertionError("the sampler must not build models")

    monkeypatch.setattr(
        registry, "family", lambda name: dataclasses.replace(real_family(name), build=no_build)
    )
    specs = zoo.sample_specs(family, 2000, seed=7, size="small")
    assert len({s.config_hash() for s in specs}) == 2000
    assert all(s.family == family for s in specs)


@pytest.mark.parametrize("size", zoo.SIZE_CLASSES)
def test_every_size_class_yields_distinct_specs_for_every_family(size):
    for family in zoo.FAMILIES:
        specs = zoo.sample_specs(family, 50, seed=0, size=size)
        assert len({s.config_hash() for s in specs}) == 50


def test_sampler_is_reproducible_and_prefix_stable():
    first = zoo.sample_specs("resnet", 30, seed=3)
    again = zoo.sample_specs("resnet", 30, seed=3)
    longer = zoo.sample_specs("resnet", 60, seed=3)
    assert [s.to_json() for s in first] == [s.to_json() for s in again]
    assert [s.to_json() for s in longer[:30]] == [s.to_json() for s in first]


def test_different_seeds_draw_different_specs():
    a = {s.config_hash() for s in zoo.sample_specs("gpt", 20, seed=1)}
    b = {s.config_hash() for s in zoo.sample_specs("gpt", 20, seed=2)}
    assert a != b


def test_sampled_specs_survive_a_json_round_trip():
    for family in zoo.FAMILIES:
        for spec in zoo.sample_specs(family, 5, seed=11, size="medium"):
            assert zoo.ModelSpec.from_json(spec.to_json()) == spec


def test_larger_size_classes_draw_larger_models_on_average():
    def mean_params(family, size):
        specs = zoo.sample_specs(family, 6, seed=5, size=size)
        return sum(zoo.parameter_count(s) for s in specs) / len(specs)

    for family in ("resnet", "gpt", "llama", "mlp"):
        sizes = [mean_params(family, size) for size in zoo.SIZE_CLASSES]
        assert sizes == sorted(sizes), family


@pytest.mark.parametrize("family", zoo.FAMILIES)
def test_random_tiny_specs_build_and_train_one_step(family):
    rng = random.Random(family)
    specs = zoo.sample_specs(family, 200, seed=rng.randrange(2**31), size="tiny")
    for spec in rng.sample(specs, 3):
        model = zoo.build_model(spec)
        inputs, target = zoo.example_batch(spec, 2)
        loss = zoo.training_loss(spec, model(*inputs), target)
        loss.backward()
        assert loss.dim() == 0
        assert torch.isfinite(loss)


def test_large_llamas_are_billions_of_parameters_at_sequences_to_8k():
    specs = zoo.sample_specs("llama", 40, seed=5, size="large")
    billions = [zoo.parameter_count(s) / 1e9 for s in specs]
    assert min(billions) >= 1 and max(billions) <= 17 and max(billions) > 10
    assert {s.input["seq_len"] for s in specs} == {2048, 4096, 8192}
    assert any(s.arch["kv_heads"] < s.arch["heads"] for s in specs)


def test_unknown_size_class_is_rejected():
    with pytest.raises(ValueError, match="size must be one of"):
        zoo.sample_specs("mlp", 3, seed=0, size="huge")  # type: ignore[arg-type]


def test_unknown_family_is_rejected():
    with pytest.raises(zoo.InvalidSpecError, match="unknown family"):
        zoo.sample_specs("alexnet", 3, seed=0)


def test_asking_for_more_specs_than_the_space_holds_raises(monkeypatch):
    fixed = zoo.standard_spec("mlp-mnist")
    real_family = registry.family

    def one_spec_family(name):
        return dataclasses.replace(real_family(name), sample=lambda rng, size: fixed)

    monkeypatch.setattr(registry, "family", one_spec_family)
    assert zoo.sample_specs("mlp", 1, seed=0) == [fixed]
    with pytest.raises(zoo.SamplerExhaustedError, match="only 1 distinct mlp specs"):
        zoo.sample_specs("mlp", 2, seed=0)
