"""Whole GPUs and MIG profiles that kubeseer can place a job on, with the memory a job can use.

Profile names carry a *nominal* size (`1g.10gb`) that is larger than what a CUDA process can
allocate inside the slice (an H100-80GB `1g.10gb` holds 9.75 GiB). Placement compares the
predicted upper bound against the usable figure, never against the name, so this table is the
single place those figures live.

Sources, per figure (details and the full table in docs/placement.md):

* Usable memory of a MIG profile: the `Memory (GiB)` column of `nvidia-smi mig -lgip` as
  published in public transcripts for each GPU. Where driver releases disagree (A100: 9.62 vs
  9.75 GiB for 2g.10gb) we keep the *smaller* figure, because overstating memory causes OOMs
  while understating it only costs a slightly larger slice.
* Usable memory of a whole GPU: the total that `nvidia-smi` reports (e.g. 81559 MiB for
  H100 80GB HBM3), which is the same quantity NVML reports and the predictor's memory target
  (docs/dataset.md) is measured against.
* SM counts per profile: the `SM` column of the same `-lgip` transcripts; GPU SM counts from
  NVIDIA's product pages (A100 108, H100 SXM/NVL/H200 132, H100 PCIe 114).
* Slice shapes (compute slices of 7, memory slices of 8): the MIG user guide's "Supported MIG
  Profiles" tables and mig-parted's `config-default.yaml`.
* Figures marked ``derived`` are not published for that GPU and are conservative estimates
  (documented in docs/placement.md). Node labels written by GPU Feature Discovery override them
  at inventory time, see `kubeseer.placement.inventory`.

Media-extension profiles (`1g.10gb+me`) are left out on purpose: there is at most one per GPU
and it exists for video decode, so a memory-driven policy should never consume it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "MODELS",
    "CatalogueError",
    "GpuModel",
    "Profile",
    "UnknownProductError",
    "UnknownProfileError",
    "find_model",
    "model_by_key",
    "parse_product_label",
    "resolve_product",
]

MIB = 1 << 20
GIB = 1 << 30

GPU_RESOURCE = "nvidia.com/gpu"
"""The device plugin's resource for a whole GPU (or, under MIG strategy `single`, one slice)."""

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""Prefix of the per-profile resources the device plugin advertises under MIG strategy `mixed`."""

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


class CatalogueError(ValueError):
    """A GPU product or MIG profile that the catalogue cannot interpret."""


class UnknownProductError(CatalogueError):
    """A `nvidia.com/gpu.product` value (or a `gpuProducts` entry) that names no known GPU."""

    def __init__(self, product: str) -> None:
        known = ", ".join(m.key for m in MODELS)
        super().__init__(
            f"unknown GPU product {product!r}: kubeseer knows {known} "
            "(by catalogue key or by their nvidia.com/gpu.product label values)"
        )
        self.product = product


class UnknownProfileError(CatalogueError):
    """A MIG profile name that the given GPU does not offer."""

    def __init__(self, profile: str, model: GpuModel) -> None:
        names = ", ".join(p.label for p in model.profiles)
        super().__init__(f"{model.key} has no MIG profile {profile!r}; it offers {names}")
        self.profile = profile
        self.model_key = model.key


@dataclass(frozen=True)
class Profile:
    """One way to hand a job part (or all) of a GPU.

    `name` is the MIG profile (`3g.40gb`), or None for the whole GPU without MIG.
    `compute_share` is SMs of the profile over SMs of the GPU; `sms` is None where no SM count
    is published and the share is taken from a sibling GPU (see `source`).
    """

    name: str | None
    compute_slices: int
    memory_slices: int
    usable_memory_bytes: int
    compute_share: float
    sms: int | None
    source: str

    def __post_init__(self) -> None:
        if not 0 < self.compute_share <= 1:
            raise CatalogueError(f"compute share {self.compute_share} of {self.name} not in (0, 1]")
        if self.usable_memory_bytes <= 0:
            raise CatalogueError(f"usable memory of {self.name} must be positive")

    @property
    def is_whole_gpu(self) -> bool:
        """True for a GPU handed out without MIG."""
        return self.name is None

    @property
    def resource_name(self) -> str:
        """The extended resource a pod requests under MIG strategy `mixed` (or a whole GPU)."""
        return GPU_RESOURCE if self.name is None else MIG_RESOURCE_PREFIX + self.name

    @property
    def label(self) -> str:
        """Human name used in reasons and status: the profile, or `whole GPU`."""
        return "whole GPU" if self.name is None else self.name

    @property
    def share_held(self) -> float:
        """The part of its GPU this takes out of use: the scarcer of compute and memory slices.

        A `1g.20gb` runs on 1 of 7 compute slices but holds 2 of 8 memory slices, so it keeps a
        quarter of the GPU's memory from other jobs: 0.25. A whole GPU (and `7g`) hold 1.
        """
        if self.name is None:
            return 1.0
        return max(self.compute_slices / COMPUTE_SLICES, self.memory_slices / MEMORY_SLICES)

    @property
    def nominal_memory_bytes(self) -> int:
        """The size written in the profile's name (`10gb` -> 10 GiB), as DIPPM's rule reads it."""
        if self.name is None:
            raise CatalogueError("a whole GPU has no nominal profile size")
        match = _PROFILE_NAME.fullmatch(self.name)
        if match is None:
            raise CatalogueError(f"malformed MIG profile name {self.name!r}")
        return int(match.group(2)) * GIB


_PROFILE_NAME = re.compile(r"(\d)g\.(\d+)gb")


@dataclass(frozen=True)
class GpuModel:
    """A GPU product family as far as placement cares: SMs, memory and MIG profiles.

    `product_labels` are the `nvidia.com/gpu.product` values GPU Feature Discovery writes for
    it (the NVML device name with spaces replaced by dashes); `product_names` are those NVML
    names themselves, in the same order, which NVIDIA's DRA driver publishes as the device
    attribute `productName` (the dash substitution cannot be undone mechanically:
    `NVIDIA A100-SXM4-80GB` and `NVIDIA A100 80GB PCIe` both keep some dashes).
    """

    key: str
    product_labels: tuple[str, ...]
    product_names: tuple[str, ...]
    sms: int
    whole: Profile
    profiles: tuple[Profile, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if len(self.product_names) != len(self.product_labels):
            raise CatalogueError(f"{self.key}: one NVML product name per product label")

    def product_name(self, product_label: str) -> str:
        """The NVML name behind one of this GPU's product labels (`-MIG-`/`-SHARED` ignored)."""
        base = product_label.strip().removesuffix("-SHARED").split("-MIG-", 1)[0].lower()
        for label, name in zip(self.product_labels, self.product_names, strict=True):
            if label.lower() in (base, "nvidia-" + base):
                return name
        raise UnknownProductError(product_label)

    def profile(self, name: str) -> Profile:
        """The MIG profile called `name` (`1g.10gb`, or the resource `nvidia.com/mig-1g.10gb`)."""
        bare = name.removeprefix(MIG_RESOURCE_PREFIX)
        for candidate in self.profiles:
            if candidate.name == bare:
                return candidate
        raise UnknownProfileError(name, self)

    def profile_for_resource(self, resource: str) -> Profile | None:
        """The profile a `nvidia.com/mig-*` resource stands for, or None if not offered here."""
        if not resource.startswith(MIG_RESOURCE_PREFIX):
            return None
        bare = resource.removeprefix(MIG_RESOURCE_PREFIX)
        return next((p for p in self.profiles if p.name == bare), None)


def _mig(
    name: str,
    slices: tuple[int, int],
    usable_gib: float,
    sms: int | None,
    gpu_sms: int,
    source: str,
    *,
    share_from: float | None = None,
) -> Profile:
    """Build a MIG profile from an `nvidia-smi mig -lgip` row (memory in GiB as printed)."""
    share = share_from if share_from is not None else (sms or 0) / gpu_sms
    return Profile(
        name=name,
        compute_slices=slices[0],
        memory_slices=slices[1],
        usable_memory_bytes=round(usable_gib * GIB),
        compute_share=share,
        sms=sms,
        source=source,
    )


def _whole(total_mib: int, sms: int, source: str) -> Profile:
    return Profile(
        name=None,
        compute_slices=COMPUTE_SLICES,
        memory_slices=MEMORY_SLICES,
        usable_memory_bytes=total_mib * MIB,
        compute_share=1.0,
        sms=sms,
        source=source,
    )


_LGIP = "nvidia-smi mig -lgip (smallest figure seen across driver releases)"
_SMI = "nvidia-smi total memory"

_A100_40 = GpuModel(
    key="A100-40GB",
    product_labels=("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB"),
    product_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB"),
    sms=108,
    whole=_whole(40536, 108, _SMI),
    profiles=(
        _mig("1g.5gb", (1, 1), 4.75, 14, 108, _LGIP),
        _mig("1g.10gb", (1, 2), 9.625, 14, 108, _LGIP),
        _mig("2g.10gb", (2, 2), 9.625, 28, 108, _LGIP),
        _mig("3g.20gb", (3, 4), 19.5, 42, 108, _LGIP),
        _mig("4g.20gb", (4, 4), 19.5, 56, 108, _LGIP),
        _mig("7g.40gb", (7, 8), 39.25, 98, 108, _LGIP),
    ),
)

_A100_80 = GpuModel(
    key="A100-80GB",
    product_labels=("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "A100-SXM4-80GB"),
    product_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
    sms=108,
    whole=_whole(81920, 108, _SMI),
    profiles=(
        _mig("1g.10gb", (1, 1), 9.5, 14, 108, _LGIP),
        _mig("1g.20gb", (1, 2), 19.5, 14, 108, _LGIP),
        _mig("2g.20gb", (2, 2), 19.5, 28, 108, _LGIP),
        _mig("3g.40gb", (3, 4), 39.25, 42, 108, _LGIP),
        _mig("4g.40gb", (4, 4), 39.25, 56, 108, _LGIP),
        _mig("7g.80gb", (7, 8), 79.0, 98, 108, _LGIP),
    ),
)

_H100_SXM_SHAPES: tuple[tuple[str, tuple[int, int], float, int], ...] = (
    ("1g.10gb", (1, 1), 9.75, 16),
    ("1g.20gb", (1, 2), 19.625, 26),
    ("2g.20gb", (2, 2), 19.625, 32),
    ("3g.40gb", (3, 4), 39.5, 60),
    ("4g.40gb", (4, 4), 39.5, 64),
    ("7g.80gb", (7, 8), 79.25, 132),
)

_H100_SXM = GpuModel(
    key="H100-80GB-SXM",
    product_labels=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
    product_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB"),
    sms=132,
    whole=_whole(81559, 132, _SMI),
    profiles=tuple(_mig(n, s, m, sm, 132, _LGIP) for n, s, m, sm in _H100_SXM_SHAPES),
)

_H100_PCIE = GpuModel(
    key="H100-80GB-PCIe",
    product_labels=("NVIDIA-H100-PCIe",),
    product_names=("NVIDIA H100 PCIe",),
    sms=114,
    whole=_whole(81559, 114, _SMI),
    profiles=tuple(
        _mig(
            n,
            s,
            m,
            None,
            114,
            "memory: H100 80GB lgip; compute share: derived, assumed equal to H100 SXM's "
            "SM ratio (no PCIe lgip transcript found); GFD's multiprocessors label overrides",
            share_from=sm / 132,
        )
        for n, s, m, sm in _H100_SXM_SHAPES
    ),
)

_H100_NVL = GpuModel(
    key="H100-NVL",
    product_labels=("NVIDIA-H100-NVL",),
    product_names=("NVIDIA H100 NVL",),
    sms=132,
    whole=_whole(95830, 132, _SMI),
    profiles=(
        _mig("1g.12gb", (1, 1), 10.625, 16, 132, _LGIP),
        _mig("1g.24gb", (1, 2), 21.5, 26, 132, _LGIP),
        _mig("2g.24gb", (2, 2), 21.5, 32, 132, _LGIP),
        _mig("3g.47gb", (3, 4), 46.125, 60, 132, _LGIP),
        _mig("4g.47gb", (4, 4), 46.125, 64, 132, _LGIP),
        _mig("7g.94gb", (7, 8), 92.625, 132, 132, _LGIP),
    ),
)

_H200_DERIVED = (
    "derived: k x the published 1g.18gb figure (16.00 GiB) for a k-memory-slice profile, a lower "
    "bound on every GPU with published figures; SMs as on H100 SXM (same 132-SM GH100)"
)

_H200 = GpuModel(
    key="H200-141GB",
    product_labels=("NVIDIA-H200", "NVIDIA-H200-NVL"),
    product_names=("NVIDIA H200", "NVIDIA H200 NVL"),
    sms=132,
    whole=_whole(143771, 132, _SMI),
    profiles=(
        _mig("1g.18gb", (1, 1), 16.0, 16, 132, _LGIP),
        _mig("1g.35gb", (1, 2), 32.0, 26, 132, _H200_DERIVED),
        _mig("2g.35gb", (2, 2), 32.0, 32, 132, _H200_DERIVED),
        _mig("3g.71gb", (3, 4), 64.0, 60, 132, _H200_DERIVED),
        _mig("4g.71gb", (4, 4), 64.0, 64, 132, _H200_DERIVED),
        _mig("7g.141gb", (7, 8), 128.0, 132, 132, _H200_DERIVED),
    ),
)

MODELS: tuple[GpuModel, ...] = (_A100_40, _A100_80, _H100_SXM, _H100_PCIE, _H100_NVL, _H200)
"""Every GPU kubeseer can place on, smallest memory first."""

_BY_KEY = {m.key.lower(): m for m in MODELS}
_BY_LABEL = {label.lower(): m for m in MODELS for label in m.product_labels}


def model_by_key(key: str) -> GpuModel:
    """The catalogue entry with this key (`H100-80GB-SXM`), case-insensitively."""
    try:
        return _BY_KEY[key.lower()]
    except KeyError:
        raise UnknownProductError(key) from None


def parse_product_label(label: str) -> tuple[GpuModel, Profile | None]:
    """Interpret a node's `nvidia.com/gpu.product` label.

    Returns the GPU model and, for MIG strategy `single` (GFD appends `-MIG-<profile>`), the
    profile every `nvidia.com/gpu` on that node stands for. GFD's `-SHARED` suffix (time-slicing)
    is accepted and ignored here; shared GPUs are a capacity question for the inventory.
    """
    base = label.strip().removesuffix("-SHARED")
    profile_name: str | None = None
    if "-MIG-" in base:
        base, profile_name = base.split("-MIG-", 1)
    model = _BY_LABEL.get(base.lower()) or _BY_LABEL.get(("NVIDIA-" + base).lower())
    if model is None:
        raise UnknownProductError(label)
    return model, (model.profile(profile_name) if profile_name is not None else None)


def find_model(device_name: str) -> GpuModel | None:
    """The catalogue GPU a device name denotes, or None when it names no known GPU.

    Accepts what predictors record as their label device: a catalogue key (`A100-80GB`), a
    product label (`NVIDIA-H100-80GB-HBM3`) or an NVML name (`NVIDIA H100 80GB HBM3`). A CPU
    (`AMD EPYC`) or an unknown GPU is None: its figures say nothing about these GPUs.
    """
    for candidate in (device_name, device_name.strip().replace(" ", "-")):
        try:
            return resolve_product(candidate)
        except CatalogueError:
            continue
    return None


def resolve_product(name: str) -> GpuModel:
    """A user's `gpuProducts` entry: a catalogue key or a product label, case-insensitively."""
    model = _BY_KEY.get(name.lower())
    if model is not None:
        return model
    return parse_product_label(name)[0]
