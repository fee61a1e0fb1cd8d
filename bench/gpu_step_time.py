"""How well is GPU step time predicted from public measurements, on architectures and GPUs
that were held out?

Data: timm's public step times (shared/data/public-gpu/timm; eager, NCHW, fp16 AMP): inference
on the RTX 3090 and 4090 (torch 2.4), 4090, 5090 and RTX PRO 6000 Max-Q (torch 2.9), training
on the 3090 (torch 1.12). Work per step from the same files: GMACs and activations per image
(fvcore's counts), parameters, batch. Device inputs from `kubeseer.hardware` (peak FP16
FLOP/s, bandwidth, SMs, L2).

Models, all scored on the same rows:

* **scaling law** (`kubeseer.hardware.scaling`): `c_f * FLOPs / peak + c_b * bytes / bandwidth
  + c_0`, three coefficients per mode fitted on the training rows (relative least squares);
* **scaling law + learned correction**: gradient-boosted trees learn log(measured / law) from
  architecture features (log GMACs, activations, parameters per image, their ratios, image
  size, batch) and device features (log peak, bandwidth, SMs, L2): the step-time prior the
  network corrects, as the issue asks;
* **global regressor** (baseline): the same trees on the same features predicting log step
  time directly, with no law;
* **FLOPs over peak** (baseline): one coefficient.

Splits (both by architecture, so no architecture is in training and test at once):

* **held-out architectures, GPU seen**: 5 folds over model names (grouped, seeded); every GPU
  in training;
* **leave one GPU out**: for each GPU, train on the other GPUs' rows of the training folds,
  test on the held-out GPU's rows of the test fold (architecture and GPU both unseen);
* **held-out families** (timm module), GPU seen, for the strictest view of architecture.

A third table asks the same of single operators: NeuSight's per-operator latencies (fp32,
torch 2.1) on five GPUs fit the law per operator type; its test split, which adds GPUs absent
from the fit (H100, L4, A100 80GB), is predicted from the hardware table's specs alone.

A second table scores the law's slowdown prediction directly: for every architecture measured
at the same batch on two GPUs of the same software stack, predicted t_a / t_b against measured,
with the SM ratio (what a compute-share slowdown assumes) as the baseline.

    .venv/bin/python bench/gpu_step_time.py [--json PATH] [--tensor-peak-scale GPU=FACTOR ...]

`--tensor-peak-scale` asks what-if questions of the hardware table: every row of that GPU is
scored with its tensor-core peak multiplied by FACTOR (docs/accuracy.md, "Twenty-fifth session",
asks it of the power-capped RTX PRO 6000 Max-Q).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GroupKFold

from kubeseer.hardware import gpus, mig, scaling
from kubeseer.measure import public_gpu

REPO = Path(__file__).resolve().parents[1]
TIMM_DIR = REPO.parent / "shared" / "data" / "public-gpu" / "timm"
NEUSIGHT_DIR = REPO.parent / "shared" / "data" / "public-gpu" / "neusight"
NEUSIGHT_OPS = ("linear", "bmm", "add", "gelu", "ln", "softmax")
FILES = (
    "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
    "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-5090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
    "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",
)
SEED = 0
PROFILE_CACHE = Path.home() / ".cache" / "kubeseer" / "gpu-step" / "op-profile-v1.jsonl"
# The profiles this benchmark was last run on, committed so that it re-runs without profiling
# (data/derived-gpu-memory-timm/README.md says how they were made).
PROFILE_COMMITTED = REPO / "data" / "derived-gpu-memory-timm" / "op-profiles.jsonl"
PROFILE_BATCH = 8
TENSOR_PEAK_SCALE: dict[str, float] = {}
"""Factors on GPUs' tensor-core peaks (`--tensor-peak-scale`); empty, the table as it is."""
OP_CLASSES = ("matmul", "conv", "dwconv", "attention", "norm", "elementwise")
_VIEWS = frozenset(
    {"view", "_unsafe_view", "expand", "permute", "transpose", "t", "reshape", "slice", "select",
     "unsqueeze", "squeeze", "detach", "alias", "as_strided", "split", "split_with_sizes",
     "unbind", "chunk", "_reshape_alias"}
)  # fmt: skip


@dataclass(frozen=True)
class Row:
    model: str
    family: str
    gpu: str
    mode: str
    stack: str
    batch: int
    img: int
    gmacs: float
    macts: float
    params: float
    step_time_s: float
    profile: tuple[tuple[str, float], ...]

    def per_image(self, key: str) -> float:
        return dict(self.profile)[key]

    def work(self) -> scaling.Work:
        """The step's work from the operator profile (per image, inference forward): a training
        step counts forward and backward as three forward passes of FLOPs and bytes, and two
        kernels for every forward one plus the optimiser's foreach kernels."""
        values = dict(self.profile)
        passes = 3.0 if self.mode == "train" else 1.0
        flops = sum(values[f"flops_{c}"] for c in OP_CLASSES) * self.batch * passes
        moved = sum(values[f"bytes_{c}"] for c in OP_CLASSES) * self.batch * passes
        kernels = sum(values[f"kernels_{c}"] for c in OP_CLASSES) * (3.0 if passes > 1 else 1.0)
        return scaling.Work(flops=flops, bytes=moved, kernels=kernels, precision="fp16")


def _op_class(name: str, args: Sequence[Any]) -> str:
    if name == "convolution":
        groups = args[8] if len(args) > 8 else 1
        return "dwconv" if groups > 1 and groups == args[0].shape[1] else "conv"
    if name in ("mm", "addmm", "bmm", "baddbmm"):
        return "matmul"
    if "scaled_dot_product" in name:
        return "attention"
    return "norm" if "norm" in name else "elementwise"


def _op_flops(op_class: str, args: Sequence[Any], out: Any) -> float:
    first = out[0] if isinstance(out, tuple) else out
    if op_class in ("conv", "dwconv"):
        weight = args[1]
        return 2.0 * first.numel() * weight.shape[1] * weight.shape[2] * weight.shape[3]
    if op_class == "matmul":
        # mm(a, b), addmm(bias, a, b), bmm(a, b), baddbmm(bias, a, b): `a` is second to last.
        return 2.0 * first.numel() * args[-2].shape[-1]
    if op_class == "attention":
        query, key = args[0], args[1]
        return 4.0 * query.numel() * key.shape[-2]
    return 0.0


def profile_architecture(model: str, img: int) -> dict[str, float]:
    """Per image: FLOPs, bytes touched and kernels per operator class, at fp16 autocast.

    One inference forward at batch `PROFILE_BATCH` on the meta device (CUDA's autocast and
    attention kernels, `meta_cuda`), every non-view ATen operator classified; bytes are its
    inputs and outputs. These are the per-operator-class work features the law and the trees use.
    """
    import timm
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from kubeseer.measure import meta_cuda

    totals = {f"{k}_{c}": 0.0 for c in OP_CLASSES for k in ("flops", "bytes", "kernels")}

    class _Profile(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in _VIEWS:
                return out
            op_class = _op_class(name, args)
            tensors = [t for t in tree_flatten((args, out))[0] if isinstance(t, torch.Tensor)]
            totals[f"kernels_{op_class}"] += 1
            totals[f"bytes_{op_class}"] += sum(t.numel() * t.element_size() for t in tensors)
            totals[f"flops_{op_class}"] += _op_flops(op_class, args, out)
            return out

    with torch.device("meta"):
        network = timm.create_model(model, pretrained=False)
    network.eval()
    images = torch.empty((PROFILE_BATCH, 3, img, img), device="meta")
    with torch.no_grad(), _Profile(), meta_cuda.CudaSemantics(torch.float16):
        network(images)
    return {
        key: value if key.startswith("kernels") else value / PROFILE_BATCH
        for key, value in totals.items()
    }


def load_profiles(
    keys: Sequence[tuple[str, int]], fill: bool
) -> dict[tuple[str, int], dict[str, float]]:
    found: dict[tuple[str, int], dict[str, float]] = {}
    for path in (PROFILE_COMMITTED, PROFILE_CACHE):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("profile") is not None:
                found[(entry["model"], entry["img"])] = entry["profile"]
            else:
                found.setdefault((entry["model"], entry["img"]), {})
    if not fill:
        return {k: v for k, v in found.items() if v}
    PROFILE_CACHE.parent.mkdir(parents=True, exist_ok=True)
    with PROFILE_CACHE.open("a") as handle:
        for model, img in keys:
            if (model, img) in found:
                continue
            try:
                profile: dict[str, float] | None = profile_architecture(model, img)
            except Exception:
                profile = None
            found[(model, img)] = profile or {}
            handle.write(json.dumps({"model": model, "img": img, "profile": profile}) + "\n")
            handle.flush()
    return {k: v for k, v in found.items() if v}


def family_of(model: str) -> str:
    from timm.models import _registry

    return str(_registry._model_to_module.get(model, model.split("_")[0]))


def load_rows(profiles: dict[tuple[str, int], dict[str, float]] | None = None) -> list[Row]:
    """The timm rows of `FILES` with work counts; with `profiles`, only the rows that have one."""
    work: dict[tuple[str, int], tuple[float, float]] = {}
    for path in TIMM_DIR.glob("benchmark-infer-*.csv"):
        with path.open(newline="") as handle:
            for record in csv.DictReader(handle):
                if record.get("infer_gmacs") and record.get("infer_macts"):
                    key = (record["model"], int(float(record["infer_img_size"])))
                    work[key] = (float(record["infer_gmacs"]), float(record["infer_macts"]))
    rows = []
    for row in public_gpu.read_timm(TIMM_DIR):
        if row.source not in FILES or (row.model, row.img_size) not in work:
            continue
        gmacs, macts = work[(row.model, row.img_size)]
        if gmacs <= 0 or macts <= 0:
            continue
        profile: tuple[tuple[str, float], ...] = ()
        if profiles is not None:
            found = profiles.get((row.model, row.img_size))
            if not found:
                continue
            profile = tuple(sorted(found.items()))
        rows.append(
            Row(
                model=row.model,
                family=family_of(row.model),
                gpu=row.gpu,
                mode=row.mode,
                stack=f"pt{row.torch}",
                batch=row.batch_size,
                img=row.img_size,
                gmacs=gmacs,
                macts=macts,
                params=row.params,
                step_time_s=row.step_time_s,
                profile=profile,
            )
        )
    return rows


def tensor_peak(gpu: str) -> float:
    """The GPU's fp16 tensor-core peak in FLOP/s, times its `TENSOR_PEAK_SCALE` factor."""
    return gpus.by_key(gpu).peak_flops("fp16") * TENSOR_PEAK_SCALE.get(gpu, 1.0)


def law_terms(rows: Sequence[Row]) -> npt.NDArray[np.float64]:
    """Per row: FLOPs / peak, bytes / bandwidth, kernels, 1 (the law's four terms)."""
    out = np.empty((len(rows), 4))
    for i, row in enumerate(rows):
        device = mig.device(row.gpu)
        work = row.work()
        out[i] = (
            work.flops / tensor_peak(row.gpu),
            work.bytes / device.memory_bandwidth,
            work.kernels,
            1.0,
        )
    return out


def fit_law(rows: Sequence[Row]) -> dict[str, npt.NDArray[np.float64]]:
    """Non-negative relative least squares per mode: minimise sum((law - t) / t)^2."""
    coefficients = {}
    for mode in ("infer", "train"):
        subset = [r for r in rows if r.mode == mode]
        if not subset:
            continue
        terms = law_terms(subset)
        target = np.array([r.step_time_s for r in subset])
        fit = LinearRegression(positive=True, fit_intercept=False)
        fit.fit(terms / target[:, None], np.ones(len(subset)))
        coefficients[mode] = np.asarray(fit.coef_, dtype=np.float64)
    return coefficients


def law_predict(
    coef: dict[str, npt.NDArray[np.float64]], rows: Sequence[Row]
) -> npt.NDArray[np.float64]:
    terms = law_terms(rows)
    return np.array([terms[i] @ coef[r.mode] for i, r in enumerate(rows)])


def features(rows: Sequence[Row]) -> npt.NDArray[np.float64]:
    out = []
    for row in rows:
        spec = gpus.by_key(row.gpu)
        out.append(
            [
                np.log(row.gmacs),
                np.log(row.macts),
                np.log(row.params),
                np.log(row.gmacs / row.macts),
                np.log(row.params / row.gmacs),
                row.img,
                np.log(row.batch),
                1.0 if row.mode == "train" else 0.0,
                np.log(tensor_peak(row.gpu)),
                np.log(spec.memory_bandwidth),
                np.log(spec.sms),
                np.log(spec.l2_mb),
                *(np.log1p(v) for _, v in row.profile),
            ]
        )
    return np.array(out)


def trees() -> HistGradientBoostingRegressor:
    return HistGradientBoostingRegressor(max_iter=150, learning_rate=0.1, random_state=SEED)


def predictions(train: Sequence[Row], test: Sequence[Row]) -> dict[str, npt.NDArray[np.float64]]:
    """Every model's step-time prediction for `test`, trained on `train`."""
    y_train = np.log([r.step_time_s for r in train])
    coef = fit_law(train)
    law_train = law_predict(coef, train)
    law_test = law_predict(coef, test)
    x_train, x_test = features(train), features(test)
    corrected = trees().fit(x_train, y_train - np.log(law_train))
    direct = trees().fit(x_train, y_train)
    peak_train = law_terms(train)[:, 0]
    ratio = float(np.median(np.array([r.step_time_s for r in train]) / peak_train))
    return {
        "scaling law + learned correction": law_test * np.exp(corrected.predict(x_test)),
        "scaling law": law_test,
        "global regressor (trees, no law)": np.exp(direct.predict(x_test)),
        "FLOPs over peak": ratio * law_terms(test)[:, 0],
    }


def mape(pred: npt.NDArray[np.float64], rows: Sequence[Row]) -> float:
    truth = np.array([r.step_time_s for r in rows])
    return float(np.mean(np.abs(pred - truth) / truth) * 100)


def cross_validate(
    rows: Sequence[Row], groups: Sequence[str], *, leave_gpu_out: bool
) -> dict[str, dict[str, Any]]:
    """Held-out groups (5 folds), every GPU seen; and leave one GPU out on the same folds."""
    folds = GroupKFold(n_splits=5, shuffle=True, random_state=SEED)
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    logo: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    index = np.arange(len(rows))
    for train_index, test_index in folds.split(index, groups=groups):
        train = [rows[i] for i in train_index]
        test = [rows[i] for i in test_index]
        predicted = predictions(train, test)
        truth = np.array([r.step_time_s for r in test])
        for name, pred in predicted.items():
            errors = np.abs(pred - truth) / truth * 100
            for row, error in zip(test, errors, strict=True):
                seen[name][f"{row.gpu} {row.mode} {row.stack}"].append(float(error))
                seen[name]["all"].append(float(error))
        for gpu in sorted({r.gpu for r in rows}) if leave_gpu_out else ():
            held_train = [r for r in train if r.gpu != gpu]
            # Training was measured on one GPU only: leaving it out leaves no training rows.
            modes = {r.mode for r in held_train}
            held_test = [r for r in test if r.gpu == gpu and r.mode in modes]
            if not held_test or not held_train:
                continue
            predicted = predictions(held_train, held_test)
            truth = np.array([r.step_time_s for r in held_test])
            for name, pred in predicted.items():
                errors = np.abs(pred - truth) / truth * 100
                for row, error in zip(held_test, errors, strict=True):
                    logo[name][f"{row.gpu} {row.mode} {row.stack}"].append(float(error))
                    logo[name]["all"].append(float(error))
    summary: dict[str, dict[str, Any]] = {}
    for split, table in (("GPU seen", seen), ("GPU left out", logo)):
        if not table:
            continue
        summary[split] = {
            name: {key: (round(statistics.fmean(v), 2), len(v)) for key, v in sorted(cells.items())}
            for name, cells in table.items()
        }
    return summary


def ratio_table(rows: Sequence[Row], coef: dict[str, npt.NDArray[np.float64]]) -> list[str]:
    """Predicted against measured t_a / t_b for the same architecture, batch and stack."""
    by_key: dict[tuple[str, int, int, str, str], dict[str, Row]] = defaultdict(dict)
    for row in rows:
        by_key[(row.model, row.img, row.batch, row.mode, row.stack)][row.gpu] = row
    pairs: dict[tuple[str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for cell in by_key.values():
        names = sorted(cell)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                ra, rb = cell[a], cell[b]
                measured = ra.step_time_s / rb.step_time_s
                law = law_predict(coef, [ra])[0] / law_predict(coef, [rb])[0]
                sm = gpus.by_key(b).sms / gpus.by_key(a).sms
                pairs[(a, b, ra.stack)].append((measured, law, sm))
    lines = [
        "| GPU a / GPU b | stack | pairs | median measured t_a/t_b | law: MAPE of the ratio "
        "| SM ratio: MAPE |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (a, b, stack), values in sorted(pairs.items()):
        measured = np.array([v[0] for v in values])
        law = np.array([v[1] for v in values])
        sm = np.array([v[2] for v in values])
        lines.append(
            f"| {a} / {b} | {stack} | {len(values)} | {np.median(measured):.2f} | "
            f"{np.mean(np.abs(law - measured) / measured) * 100:.1f} % | "
            f"{np.mean(np.abs(sm - measured) / measured) * 100:.1f} % |"
        )
    return lines


def attainment_table(rows: Sequence[Row], count: int = 30) -> list[str]:
    """How much of each GPU's tensor peak the most compute-heavy architectures reach.

    The `count` architectures with the most GMACs per image among those measured for inference
    on every GPU: their achieved FLOP/s (2 x GMACs x images per second) over the table's fp16
    tensor peak. Matmul-bound work reaches close to a peak the GPU sustains; a GPU far below
    the others is one whose peak the specs overstate for sustained work.
    """
    infer = [r for r in rows if r.mode == "infer"]
    gpus_seen = sorted({r.gpu for r in infer})
    by_model: dict[str, dict[str, Row]] = defaultdict(dict)
    for row in infer:
        kept = by_model[row.model].get(row.gpu)
        if kept is None or row.stack > kept.stack:
            by_model[row.model][row.gpu] = row
    common = [m for m, cells in by_model.items() if len(cells) == len(gpus_seen)]
    heaviest = sorted(common, key=lambda m: -next(iter(by_model[m].values())).gmacs)[:count]
    lines = [
        f"{len(heaviest)} architectures with the most GMACs per image, measured on every GPU:",
        "",
        "| GPU | table fp16 peak, TFLOP/s | median reached | best reached | median batch |",
        "|---|---:|---:|---:|---:|",
    ]
    for gpu in gpus_seen:
        cells = [by_model[m][gpu] for m in heaviest]
        reached = np.array([2e9 * r.gmacs * r.batch / r.step_time_s for r in cells])
        peak = tensor_peak(gpu)
        lines.append(
            f"| {gpu} | {peak / 1e12:.1f} | {np.median(reached) / peak:.2f} | "
            f"{reached.max() / peak:.2f} | {int(np.median([r.batch for r in cells]))} |"
        )
    return lines


def held_out_bias_table(rows: Sequence[Row]) -> list[str]:
    """The law's signed error on each GPU when fitted on the other GPUs' rows (all of them),
    by how much of the predicted time is compute: an error that stays level from memory-bound
    to compute-bound work is the GPU's own, not its tensor peak's."""
    lines = [
        "| GPU left out | rows | median predicted / measured | by compute share of the "
        "prediction, in fifths (median share: median ratio) |",
        "|---|---:|---:|---|",
    ]
    for gpu in sorted({r.gpu for r in rows}):
        test = [r for r in rows if r.gpu == gpu and r.mode == "infer"]
        coef = fit_law([r for r in rows if r.gpu != gpu])
        predicted = law_predict(coef, test)
        ratio = predicted / np.array([r.step_time_s for r in test])
        share = coef["infer"][0] * law_terms(test)[:, 0] / predicted
        fifths = np.array_split(np.argsort(share), 5)
        lines.append(
            f"| {gpu} | {len(test)} | {np.median(ratio):.2f} | "
            + ", ".join(f"{np.median(share[q]):.2f}: {np.median(ratio[q]):.2f}" for q in fifths)
            + " |"
        )
    return lines


def _neusight_rows(path: Path, op: str) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["OPName"] == op]


def _op_terms(
    op: str, rows: Sequence[dict[str, str]]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], list[str]]:
    """The law's terms for single fp32 operators: FLOPs and bytes from the shapes."""
    terms, latency, devices = [], [], []
    for row in rows:
        device = mig.device(gpus.lookup(row["Device"]).key)
        if op in ("linear", "bmm"):
            b, m, n, k = (float(row[c]) for c in "BMNK")
            flops = 2 * b * m * n * k
            weights = b * k * n if op == "bmm" else k * n
            moved = 4 * (b * m * k + weights + b * m * n)
        else:
            b, h = float(row["B"]), float(row["H"])
            flops = b * h * (1 if op == "add" else 8)
            moved = 4 * b * h * (3 if op == "add" else 2)
        terms.append([flops / device.peak_flops("fp32"), moved / device.memory_bandwidth, 1e-3])
        latency.append(float(row["Latency"]) / 1e3)
        devices.append(device.gpu.key)
    return np.array(terms), np.array(latency), devices


def neusight_table() -> list[str]:
    """Per operator and GPU: MAPE of the law fitted on NeuSight's training GPUs."""
    lines = [
        "| operator | GPU | in the fit | rows | MAPE % | median APE % |",
        "|---|---|---|---:|---:|---:|",
    ]
    for op in NEUSIGHT_OPS:
        train_rows = [
            r for path in sorted((NEUSIGHT_DIR / "ops").glob(f"{op}__*.csv.gz"))
            for r in _neusight_rows(path, op)
        ]  # fmt: skip
        held_file = op if op in ("linear", "bmm", "ln", "softmax") else "elem"
        test_rows = _neusight_rows(NEUSIGHT_DIR / "ops-heldout-gpus" / f"{held_file}.csv.gz", op)
        x, y, fitted_on = _op_terms(op, train_rows)
        coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
        x_test, y_test, devices = _op_terms(op, test_rows)
        errors = np.abs(x_test @ np.maximum(coef, 0) - y_test) / y_test * 100
        for gpu in sorted(set(devices)):
            mask = np.array([d == gpu for d in devices])
            seen = "yes" if gpu in set(fitted_on) else "**no**"
            lines.append(
                f"| {op} | {gpu} | {seen} | {int(mask.sum())} | {errors[mask].mean():.1f} | "
                f"{np.median(errors[mask]):.1f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile-only", action="store_true", help="only fill the profile cache")
    parser.add_argument("--shard", default="0/1", help="I/N: profile every N-th architecture")
    parser.add_argument(
        "--tensor-peak-scale",
        action="append",
        default=[],
        metavar="GPU=FACTOR",
        help="score GPU (a hardware-table key) with its tensor-core peak times FACTOR",
    )
    args = parser.parse_args(argv)
    for item in args.tensor_peak_scale:
        gpu, _, factor = item.partition("=")
        try:
            key, scale = gpus.by_key(gpu).key, float(factor)
        except (KeyError, ValueError) as error:
            parser.error(f"--tensor-peak-scale {item!r}: {error}")
        if scale <= 0:
            parser.error(f"--tensor-peak-scale {item!r}: the factor must be positive")
        TENSOR_PEAK_SCALE[key] = scale
    rows = load_rows()
    if args.profile_only:
        # A seeded shuffle, so that a cache filled part way is a random sample of architectures.
        keys = sorted({(r.model, r.img) for r in rows})
        random.Random(SEED).shuffle(keys)
        shard, count = (int(x) for x in args.shard.split("/"))
        load_profiles(keys[shard::count], fill=True)
        return 0
    profiles = load_profiles(sorted({(r.model, r.img) for r in rows}), fill=False)
    everything = len(rows)
    rows = load_rows(profiles)
    print(f"{everything} rows with work counts; {len(rows)} with an operator profile")
    print(f"{len(rows)} rows, {len({r.model for r in rows})} architectures, "
          f"{len({r.family for r in rows})} families")  # fmt: skip
    report: dict[str, Any] = {}
    for split_name, groups, leave_gpu_out in (
        ("architectures", [r.model for r in rows], True),
        ("families", [r.family for r in rows], False),
    ):
        result = cross_validate(rows, groups, leave_gpu_out=leave_gpu_out)
        report[split_name] = result
        for held, table in result.items():
            print(f"\n### held-out {split_name}, {held}: MAPE % (rows)\n")
            keys = sorted(next(iter(table.values())))
            print("| model | " + " | ".join(keys) + " |")
            print("|---|" + "---:|" * len(keys))
            for name, cells in table.items():
                print(
                    f"| {name} | "
                    + " | ".join(f"{cells[k][0]:.1f} ({cells[k][1]})" for k in keys)
                    + " |"
                )
    coef = fit_law(rows)
    print("\nscaling law fitted on all rows:")
    for mode, values in coef.items():
        print(
            f"  {mode}: c_f={values[0]:.4f} c_b={values[1]:.4f} "
            f"c_k={values[2] * 1e6:.2f} us c_0={values[3] * 1e3:.3f} ms"
        )
    print("\n### single operators (NeuSight): the law from specs on GPUs in and out of the fit\n")
    print("\n".join(neusight_table()))
    print("\n### the law on a GPU left out: signed error by compute share\n")
    print("\n".join(held_out_bias_table(rows)))
    print("\n### tensor-peak attainment of compute-heavy architectures\n")
    print("\n".join(attainment_table(rows)))
    print("\n### slowdown between GPUs: predicted against measured step-time ratio\n")
    print("\n".join(ratio_table(rows, coef)))
    report["coefficients"] = {m: v.tolist() for m, v in coef.items()}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
