from __future__ import annotations

import pytest
from placement_cases import GIB, prediction, shipped_prediction, unlearned_prediction

from kubeseer.placement import catalogue, slowdown

H100 = catalogue.model_by_key("H100-80GB-SXM")
A100_40 = catalogue.model_by_key("A100-40GB")


def device(model: catalogue.GpuModel, profile: str | None) -> slowdown.Device:
    chosen = model.whole if profile is None else model.profile(profile)
    return slowdown.Device(model, chosen, chosen.compute_share)


def test_utilisation_factor_is_sm_demand_over_compute_share_never_below_one():
    assert slowdown.utilisation_factor(0.5, 25) == 1.0
    assert slowdown.utilisation_factor(0.25, 50) == pytest.approx(2.0)
    assert slowdown.utilisation_factor(0.1, 150) == pytest.approx(10.0)  # clamps at 100 %
    assert slowdown.required_compute_share(60, 2.0) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        slowdown.utilisation_factor(0.0, 10)


def test_the_shipped_checkpoints_stand_in_utilisation_is_no_evidence():
    # CPU labels and 100 % "utilisation": nothing is known about SMs.
    made = slowdown.from_utilisation(shipped_prediction(upper_bytes=GIB), device(H100, "1g.10gb"))
    assert made.factor is None and made.evidence is slowdown.Evidence.NONE
    assert "AMD EPYC, not a GPU" in made.basis
    assert made.within(1.0)


def test_a_stand_in_on_a_gpu_labelled_checkpoint_is_no_evidence_either():
    pred = unlearned_prediction(upper_bytes=GIB, label_device="NVIDIA H100 80GB HBM3")
    made = slowdown.from_utilisation(pred, device(H100, "1g.10gb"))
    assert made.evidence is slowdown.Evidence.NONE
    assert "no SM utilisation labels" in made.basis


def test_utilisation_learned_on_the_same_gpu_is_learned_and_on_another_derived():
    pred = prediction(upper_bytes=GIB, sm_util=50, label_device="NVIDIA H100 80GB HBM3")
    same = slowdown.from_utilisation(pred, device(H100, "2g.20gb"))
    assert same.evidence is slowdown.Evidence.LEARNED
    assert same.factor == pytest.approx(0.5 / (32 / 132))
    other = slowdown.from_utilisation(pred, device(A100_40, "2g.10gb"))
    assert other.evidence is slowdown.Evidence.DERIVED
    assert other.factor == pytest.approx(0.5 / (28 / 108))
    assert "assumed to carry over to A100-40GB" in other.basis
    whole = slowdown.from_utilisation(pred, device(A100_40, None))
    assert whole.factor == 1.0


def test_a_slowdown_has_a_factor_exactly_when_it_has_evidence():
    with pytest.raises(ValueError):
        slowdown.Slowdown(None, slowdown.Evidence.LEARNED, "")
    with pytest.raises(ValueError):
        slowdown.Slowdown(1.5, slowdown.Evidence.NONE, "")
    with pytest.raises(ValueError):
        slowdown.Slowdown(0.5, slowdown.Evidence.DERIVED, "")
    assert not slowdown.Slowdown(2.5, slowdown.Evidence.DERIVED, "").within(2.0)


def test_label_devices_are_found_by_key_label_or_nvml_name_and_cpus_are_not():
    assert catalogue.find_model("A100-80GB") is catalogue.model_by_key("A100-80GB")
    assert catalogue.find_model("NVIDIA-H100-80GB-HBM3") is H100
    assert catalogue.find_model("NVIDIA H100 80GB HBM3") is H100
    assert catalogue.find_model("AMD EPYC") is None
    assert catalogue.find_model("Tesla T4") is None
