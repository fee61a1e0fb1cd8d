"""The hardware table: every figure sourced, internally consistent, and equal to the placement
catalogue wherever both hold a figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeseer.hardware import gpus, mig, sources
from kubeseer.placement import catalogue

NEUSIGHT = Path(__file__).parents[4] / "shared/data/public-gpu/neusight/device_configs"


def test_every_figure_of_every_gpu_names_a_known_source():
    for gpu in gpus.GPUS:
        assert set(gpu.sources) == set(gpus.FIGURES), gpu.key
        for key in gpu.sources.values():
            assert sources.cite(key).url


def test_a_row_without_a_source_for_a_figure_is_refused():
    with pytest.raises(ValueError, match="without a source"):
        gpus.GpuSpec(
            key="X", names=(), architecture="a", compute_capability=(1, 0), sms=1,
            boost_clock_mhz=1, fp32_tflops=1, tf32_tflops=1, fp16_tflops=1, bf16_tflops=1,
            memory_bandwidth_gbs=1, l2_mb=1, memory_bytes=1, sources={"sms": "derived"},
        )  # fmt: skip


@pytest.mark.parametrize("gpu", gpus.GPUS, ids=lambda g: g.key)
def test_fp32_peak_matches_sms_times_clock(gpu):
    # 2 FLOPs per FMA x FP32 lanes per SM (64 on GA100/GP100/GV100/TU104, 128 elsewhere).
    lanes = (
        64
        if gpu.architecture in ("volta", "turing") or gpu.key.startswith(("A100", "P100"))
        else 128
    )
    derived = gpu.sms * lanes * 2 * gpu.boost_clock_mhz * 1e6 / 1e12
    assert gpu.fp32_tflops == pytest.approx(derived, rel=0.03), gpu.key


def test_lookup_accepts_keys_nvml_names_product_labels_and_catalogue_keys():
    assert gpus.lookup("NVIDIA H100 80GB HBM3").key == "H100-SXM5-80GB"
    assert gpus.lookup("nvidia-h100-80gb-hbm3").key == "H100-SXM5-80GB"
    assert gpus.lookup("rtx3090").key == "RTX-3090"
    # A catalogue key covering two form factors resolves to the slower one.
    assert gpus.lookup("A100-80GB").memory_bandwidth_gbs == 1935.0
    with pytest.raises(gpus.UnknownGpuError, match="H100-SXM5-80GB"):
        gpus.lookup("Voodoo 2")


def test_whole_gpu_memory_and_sms_equal_the_placement_catalogue():
    for model in catalogue.MODELS:
        for label in model.product_labels:
            spec = gpus.lookup(label)
            assert spec.sms == model.sms, label
            assert spec.memory_bytes == model.whole.usable_memory_bytes, label


def test_every_catalogue_mig_profile_has_the_same_sms_and_memory_here():
    for model in catalogue.MODELS:
        for label in model.product_labels:
            spec = gpus.lookup(label)
            for profile in model.profiles:
                assert profile.name is not None
                here = mig.device(spec.key, profile.name)
                assert here.memory_bytes == profile.usable_memory_bytes, (label, profile.name)
                assert here.sm_share == pytest.approx(profile.compute_share, abs=0.01), (
                    label,
                    profile.name,
                )
                if profile.sms is not None:
                    assert here.sms == profile.sms


def test_a_slice_gets_its_memory_slices_share_of_bandwidth_and_l2():
    whole = mig.device("H100-SXM5-80GB")
    slice_ = mig.device("H100-SXM5-80GB", "nvidia.com/mig-3g.40gb")
    assert slice_.memory_bandwidth == pytest.approx(whole.memory_bandwidth * 4 / 8)
    assert slice_.l2_bytes == pytest.approx(whole.l2_bytes * 4 / 8, abs=1)
    assert slice_.peak_flops("fp16") == pytest.approx(whole.peak_flops("fp16") * 60 / 132)
    assert slice_.name == "H100-SXM5-80GB/3g.40gb"


def test_unknown_profile_names_the_offered_ones():
    with pytest.raises(mig.UnknownProfileError, match=r"1g\.5gb"):
        mig.device("A100-SXM4-40GB", "1g.80gb")
    with pytest.raises(mig.UnknownProfileError, match="no MIG profiles"):
        mig.device("RTX-4090", "1g.5gb")


def test_derived_mig_rows_say_why():
    for row in mig.PROFILES:
        assert (row.source == "derived") == bool(row.note), (row.gpu_key, row.name)


@pytest.mark.skipif(not NEUSIGHT.is_dir(), reason="shared public GPU data not beside the checkout")
def test_neusight_device_configs_agree_on_bandwidth_within_a_tenth():
    # NeuSight lists its own figures; the datasheets may differ (H100 3430 vs 3350 GB/s) but
    # not by more than a tenth, else one of the two names a different product.
    for path in NEUSIGHT.glob("*.json"):
        if path.stem.endswith("_TP"):
            continue
        config = json.loads(path.read_text())
        spec = gpus.lookup(config["Device"])
        assert config["Mem_Bw"] == pytest.approx(spec.memory_bandwidth_gbs, rel=0.1), path.name
