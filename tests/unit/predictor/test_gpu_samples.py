"""GPU training samples from public timm step times and memory derivations (a real timm
architecture, exported with random weights into a temporary cache)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from kubeseer.hardware import mig
from kubeseer.measure import storage
from kubeseer.predictor import dataset, device, gpu_samples, splits, targets, timm_models

pytest.importorskip("timm")

REPO = Path(__file__).resolve().parents[3]
REPLAY = "cuda-nvidia-h100-80gb-hbm3-derived-allocator-replay"
HEADER = "model,infer_img_size,infer_samples_per_sec,infer_step_time,infer_batch_size,param_count"


def sources(tmp_path):
    timm_dir = tmp_path / "timm"
    timm_dir.mkdir()
    # One architecture on two GPUs, one the table does not have an export for.
    (timm_dir / "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv").write_text(
        f"{HEADER}\nresnet18,64,1000,8.0,256,11.7\nnot_a_timm_model,64,10,5.0,8,1.0\n"
    )
    (timm_dir / "benchmark-infer-amp-nchw-pt291-cu130-5090.csv").write_text(
        f"{HEADER}\nresnet18,64,2000,4.0,256,11.7\n"
    )
    derivations = tmp_path / "derivations.jsonl"
    derivations.write_text(
        "\n".join(
            json.dumps(entry)
            for entry in (
                {
                    "key": "resnet18|64|infer|256|torch2-cuda12",
                    "allocated": 7 << 20,
                    "reserved": 9 << 20,
                    "required": 8 << 20,
                },
                # Training memory derived in the labels' runtime (`--labels-in`).
                {
                    "key": "resnet18|64|train|128|torch2-cuda12",
                    "allocated": 5 << 20,
                    "reserved": 6 << 20,
                    "required": 6 << 20,
                },
                # Another runtime's derivation is not learned from.
                {
                    "key": "resnet18|64|infer|256|torch1-cuda11",
                    "allocated": 1,
                    "reserved": 1,
                    "required": 1,
                },
            )
        )
    )
    return gpu_samples.Sources(replay=tmp_path / "none", timm=timm_dir, derivations=derivations)


def test_timm_rows_become_samples_on_their_gpu_and_derivations_reserved_memory(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    samples, failed = gpu_samples.timm_samples(sources(tmp_path), export=True)
    assert any(line.startswith("not_a_timm_model-64") for line in failed)
    step = {s.gpu: s for s in samples if s.source.startswith("measured")}
    memory = {s.job_batch_size: s for s in samples if s.source.startswith("derived")}
    assert set(step) == {"RTX-3090", "RTX-5090"} and set(memory) == {256, 128}
    infer_step = gpu_samples.METRICS.index("infer.step_time_s")
    assert step["RTX-3090"].y[0, infer_step] == pytest.approx(8e-3)
    assert step["RTX-3090"].y_mask[0].tolist() == [False, False, False, True]
    torch.testing.assert_close(
        step["RTX-5090"].device_x, device.features(mig.device("RTX-5090"), "fp16")
    )
    infer_memory = gpu_samples.METRICS.index("infer.memory_bytes")
    assert memory[256].y[0, infer_memory] == 8 << 20
    assert memory[256].live_peak[0, infer_memory] == 7 << 20
    # timm's benchmark trains with SGD: the label is that mode's, the sample says the optimizer.
    train_memory = gpu_samples.METRICS.index("train.memory_bytes")
    assert memory[128].y_mask[0].tolist() == [True, False, False, False]
    assert memory[128].y[0, train_memory] == 6 << 20 and memory[128].optimizer == "sgd"
    # One architecture: one configuration and family for every split to keep together.
    assert {s.config_hash for s in samples} == {step["RTX-3090"].config_hash}
    assert {s.family for s in samples} == {"timm/resnet"}
    assert all(s.precision == "fp16" for s in samples)
    assert all(s.optimizer == "none" for s in samples if s is not memory[128])
    # The analytic estimate the memory heads correct (log bytes, one column per metric).
    prior_column = targets.METRICS.index("infer.memory_bytes")
    assert all(s.prior_log[0, prior_column] > math.log(1 << 20) for s in samples)


def test_worker_processes_export_what_is_not_cached_and_name_what_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    wanted = [("resnet18", 64), ("not_a_timm_model", 64)]
    failed = timm_models.export_all(wanted, workers=2)
    assert (
        list(failed) == ["not_a_timm_model-64"]
        and "not_a_timm_model" in failed["not_a_timm_model-64"]
    )
    exported = timm_models.onnx_path("resnet18", 64)
    written = exported.stat().st_mtime_ns
    # A second pass exports nothing again: the cached file stays, the failure is remembered.
    assert timm_models.export_all(wanted, workers=2) == failed
    assert exported.stat().st_mtime_ns == written
    assert set(timm_models.failures()) == {"not_a_timm_model-64"}


def test_workers_extract_the_graphs_of_what_they_export_for_the_samples_to_read(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    arch = ("resnet18", 64)
    assert timm_models.export_all([arch], workers=2, batches={arch: {1, 4}}) == {}
    cache = dataset.GraphCache()
    key = timm_models.config_hash(*arch)
    cached = {b: cache.get_with_memory(key, b) for b in (1, 4, 8)}
    assert cached[1] is not None and cached[4] is not None and cached[8] is None
    assert cached[4].memory_graph.scoped
    written = cache.memory_path(key, 4).stat().st_mtime_ns
    # A second pass extracts only the batch not cached yet; what is cached stays as it was.
    assert timm_models.export_all([arch], workers=1, batches={arch: {1, 4, 8}}) == {}
    assert cache.memory_path(key, 4).stat().st_mtime_ns == written
    assert cache.get_with_memory(key, 8) is not None


def test_the_export_order_puts_the_derived_architectures_first_then_a_family_at_a_time(
    tmp_path,
):
    src = sources(tmp_path)
    rows = gpu_samples.step_rows(src.timm)
    order = gpu_samples.architectures(rows, src.derivations)
    assert order[0] == ("resnet18", 64)
    assert set(order) == {("resnet18", 64), ("not_a_timm_model", 64)}


def test_public_boundaries_become_bounds_at_the_card_less_the_context_memory_evidence_only(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    src = sources(tmp_path)
    # Each file starts at 1,024 (big_one ran there): resnet18 at 64 px stopped at 256 on the
    # 3090 (384 ran out of memory) and at 96 px at 768 on the 4090 (1,024 failed); at 96 px on
    # the 5090 it failed at 768, which the 24 GB 4090 ran on the same torch release: that
    # failure is contradicted, no evidence. The torch 1.13 file's boundary is another runtime's.
    files = {
        "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv": "resnet18,64,1000,8.0,256,11.7",
        "benchmark-infer-amp-nchw-pt291-cu128-4090.csv": "resnet18,96,1000,8.0,768,11.7",
        "benchmark-infer-amp-nchw-pt291-cu130-5090.csv": "resnet18,96,2000,4.0,512,11.7",
        "benchmark-infer-amp-nchw-pt113-cu117-rtx3090.csv": "resnet18,64,1000,8.0,8,11.7",
    }
    for name, row in files.items():
        (src.timm / name).write_text(f"{HEADER}\n{row}\nbig_one,64,10,5.0,1024,1.0\n")
    limits = tmp_path / "kernel-limits.jsonl"
    limits.write_text("")
    samples, failed = gpu_samples.censored_samples(src, limits, export=True)
    assert failed == []
    found = {(s.source.split(" on ")[1].split(" ")[0], s.job_batch_size): s for s in samples}
    assert set(found) == {
        ("RTX-3090", 256),
        ("RTX-3090", 384),
        ("RTX-4090", 768),
        ("RTX-4090", 1024),
    }
    infer_memory = gpu_samples.METRICS.index("infer.memory_bytes")
    ran, failed_batch = found["RTX-3090", 256], found["RTX-3090", 384]
    held = mig.device("RTX-3090").gpu.memory_bytes - (500 << 20)
    assert ran.y[0, infer_memory] == held == failed_batch.y[0, infer_memory]
    assert ran.y_censor[0].tolist() == [0, 0, -1, 0]
    assert failed_batch.y_censor[0].tolist() == [0, 0, 1, 0]
    assert ran.y_mask[0].tolist() == [False, False, True, False]
    assert ran.optimizer == "none" and ran.family == "timm/resnet"


def test_a_training_draw_joins_the_samples_marked_to_be_trained_on_only(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBESEER_CACHE_DIR", str(tmp_path / "cache"))
    committed = storage.read_records(REPO / "data" / REPLAY)
    mlps = sorted({r.config_hash for r in committed if r.family == "mlp"})[:3]
    replay, drawn = tmp_path / "replay", tmp_path / "drawn"
    storage.write_part(replay, [r for r in committed if r.config_hash in mlps[:2]])
    storage.write_part(drawn, [r for r in committed if r.config_hash == mlps[2]])
    src = dataclasses.replace(sources(tmp_path), replay=replay, training_only=(drawn,))
    samples, info = gpu_samples.build(src, export=True)
    assert info.training_only == (mlps[2],)
    zoo = {
        str(s.config_hash) for s in samples if s.source.startswith("derived-allocator-replay zoo")
    }
    assert zoo == set(mlps)
    assert f"trained on only ({tmp_path.name}/drawn)" in info.sources[0]
    assert info.records == sum(1 for r in committed if r.config_hash in mlps) + sum(
        1 for s in samples if s.family.startswith("timm/")
    )
    held, extra = splits.apart(samples, info.training_only)
    assert len(held) + len(extra) == len(samples)
    assert {str(s.config_hash) for s in extra} == {mlps[2]}
