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


def _with_work(pred, flops: float, bytes_moved: float):
    from dataclasses import replace

    from kubeseer.prediction import StepWork

    return replace(pred, work=StepWork(flops=flops, bytes_moved=bytes_moved, kernels=100))


def test_the_steps_work_gives_the_scaling_laws_slice_over_whole_step_time():
    from kubeseer.hardware import scaling

    pred = _with_work(
        unlearned_prediction(upper_bytes=GIB, label_device="NVIDIA H100 80GB HBM3"),
        flops=4e13,
        bytes_moved=2e11,
    )
    made = slowdown.from_work(pred, device(H100, "3g.40gb"))
    law = scaling.FITTED["infer"]

    def seconds(sms: int, bandwidth_share: float) -> float:
        # t = c_f F / P + c_b B / W + c_k K + c_0, P and W the device's share of the H100's.
        peak = 67.0e12 * sms / 132
        bandwidth = 3350e9 * bandwidth_share
        return (
            law.compute * 4e13 / peak
            + law.memory * 2e11 / bandwidth
            + law.per_kernel_s * 100
            + law.fixed_s
        )

    assert made.evidence is slowdown.Evidence.DERIVED
    assert made.factor == pytest.approx(seconds(60, 4 / 8) / seconds(132, 1.0))
    assert "scaling law" in made.basis
    assert slowdown.from_work(pred, device(H100, None)).factor == pytest.approx(1.0)


def test_a_step_of_little_work_is_barely_slower_on_a_small_slice():
    pred = _with_work(shipped_prediction(upper_bytes=GIB), flops=1e8, bytes_moved=1e6)
    made = slowdown.from_work(pred, device(A100_40, "1g.5gb"))
    assert made.factor is not None and 1.0 <= made.factor < 1.05


def test_without_the_steps_work_there_is_no_derived_slowdown():
    made = slowdown.from_work(shipped_prediction(upper_bytes=GIB), device(H100, "1g.10gb"))
    assert made.factor is None and made.evidence is slowdown.Evidence.NONE


def test_the_default_model_prefers_learned_utilisation_then_the_work_then_nothing():
    learned = _with_work(
        prediction(upper_bytes=GIB, sm_util=50, label_device="NVIDIA H100 80GB HBM3"),
        flops=4e13,
        bytes_moved=2e11,
    )
    on_slice = device(H100, "2g.20gb")
    assert slowdown.from_evidence(learned, on_slice) == slowdown.from_utilisation(learned, on_slice)
    derived = _with_work(shipped_prediction(upper_bytes=GIB), flops=4e13, bytes_moved=2e11)
    assert slowdown.from_evidence(derived, on_slice) == slowdown.from_work(derived, on_slice)
    assert slowdown.from_evidence(derived, on_slice).evidence is slowdown.Evidence.DERIVED
    bare = shipped_prediction(upper_bytes=GIB)
    assert slowdown.from_evidence(bare, on_slice).evidence is slowdown.Evidence.NONE
