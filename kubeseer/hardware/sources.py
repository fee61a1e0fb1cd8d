"""Where every figure of the GPU table comes from, cited once and referred to by key.

Each figure in `kubeseer.hardware.gpus` and `kubeseer.hardware.mig` names one of these keys, so
a reader (or a test) can check any number against a public document. Keys name the document,
not the figure, because one datasheet usually supplies a whole row.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["SOURCES", "Source", "cite"]


@dataclass(frozen=True)
class Source:
    """A public document: its title, where to find it, and what in it the figures come from."""

    title: str
    url: str
    note: str = ""


SOURCES: Final = MappingProxyType(
    {
        "a100-datasheet": Source(
            "NVIDIA A100 Tensor Core GPU datasheet",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "peak FP32 / TF32 / FP16 / BF16 (dense), GPU memory and bandwidth per form factor",
        ),
        "ampere-whitepaper": Source(
            "NVIDIA A100 Tensor Core GPU Architecture (whitepaper)",
            "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
            "nvidia-ampere-architecture-whitepaper.pdf",
            "108 SMs, 1410 MHz boost clock, 40 MB L2 (its comparison of data centre GPUs)",
        ),
        "h100-datasheet": Source(
            "NVIDIA H100 Tensor Core GPU datasheet",
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "peak FP32 / TF32 / FP16 / BF16 (dense = half the 'with sparsity' figure), memory and "
            "bandwidth of H100 SXM, PCIe and NVL",
        ),
        "hopper-whitepaper": Source(
            "NVIDIA H100 Tensor Core GPU Architecture (whitepaper)",
            "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
            "132 SMs (SXM5) / 114 SMs (PCIe), 50 MB L2, boost clocks",
        ),
        "h200-product": Source(
            "NVIDIA H200 Tensor Core GPU product page and datasheet",
            "https://www.nvidia.com/en-us/data-center/h200/",
            "141 GB HBM3e at 4.8 TB/s; compute as H100 SXM (same GH100 die, same SM count)",
        ),
        "ga102-whitepaper": Source(
            "NVIDIA Ampere GA102 GPU Architecture (whitepaper)",
            "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
            "RTX 3090: 82 SMs, 1695 MHz boost, 35.6 TFLOPS FP32, 71 TFLOPS FP16 tensor with FP32 "
            "accumulate (dense), 936 GB/s, 6 MB L2",
        ),
        "ada-whitepaper": Source(
            "NVIDIA Ada GPU Architecture (whitepaper)",
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            "RTX 4090: 128 SMs, 2520 MHz boost, 82.6 TFLOPS FP32, 165.2 TFLOPS FP16 tensor with "
            "FP32 accumulate (dense), 1008 GB/s, 72 MB L2",
        ),
        "blackwell-rtx-whitepaper": Source(
            "NVIDIA RTX Blackwell GPU Architecture (whitepaper)",
            "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
            "nvidia-rtx-blackwell-gpu-architecture.pdf",
            "RTX 5090: 170 SMs, 2407 MHz boost, 104.8 TFLOPS FP32, 209.5 TFLOPS FP16 tensor with "
            "FP32 accumulate (dense), 1792 GB/s, 96 MB L2; GB202 has 128 MB L2",
        ),
        "rtx-pro-6000-maxq": Source(
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition datasheet, and Fixstars' "
            "datasheet comparison of it",
            "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/"
            "rtx-pro-6000-max-q/",
            "188 SMs (24,064 CUDA cores), 96 GB GDDR7 at 1792 GB/s, 128 MB L2, 300 W; boost "
            "2288 MHz and 110.1 TFLOPS FP32 as listed by public spec databases",
        ),
        "v100-datasheet": Source(
            "NVIDIA V100 Tensor Core GPU datasheet",
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "V100 PCIe: 80 SMs, 14 TFLOPS FP32, 112 TFLOPS tensor, 900 GB/s, 6 MB L2",
        ),
        "t4-datasheet": Source(
            "NVIDIA T4 datasheet",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
            "40 SMs, 8.1 TFLOPS FP32, 65 TFLOPS FP16 tensor, 320 GB/s, 16 GB",
        ),
        "pascal-datasheets": Source(
            "NVIDIA Tesla P100 and P4 datasheets",
            "https://www.nvidia.com/en-us/data-center/tesla-p100/",
            "P100 PCIe 16GB: 56 SMs, 9.3 TFLOPS FP32, 18.7 FP16, 732 GB/s, 4 MB L2; "
            "P4: 20 SMs, 5.5 TFLOPS FP32, 192 GB/s, 2 MB L2",
        ),
        "l4-datasheet": Source(
            "NVIDIA L4 Tensor Core GPU datasheet",
            "https://www.nvidia.com/en-us/data-center/l4/",
            "58 SMs, 30.3 TFLOPS FP32, 121 TFLOPS FP16 tensor (dense), 300 GB/s, 48 MB L2, 24 GB",
        ),
        "neusight": Source(
            "NeuSight (ASPLOS 2025) device configurations, sitar-lab/NeuSight at 6945927d9afc",
            "shared/data/public-gpu/neusight/device_configs/",
            "the clocks and FP32 peaks the per-operator latencies were published with",
        ),
        "nvidia-smi": Source(
            "nvidia-smi / NVML total memory in public transcripts",
            "https://docs.nvidia.com/deploy/nvml-api/",
            "the total a CUDA process sees (e.g. 81559 MiB on H100 80GB HBM3); the same figures "
            "as kubeseer.placement.catalogue's whole-GPU rows",
        ),
        "mig-user-guide": Source(
            "NVIDIA Multi-Instance GPU User Guide",
            "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",
            "profiles as compute slices of 7 and memory slices of 8; a memory slice is 1/8 of the "
            "GPU's memory controllers and L2, so bandwidth and L2 follow memory slices / 8",
        ),
        "mig-lgip": Source(
            "nvidia-smi mig -lgip transcripts (see docs/placement.md)",
            "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",
            "SMs and usable memory per profile, the figures of kubeseer.placement.catalogue",
        ),
        "derived": Source(
            "derived in kubeseer from the other figures of the same row",
            "docs/dataset.md",
            "peak = SMs x FLOP/clock/SM x boost clock, or a sibling product's figure; named as "
            "derived wherever used",
        ),
    }
)


def cite(key: str) -> Source:
    """The source called `key`.

    Raises:
        KeyError: no such source; the message lists the known keys.
    """
    try:
        return SOURCES[key]
    except KeyError:
        raise KeyError(f"no source {key!r}; known: {', '.join(SOURCES)}") from None
