"""The step-time scaling law and the slowdown on a slice it implies."""

from __future__ import annotations

import pytest

from kubeseer.hardware import mig, scaling

LAW = scaling.Coefficients(
    compute=2.0, memory=1.5, per_kernel_s=1e-5, fixed_s=1e-3, fitted_on="test"
)
WHOLE = mig.device("H100-SXM5-80GB")


def test_step_time_adds_compute_memory_and_fixed_terms():
    work = scaling.Work(flops=989.5e12, bytes=3350e9, kernels=100, precision="fp16")
    # one second of each at peak, weighted by the coefficients, plus launches and fixed cost
    assert scaling.step_time(WHOLE, work, LAW) == pytest.approx(2.0 + 1.5 + 1e-3 + 1e-3)


def test_a_compute_bound_job_slows_by_the_inverse_sm_share():
    work = scaling.Work(flops=1e15, bytes=0, kernels=0, precision="fp16")
    part = mig.device("H100-SXM5-80GB", "3g.40gb")
    law = scaling.Coefficients(
        compute=2.0, memory=1.5, per_kernel_s=0.0, fixed_s=0.0, fitted_on="test"
    )
    assert scaling.slowdown(WHOLE, part, work, law) == pytest.approx(132 / 60)


def test_a_memory_bound_job_slows_by_the_inverse_memory_slice_share():
    work = scaling.Work(flops=0, bytes=1e12, kernels=0, precision="fp16")
    part = mig.device("H100-SXM5-80GB", "1g.10gb")
    law = scaling.Coefficients(
        compute=2.0, memory=1.5, per_kernel_s=0.0, fixed_s=0.0, fitted_on="test"
    )
    assert scaling.slowdown(WHOLE, part, work, law) == pytest.approx(8.0)


def test_a_job_of_mostly_fixed_cost_barely_slows_down():
    work = scaling.Work(flops=1e9, bytes=1e6, kernels=300, precision="fp16")
    part = mig.device("H100-SXM5-80GB", "1g.10gb")
    assert 1.0 <= scaling.slowdown(WHOLE, part, work, LAW) < 1.05


def test_slowdown_needs_a_part_of_the_same_gpu():
    with pytest.raises(ValueError, match="not a part of"):
        scaling.slowdown(
            WHOLE, mig.device("A100-SXM4-40GB", "1g.5gb"), scaling.Work(1, 1, 1, "fp16")
        )


def test_negative_work_is_refused():
    with pytest.raises(ValueError, match="non-negative"):
        scaling.Work(flops=-1, bytes=0, kernels=0, precision="fp16")


def test_the_fitted_law_puts_a_large_training_step_between_the_sm_and_bandwidth_shares():
    # ResNet-50-sized training step at batch 256: ~3 x 4.1 GFLOPs x 2 per image, a few GB moved.
    work = scaling.Work(flops=6.3e12, bytes=60e9, kernels=600, precision="fp16", mode="train")
    part = mig.device("A100-SXM4-80GB", "3g.40gb")
    factor = scaling.slowdown(mig.device("A100-SXM4-80GB"), part, work)
    # 3g.40gb has 42 of 108 SMs (2.57x fewer) and 4 of 8 memory slices (2x fewer); the fixed
    # cost per step does not slow down, so the factor is below the larger of the two.
    assert 1.5 < factor < 108 / 42


def test_a_batch_one_inference_barely_notices_a_small_slice():
    work = scaling.Work(flops=8e9, bytes=2e8, kernels=200, precision="fp16")
    part = mig.device("H100-SXM5-80GB", "1g.10gb")
    assert scaling.slowdown(WHOLE, part, work) < 1.5


def test_every_mode_has_fitted_coefficients_with_a_source():
    assert set(scaling.FITTED) == {"infer", "train"}
    for coefficients in scaling.FITTED.values():
        assert coefficients.compute > 0 and coefficients.memory > 0
        assert "bench/gpu_step_time.py" in coefficients.fitted_on
