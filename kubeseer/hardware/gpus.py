"""Whole-GPU specifications: SMs, clock, peak FLOP/s per precision, bandwidth, L2, memory.

The predictor is device-aware through this table: a GPU without measured labels is predicted
from its specs, and the step-time evidence in `shared/data/public-gpu/` is tied to the GPUs it
was measured on by these rows. Every figure names its public source (`kubeseer.hardware.sources`);
figures computed here rather than published say ``derived``.

Conventions:

* Peak tensor-core figures are **dense** (half of a datasheet's "with sparsity") and, for FP16,
  with **FP32 accumulate**, which is what `torch.autocast` matmuls and convolutions use. GeForce
  cards run FP16 with FP32 accumulate at half their FP16-accumulate rate; data-centre and
  workstation cards at full rate.
* `memory_bytes` is the total a CUDA process sees (`nvidia-smi`), not the marketing size: it is
  what a job's memory target is compared with, and the same figure as the placement catalogue's
  whole-GPU rows for the GPUs both tables hold (a test checks it).
* `tf32_tflops` is what an FP32 matmul or convolution reaches when TF32 is allowed (cuDNN
  convolutions allow it by default in PyTorch, matmuls do not); GPUs without TF32 repeat FP32.

Pure Python (no torch), so `kubeseer.placement` may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from kubeseer.hardware import sources

__all__ = [
    "GPUS",
    "GpuSpec",
    "Precision",
    "UnknownGpuError",
    "by_key",
    "lookup",
]

MIB: Final = 1 << 20

Precision = Literal["fp32", "tf32", "fp16", "bf16"]

FIGURES: Final[tuple[str, ...]] = (
    "sms",
    "boost_clock_mhz",
    "fp32_tflops",
    "tf32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "memory_bandwidth_gbs",
    "l2_mb",
    "memory_bytes",
)
"""The figures every row has, each with a source."""


class UnknownGpuError(KeyError):
    """A GPU name that is neither a table key, an NVML name nor a GFD product label."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown GPU {name!r}: kubeseer's hardware table knows "
            + ", ".join(g.key for g in GPUS)
        )
        self.name = name


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product as the predictor sees it.

    Attributes:
        key: the table's name for it (`H100-SXM5-80GB`).
        names: NVML device names and GFD `nvidia.com/gpu.product` labels that mean this GPU.
        architecture: `ampere`, `hopper`, ...; compute_capability: `(major, minor)`.
        sms: streaming multiprocessors; boost_clock_mhz: the clock the peaks are quoted at.
        fp32_tflops ... bf16_tflops: peak dense TFLOP/s (see the module docstring).
        memory_bandwidth_gbs: DRAM bandwidth in GB/s (10^9 bytes per second).
        l2_mb: L2 cache in MB (as NVIDIA quotes it, 2^20 bytes).
        memory_bytes: total device memory a CUDA process sees.
        sources: for each of `FIGURES`, the key of its `sources.SOURCES` entry.
    """

    key: str
    names: tuple[str, ...]
    architecture: str
    compute_capability: tuple[int, int]
    sms: int
    boost_clock_mhz: int
    fp32_tflops: float
    tf32_tflops: float
    fp16_tflops: float
    bf16_tflops: float
    memory_bandwidth_gbs: float
    l2_mb: float
    memory_bytes: int
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [f for f in FIGURES if f not in self.sources]
        if missing:
            raise ValueError(f"{self.key}: figures without a source: {missing}")
        for name, key in self.sources.items():
            sources.cite(key)
            if name not in FIGURES:
                raise ValueError(f"{self.key}: source given for unknown figure {name!r}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def peak_flops(self, precision: Precision) -> float:
        """Peak FLOP/s at `precision` (fp32 on CUDA cores; tf32/fp16/bf16 on tensor cores)."""
        tflops = {
            "fp32": self.fp32_tflops,
            "tf32": self.tf32_tflops,
            "fp16": self.fp16_tflops,
            "bf16": self.bf16_tflops,
        }[precision]
        return tflops * 1e12

    @property
    def memory_bandwidth(self) -> float:
        """DRAM bandwidth in bytes per second."""
        return self.memory_bandwidth_gbs * 1e9

    @property
    def l2_bytes(self) -> int:
        """L2 cache in bytes."""
        return round(self.l2_mb * MIB)

    def ridge_point(self, precision: Precision) -> float:
        """FLOPs per DRAM byte above which a kernel is compute-bound (the roofline's knee)."""
        return self.peak_flops(precision) / self.memory_bandwidth


def _src(default: str, **overrides: str) -> dict[str, str]:
    table = dict.fromkeys(FIGURES, default)
    table["memory_bytes"] = "nvidia-smi"
    table.update(overrides)
    return table


_A100_SOURCES = _src(
    "a100-datasheet",
    sms="ampere-whitepaper",
    boost_clock_mhz="ampere-whitepaper",
    l2_mb="ampere-whitepaper",
)


def _a100(key: str, names: tuple[str, ...], bandwidth_gbs: float, memory_mib: int) -> GpuSpec:
    """An A100 form factor: every A100 shares the SMs, clock, peaks and L2 of the GA100 die."""
    return GpuSpec(
        key=key,
        names=names,
        architecture="ampere",
        compute_capability=(8, 0),
        sms=108,
        boost_clock_mhz=1410,
        fp32_tflops=19.5,
        tf32_tflops=156.0,
        fp16_tflops=312.0,
        bf16_tflops=312.0,
        memory_bandwidth_gbs=bandwidth_gbs,
        l2_mb=40.0,
        memory_bytes=memory_mib * MIB,
        sources=_A100_SOURCES,
    )


_HOPPER_SOURCES = _src(
    "h100-datasheet",
    sms="hopper-whitepaper",
    boost_clock_mhz="hopper-whitepaper",
    l2_mb="hopper-whitepaper",
)

GPUS: Final[tuple[GpuSpec, ...]] = (
    _a100(
        "A100-SXM4-40GB",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        1555.0,
        40536,
    ),
    _a100("A100-PCIE-40GB", ("NVIDIA A100-PCIE-40GB", "NVIDIA-A100-PCIE-40GB"), 1555.0, 40536),
    _a100(
        "A100-SXM4-80GB",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        2039.0,
        81920,
    ),
    _a100("A100-PCIE-80GB", ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"), 1935.0, 81920),
    GpuSpec(
        key="H100-SXM5-80GB",
        names=("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
        architecture="hopper",
        compute_capability=(9, 0),
        sms=132,
        boost_clock_mhz=1980,
        fp32_tflops=67.0,
        tf32_tflops=494.5,
        fp16_tflops=989.5,
        bf16_tflops=989.5,
        memory_bandwidth_gbs=3350.0,
        l2_mb=50.0,
        memory_bytes=81559 * MIB,
        sources=_HOPPER_SOURCES,
    ),
    GpuSpec(
        key="H100-PCIE-80GB",
        names=("NVIDIA H100 PCIe", "NVIDIA-H100-PCIe"),
        architecture="hopper",
        compute_capability=(9, 0),
        sms=114,
        boost_clock_mhz=1755,
        fp32_tflops=51.0,
        tf32_tflops=378.0,
        fp16_tflops=756.0,
        bf16_tflops=756.0,
        memory_bandwidth_gbs=2000.0,
        l2_mb=50.0,
        memory_bytes=81559 * MIB,
        sources=_HOPPER_SOURCES,
    ),
    GpuSpec(
        key="H100-NVL-94GB",
        names=("NVIDIA H100 NVL", "NVIDIA-H100-NVL"),
        architecture="hopper",
        compute_capability=(9, 0),
        sms=132,
        boost_clock_mhz=1785,
        fp32_tflops=60.0,
        tf32_tflops=417.5,
        fp16_tflops=835.5,
        bf16_tflops=835.5,
        memory_bandwidth_gbs=3900.0,
        l2_mb=50.0,
        memory_bytes=95830 * MIB,
        sources={**_HOPPER_SOURCES, "boost_clock_mhz": "derived"},
    ),
    GpuSpec(
        key="H200-SXM-141GB",
        names=("NVIDIA H200", "NVIDIA-H200", "NVIDIA H200 NVL", "NVIDIA-H200-NVL"),
        architecture="hopper",
        compute_capability=(9, 0),
        sms=132,
        boost_clock_mhz=1980,
        fp32_tflops=67.0,
        tf32_tflops=494.5,
        fp16_tflops=989.5,
        bf16_tflops=989.5,
        memory_bandwidth_gbs=4800.0,
        l2_mb=50.0,
        memory_bytes=143771 * MIB,
        sources=_src(
            "h200-product",
            sms="hopper-whitepaper",
            boost_clock_mhz="hopper-whitepaper",
            l2_mb="hopper-whitepaper",
        ),
    ),
    GpuSpec(
        key="RTX-3090",
        names=("NVIDIA GeForce RTX 3090", "NVIDIA-GeForce-RTX-3090", "rtx3090", "3090"),
        architecture="ampere",
        compute_capability=(8, 6),
        sms=82,
        boost_clock_mhz=1695,
        fp32_tflops=35.6,
        tf32_tflops=35.6,
        fp16_tflops=71.0,
        bf16_tflops=71.0,
        memory_bandwidth_gbs=936.0,
        l2_mb=6.0,
        memory_bytes=24576 * MIB,
        sources=_src("ga102-whitepaper"),
    ),
    GpuSpec(
        key="RTX-4090",
        names=("NVIDIA GeForce RTX 4090", "NVIDIA-GeForce-RTX-4090", "rtx4090", "4090"),
        architecture="ada",
        compute_capability=(8, 9),
        sms=128,
        boost_clock_mhz=2520,
        fp32_tflops=82.6,
        tf32_tflops=82.6,
        fp16_tflops=165.2,
        bf16_tflops=165.2,
        memory_bandwidth_gbs=1008.0,
        l2_mb=72.0,
        memory_bytes=24564 * MIB,
        sources=_src("ada-whitepaper"),
    ),
    GpuSpec(
        key="RTX-5090",
        names=("NVIDIA GeForce RTX 5090", "NVIDIA-GeForce-RTX-5090", "5090"),
        architecture="blackwell",
        compute_capability=(12, 0),
        sms=170,
        boost_clock_mhz=2407,
        fp32_tflops=104.8,
        tf32_tflops=104.8,
        fp16_tflops=209.5,
        bf16_tflops=209.5,
        memory_bandwidth_gbs=1792.0,
        l2_mb=96.0,
        memory_bytes=32607 * MIB,
        sources=_src("blackwell-rtx-whitepaper"),
    ),
    GpuSpec(
        key="RTX-PRO-6000-MAXQ",
        names=(
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
            "pro6000maxq",
        ),
        architecture="blackwell",
        compute_capability=(12, 0),
        sms=188,
        boost_clock_mhz=2288,
        fp32_tflops=110.1,
        tf32_tflops=110.1,
        # Workstation cards accumulate FP16 in FP32 at full rate: 4 x the FP32 rate per SM, as
        # on the 600 W edition (500 dense at 2617 MHz), scaled to the Max-Q boost clock.
        fp16_tflops=437.2,
        bf16_tflops=437.2,
        memory_bandwidth_gbs=1792.0,
        l2_mb=128.0,
        memory_bytes=97887 * MIB,
        sources=_src(
            "rtx-pro-6000-maxq",
            fp16_tflops="derived",
            bf16_tflops="derived",
            tf32_tflops="derived",
            memory_bytes="derived",
        ),
    ),
    GpuSpec(
        key="V100-PCIE-32GB",
        names=("Tesla V100-PCIE-32GB", "Tesla-V100-PCIE-32GB"),
        architecture="volta",
        compute_capability=(7, 0),
        sms=80,
        boost_clock_mhz=1380,
        fp32_tflops=14.0,
        tf32_tflops=14.0,
        fp16_tflops=112.0,
        bf16_tflops=14.0,
        memory_bandwidth_gbs=900.0,
        l2_mb=6.0,
        memory_bytes=32510 * MIB,
        sources=_src("v100-datasheet", bf16_tflops="derived", memory_bytes="derived"),
    ),
    GpuSpec(
        key="T4",
        names=("Tesla T4", "Tesla-T4"),
        architecture="turing",
        compute_capability=(7, 5),
        sms=40,
        boost_clock_mhz=1590,
        fp32_tflops=8.1,
        tf32_tflops=8.1,
        fp16_tflops=65.0,
        bf16_tflops=8.1,
        memory_bandwidth_gbs=320.0,
        l2_mb=4.0,
        memory_bytes=15360 * MIB,
        sources=_src("t4-datasheet", bf16_tflops="derived", memory_bytes="derived"),
    ),
    GpuSpec(
        key="P100-PCIE-16GB",
        names=("Tesla P100-PCIE-16GB", "Tesla-P100-PCIE-16GB"),
        architecture="pascal",
        compute_capability=(6, 0),
        sms=56,
        boost_clock_mhz=1329,
        fp32_tflops=9.3,
        tf32_tflops=9.3,
        fp16_tflops=18.7,
        bf16_tflops=9.3,
        memory_bandwidth_gbs=732.0,
        l2_mb=4.0,
        memory_bytes=16280 * MIB,
        sources=_src("pascal-datasheets", bf16_tflops="derived", memory_bytes="derived"),
    ),
    GpuSpec(
        key="P4",
        names=("Tesla P4", "Tesla-P4"),
        architecture="pascal",
        compute_capability=(6, 1),
        sms=20,
        boost_clock_mhz=1063,
        fp32_tflops=5.5,
        tf32_tflops=5.5,
        fp16_tflops=5.5,
        bf16_tflops=5.5,
        memory_bandwidth_gbs=192.0,
        l2_mb=2.0,
        memory_bytes=7611 * MIB,
        sources=_src(
            "pascal-datasheets",
            fp16_tflops="derived",
            bf16_tflops="derived",
            tf32_tflops="derived",
            memory_bytes="derived",
        ),
    ),
    GpuSpec(
        key="L4",
        names=("NVIDIA L4", "NVIDIA-L4"),
        architecture="ada",
        compute_capability=(8, 9),
        sms=58,
        boost_clock_mhz=2040,
        fp32_tflops=30.3,
        tf32_tflops=60.0,
        fp16_tflops=121.0,
        bf16_tflops=121.0,
        memory_bandwidth_gbs=300.0,
        l2_mb=48.0,
        memory_bytes=23034 * MIB,
        sources=_src("l4-datasheet", memory_bytes="derived"),
    ),
)
"""Every GPU the predictor knows, data-centre first."""

_BY_KEY: Final = MappingProxyType({g.key.lower(): g for g in GPUS})
_BY_NAME: Final = MappingProxyType({n.lower(): g for g in GPUS for n in g.names})

# The placement catalogue groups form factors under one key; step time needs the slower one
# when the label does not say (`A100-80GB` could be SXM at 2039 GB/s or PCIe at 1935).
_CATALOGUE_KEYS: Final = MappingProxyType(
    {
        "a100-40gb": "A100-SXM4-40GB",
        "a100-80gb": "A100-PCIE-80GB",
        "h100-80gb-sxm": "H100-SXM5-80GB",
        "h100-80gb-pcie": "H100-PCIE-80GB",
        "h100-nvl": "H100-NVL-94GB",
        "h200-141gb": "H200-SXM-141GB",
    }
)


def by_key(key: str) -> GpuSpec:
    """The row whose `key` is `key`, case-insensitively.

    Raises:
        UnknownGpuError: no such key.
    """
    try:
        return _BY_KEY[key.lower()]
    except KeyError:
        raise UnknownGpuError(key) from None


def lookup(name: str) -> GpuSpec:
    """The row for a table key, an NVML device name, a GFD product label or a catalogue key.

    A placement catalogue key that covers several form factors (`A100-80GB`) resolves to the one
    with the lower bandwidth, so a step-time figure derived from it is never optimistic.

    Raises:
        UnknownGpuError: none of those.
    """
    lowered = name.strip().lower()
    for table in (_BY_KEY, _BY_NAME):
        if lowered in table:
            return table[lowered]
    if lowered in _CATALOGUE_KEYS:
        return _BY_KEY[_CATALOGUE_KEYS[lowered].lower()]
    raise UnknownGpuError(name)
