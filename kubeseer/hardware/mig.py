"""MIG profiles as devices: SMs, usable memory, and their share of bandwidth and L2.

A MIG GPU instance owns whole *compute slices* (SMs) and whole *memory slices*; each memory
slice is one eighth of the GPU's memory controllers and L2 (MIG user guide), so an instance's
DRAM bandwidth and L2 are its memory slices over eight of the GPU's. SM counts and usable memory
are the `nvidia-smi mig -lgip` figures that `kubeseer.placement.catalogue` also holds (a test
keeps the two tables equal); the H100 PCIe and H200 rows the catalogue marks derived are derived
here the same way.

`device(gpu, profile)` is what the predictor and the slowdown model take: a whole GPU and a
slice look the same, a `Device` with SMs, memory, bandwidth, L2 and peak FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from kubeseer.hardware import gpus

__all__ = ["PROFILES", "Device", "MigProfile", "UnknownProfileError", "device", "profiles_of"]

GIB: Final = 1 << 30
COMPUTE_SLICES: Final = 7
MEMORY_SLICES: Final = 8


class UnknownProfileError(KeyError):
    """A MIG profile the named GPU does not offer."""


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of one GPU.

    Attributes:
        gpu_key: the `gpus.GPUS` row it partitions.
        name: `1g.10gb` etc.; compute_slices of 7, memory_slices of 8.
        sms: SMs of the instance; usable_memory_bytes: what a CUDA process can allocate.
        source: `mig-lgip`, or `derived` with the reason in `note`.
    """

    gpu_key: str
    name: str
    compute_slices: int
    memory_slices: int
    sms: int
    usable_memory_bytes: int
    source: str
    note: str = ""

    @property
    def bandwidth_share(self) -> float:
        """Share of the GPU's DRAM bandwidth (memory slices / 8)."""
        return self.memory_slices / MEMORY_SLICES

    @property
    def l2_share(self) -> float:
        """Share of the GPU's L2 (memory slices / 8)."""
        return self.memory_slices / MEMORY_SLICES


@dataclass(frozen=True)
class Device:
    """What a job runs on: a whole GPU (`profile` None) or one MIG instance of it."""

    gpu: gpus.GpuSpec
    profile: str | None
    sms: int
    memory_bytes: int
    memory_bandwidth: float
    l2_bytes: int

    @property
    def sm_share(self) -> float:
        """SMs of this device over the whole GPU's."""
        return self.sms / self.gpu.sms

    @property
    def name(self) -> str:
        """`H100-SXM5-80GB` or `H100-SXM5-80GB/1g.10gb`."""
        return self.gpu.key if self.profile is None else f"{self.gpu.key}/{self.profile}"

    def peak_flops(self, precision: gpus.Precision) -> float:
        """Peak FLOP/s of this device's SMs at `precision` (the GPU's, scaled by SMs)."""
        return self.gpu.peak_flops(precision) * self.sm_share


_LGIP = "mig-lgip"

# (name, compute slices, memory slices, usable GiB, SMs), as in nvidia-smi mig -lgip.
_A100_40 = (
    ("1g.5gb", 1, 1, 4.75, 14),
    ("1g.10gb", 1, 2, 9.625, 14),
    ("2g.10gb", 2, 2, 9.625, 28),
    ("3g.20gb", 3, 4, 19.5, 42),
    ("4g.20gb", 4, 4, 19.5, 56),
    ("7g.40gb", 7, 8, 39.25, 98),
)
_A100_80 = (
    ("1g.10gb", 1, 1, 9.5, 14),
    ("1g.20gb", 1, 2, 19.5, 14),
    ("2g.20gb", 2, 2, 19.5, 28),
    ("3g.40gb", 3, 4, 39.25, 42),
    ("4g.40gb", 4, 4, 39.25, 56),
    ("7g.80gb", 7, 8, 79.0, 98),
)
_H100_80 = (
    ("1g.10gb", 1, 1, 9.75, 16),
    ("1g.20gb", 1, 2, 19.625, 26),
    ("2g.20gb", 2, 2, 19.625, 32),
    ("3g.40gb", 3, 4, 39.5, 60),
    ("4g.40gb", 4, 4, 39.5, 64),
    ("7g.80gb", 7, 8, 79.25, 132),
)
_H100_NVL = (
    ("1g.12gb", 1, 1, 10.625, 16),
    ("1g.24gb", 1, 2, 21.5, 26),
    ("2g.24gb", 2, 2, 21.5, 32),
    ("3g.47gb", 3, 4, 46.125, 60),
    ("4g.47gb", 4, 4, 46.125, 64),
    ("7g.94gb", 7, 8, 92.625, 132),
)
_H200 = (
    ("1g.18gb", 1, 1, 16.0, 16),
    ("1g.35gb", 1, 2, 32.0, 26),
    ("2g.35gb", 2, 2, 32.0, 32),
    ("3g.71gb", 3, 4, 64.0, 60),
    ("4g.71gb", 4, 4, 64.0, 64),
    ("7g.141gb", 7, 8, 128.0, 132),
)

_H100_PCIE_NOTE = (
    "no -lgip transcript of an H100 PCIe was found: memory as H100 80GB, SMs the H100 SXM "
    "share of 114 (rounded down), as the placement catalogue assumes"
)
_H200_NOTE = (
    "only 1g.18gb is published: k memory slices hold k x 16.00 GiB and SMs are H100 SXM's, as "
    "the placement catalogue assumes"
)


def _rows(
    gpu_key: str,
    shapes: tuple[tuple[str, int, int, float, int], ...],
    *,
    sm_scale: tuple[int, int] | None = None,
    derived_note: str = "",
    published: frozenset[str] = frozenset(),
) -> tuple[MigProfile, ...]:
    rows = []
    for name, compute, memory, gib, sms in shapes:
        derived = bool(derived_note) and name not in published
        count = sms if sm_scale is None else sms * sm_scale[0] // sm_scale[1]
        rows.append(
            MigProfile(
                gpu_key=gpu_key,
                name=name,
                compute_slices=compute,
                memory_slices=memory,
                sms=count,
                usable_memory_bytes=round(gib * GIB),
                source="derived" if derived else _LGIP,
                note=derived_note if derived else "",
            )
        )
    return tuple(rows)


PROFILES: Final[tuple[MigProfile, ...]] = (
    *_rows("A100-SXM4-40GB", _A100_40),
    *_rows("A100-PCIE-40GB", _A100_40),
    *_rows("A100-SXM4-80GB", _A100_80),
    *_rows("A100-PCIE-80GB", _A100_80),
    *_rows("H100-SXM5-80GB", _H100_80),
    *_rows("H100-PCIE-80GB", _H100_80, sm_scale=(114, 132), derived_note=_H100_PCIE_NOTE),
    *_rows("H100-NVL-94GB", _H100_NVL),
    *_rows("H200-SXM-141GB", _H200, derived_note=_H200_NOTE, published=frozenset({"1g.18gb"})),
)
"""Every MIG profile of every MIG-capable GPU in `gpus.GPUS` (media-extension profiles left out,
as in the placement catalogue)."""

_BY_GPU: Final = MappingProxyType(
    {key: tuple(p for p in PROFILES if p.gpu_key == key) for key in {p.gpu_key for p in PROFILES}}
)


def profiles_of(gpu: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of `gpu` (any name `gpus.lookup` accepts); empty if it has no MIG."""
    return _BY_GPU.get(gpus.lookup(gpu).key, ())


def device(gpu: str, profile: str | None = None) -> Device:
    """The device a job gets: the whole of `gpu`, or its MIG `profile` (`1g.10gb`, or the
    resource name `nvidia.com/mig-1g.10gb`).

    Raises:
        gpus.UnknownGpuError: `gpu` is not in the table.
        UnknownProfileError: `gpu` has no such profile.
    """
    spec = gpus.lookup(gpu)
    if profile is None:
        return Device(
            gpu=spec,
            profile=None,
            sms=spec.sms,
            memory_bytes=spec.memory_bytes,
            memory_bandwidth=spec.memory_bandwidth,
            l2_bytes=spec.l2_bytes,
        )
    bare = profile.removeprefix("nvidia.com/mig-")
    for row in _BY_GPU.get(spec.key, ()):
        if row.name == bare:
            return Device(
                gpu=spec,
                profile=row.name,
                sms=row.sms,
                memory_bytes=row.usable_memory_bytes,
                memory_bandwidth=spec.memory_bandwidth * row.bandwidth_share,
                l2_bytes=round(spec.l2_bytes * row.l2_share),
            )
    offered = ", ".join(p.name for p in _BY_GPU.get(spec.key, ())) or "no MIG profiles"
    raise UnknownProfileError(f"{spec.key} has no MIG profile {profile!r}; it offers {offered}")
