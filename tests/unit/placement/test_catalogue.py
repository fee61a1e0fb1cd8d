from __future__ import annotations

import pytest

from kubeseer.placement import catalogue

GIB = catalogue.GIB


@pytest.mark.parametrize(
    ("label", "key", "profile"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB", None),
        ("NVIDIA-A100-PCIE-40GB", "A100-40GB", None),
        ("A100-SXM4-40GB", "A100-40GB", None),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB", None),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB", None),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB-SXM", None),
        ("NVIDIA-H100-PCIe", "H100-80GB-PCIe", None),
        ("NVIDIA-H100-NVL", "H100-NVL", None),
        ("NVIDIA-H200", "H200-141GB", None),
        ("NVIDIA-H200-NVL", "H200-141GB", None),
        ("A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB", "1g.5gb"),
        ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", "H100-80GB-SXM", "3g.40gb"),
        ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-80GB", None),
    ],
)
def test_product_labels_map_to_catalogue_entries(label, key, profile):
    model, single = catalogue.parse_product_label(label)
    assert model.key == key
    assert (single.name if single else None) == profile


def test_unknown_product_label_names_the_label_and_the_known_gpus():
    with pytest.raises(catalogue.UnknownProductError, match=r"'Tesla-T4'.*A100-40GB.*H200-141GB"):
        catalogue.parse_product_label("Tesla-T4")


def test_single_strategy_label_with_a_profile_the_gpu_lacks_is_an_error():
    with pytest.raises(
        catalogue.UnknownProfileError, match=r"A100-40GB has no MIG profile .1g\.20gb"
    ):
        catalogue.parse_product_label("NVIDIA-A100-SXM4-40GB-MIG-1g.20gb")


def test_user_product_names_accept_keys_and_labels_case_insensitively():
    assert catalogue.resolve_product("h100-nvl").key == "H100-NVL"
    assert catalogue.resolve_product("nvidia-h100-80gb-hbm3").key == "H100-80GB-SXM"
    with pytest.raises(catalogue.UnknownProductError):
        catalogue.resolve_product("B200")


@pytest.mark.parametrize("model", catalogue.MODELS, ids=lambda m: m.key)
def test_usable_memory_is_below_the_nominal_name_and_grows_with_memory_slices(model):
    for profile in model.profiles:
        assert profile.usable_memory_bytes < profile.nominal_memory_bytes
        assert profile.resource_name == f"nvidia.com/mig-{profile.name}"
        assert 1 <= profile.compute_slices <= 7
        assert 1 <= profile.memory_slices <= 8
    by_slices = sorted(model.profiles, key=lambda p: p.memory_slices)
    memories = [p.usable_memory_bytes for p in by_slices]
    assert memories == sorted(memories)
    # A k-memory-slice profile holds at least k times a 1-slice profile (shared overhead).
    one = min(p.usable_memory_bytes for p in model.profiles if p.memory_slices == 1)
    for profile in model.profiles:
        assert profile.usable_memory_bytes >= profile.memory_slices * one
    assert model.whole.usable_memory_bytes > max(memories)
    assert model.whole.resource_name == "nvidia.com/gpu"


@pytest.mark.parametrize("model", catalogue.MODELS, ids=lambda m: m.key)
def test_compute_share_grows_with_compute_slices_and_whole_gpu_has_all(model):
    shares = [p.compute_share for p in sorted(model.profiles, key=lambda p: p.compute_slices)]
    assert shares == sorted(shares)
    assert all(0 < s <= 1 for s in shares)
    assert model.whole.compute_share == 1.0


def test_published_figures_for_h100_and_a100_are_the_lgip_values():
    h100 = catalogue.model_by_key("H100-80GB-SXM")
    assert h100.profile("1g.10gb").usable_memory_bytes == 9.75 * GIB
    assert h100.profile("nvidia.com/mig-1g.10gb").compute_share == pytest.approx(16 / 132)
    a100 = catalogue.model_by_key("A100-40GB")
    assert a100.profile("1g.5gb").usable_memory_bytes == 4.75 * GIB
    # 7g.40gb exposes 98 of the 108 SMs: a MIG "full" slice is not a whole GPU.
    assert a100.profile("7g.40gb").compute_share == pytest.approx(98 / 108)
    assert a100.whole.usable_memory_bytes == 40536 * catalogue.MIB


def test_unknown_profile_lists_what_the_gpu_offers():
    with pytest.raises(catalogue.UnknownProfileError, match=r"1g\.5gb, 1g\.10gb, 2g\.10gb"):
        catalogue.model_by_key("A100-40GB").profile("2g.20gb")
