import dataclasses

import pytest
import torch
from torch_geometric.data import Data

from kubeseer.measure import records
from kubeseer.prediction import Precision
from kubeseer.predictor import dataset, schema, targets

CPU = records.DeviceDescriptor(
    kind=records.DeviceKind.CPU,
    name="Test CPU",
    memory_bytes=1 << 34,
    sm_count=None,
    cores=2,
    mig_profile=None,
    driver_version=None,
    cuda_version=None,
    torch_version="2.13.0",
)
GPU = records.DeviceDescriptor(
    kind=records.DeviceKind.CUDA,
    name="NVIDIA A100-SXM4-80GB",
    memory_bytes=80 << 30,
    sm_count=108,
    cores=None,
    mig_profile=None,
    driver_version="560",
    cuda_version="12.6",
    torch_version="2.13.0",
)


def record(
    config,
    batch,
    mode,
    *,
    optimizer=None,
    memory=1e9,
    step=1e-2,
    util=None,
    oom=False,
    device=CPU,
    allocator=None,
):
    unset = {f.name: None for f in dataclasses.fields(records.Record)}
    return records.Record(
        **{
            **unset,
            "schema_version": records.SCHEMA_VERSION,
            "config_hash": config,
            "family": "resnet" if config.startswith("r") else "vit",
            "spec_json": "{}",
            "batch_size": batch,
            "mode": mode,
            "precision": "fp32",
            "optimizer": optimizer or ("adam" if mode == "train" else records.NO_OPTIMIZER),
            "device": device,
            "label_source": records.LabelSource.MEASURED,
            "status": records.Status.OUT_OF_MEMORY if oom else records.Status.OK,
            "plan": "test",
            "warmup_iterations": 1,
            "timed_iterations": 3,
            "step_time_median_s": None
            if oom or step is None
            else step * (3 if device is CPU else 1),
            "step_cpu_time_median_s": None if oom or device is not CPU else step,
            "memory_bytes": None if memory is None else int(memory),
            "allocator_peak_allocated_bytes": None if allocator is None else int(allocator),
            "sm_util_mean_percent": util,
            "started_at": "2026-11-22T00:00:00Z",
            "finished_at": "2026-11-22T00:00:01Z",
        }
    )


def graph(num_nodes):
    return Data(
        x=torch.rand(num_nodes, len(schema.NODE_FEATURES)),
        edge_index=torch.stack([torch.arange(num_nodes - 1), torch.arange(1, num_nodes)]),
        edge_attr=torch.rand(num_nodes - 1, len(schema.EDGE_FEATURES)),
        u=torch.rand(1, len(schema.GLOBAL_FEATURES)),
    )


def fake_graphs(spec_json, batches):
    return {b: graph(3 + b % 4) for b in batches}


ROWS = [
    record("r1", 8, "train", memory=3e9, step=0.3),
    record("r1", 8, "infer", memory=1e9, step=0.1),
    record("r1", 8, "train", optimizer="sgd", memory=2e9),
    record("r1", 16, "infer", memory=1.5e9, step=0.2),
    record("v1", 8, "train", memory=5e9, step=0.5),
    record("v1", 64, "train", oom=True, memory=16e9),
]


def build(rows=ROWS, **kwargs):
    return dataset.build_samples(rows, graph_fn=fake_graphs, **kwargs)


def by_key(samples):
    return {(s.config_hash, s.job_batch_size, s.optimizer): s for s in samples}


def test_both_modes_of_a_configuration_share_one_sample():
    samples, info = build()
    assert info.metrics == (
        "train.memory_bytes",
        "train.step_time_s",
        "infer.memory_bytes",
        "infer.step_time_s",
    )
    s = by_key(samples)[("r1", 8, "adam")]
    assert s.y.tolist() == [[3e9, 0.3, 1e9, 0.1]]
    assert s.y_mask.tolist() == [[True, True, True, True]]


def test_inference_labels_join_every_optimizer_of_their_configuration():
    s = by_key(build()[0])[("r1", 8, "sgd")]
    assert s.y.tolist() == [[2e9, 0.01, 1e9, 0.1]]


def test_a_mode_that_was_not_measured_is_masked():
    s = by_key(build()[0])[("r1", 16, "none")]
    assert s.y_mask.tolist() == [[False, False, True, True]]
    assert by_key(build()[0])[("v1", 8, "adam")].y_mask.tolist() == [[True, True, False, False]]


def test_censored_records_are_counted_not_learned():
    samples, info = build()
    assert info.censored == 1
    assert not any(key[:2] == ("v1", 64) for key in by_key(samples))
    assert info.samples == len(samples) == 4


def test_a_gpu_job_that_ran_out_of_memory_is_learned_as_a_lower_bound_at_its_limit():
    rows = [
        dataclasses.replace(record("g1", 8, "train", device=GPU, memory=9e9), context_bytes=5e8),
        dataclasses.replace(
            record("g1", 64, "train", device=GPU, oom=True, memory=40e9), context_bytes=5e8
        ),
        # without its context the limit says nothing of the reserved label
        record("g2", 64, "infer", device=GPU, oom=True, memory=40e9),
        dataclasses.replace(record("g2", 8, "infer", device=GPU), context_bytes=5e8),
    ]
    samples, info = build(rows, memory_label=targets.MemoryLabel.RESERVED)
    bounds = dataset.build_bounds(rows, info, graph_fn=fake_graphs)
    (bound,) = bounds
    k = info.metrics.index("train.memory_bytes")
    assert (bound.config_hash, bound.job_batch_size, bound.optimizer) == ("g1", 64, "adam")
    assert bound.y[0, k] == 40e9 - 5e8
    assert bound.y_mask[0].tolist() == [i == k for i in range(len(info.metrics))]
    assert bound.y_censor[0].tolist() == [int(i == k) for i in range(len(info.metrics))]
    assert len(samples) == 2, "the exact samples are what they were"


def test_a_cpu_cap_and_an_allocator_label_bound_nothing():
    cpu = [record("r1", 8, "infer", memory=1e9), record("r1", 64, "infer", oom=True, memory=8e9)]
    _, info = build(cpu)
    assert dataset.build_bounds(cpu, info, graph_fn=fake_graphs) == []
    gpu = [
        record("g1", 8, "infer", device=GPU, allocator=1e9),
        record("g1", 64, "infer", device=GPU, oom=True, memory=8e9),
    ]
    _, info = build(gpu, memory_label=targets.MemoryLabel.ALLOCATOR)
    assert dataset.build_bounds(gpu, info, graph_fn=fake_graphs) == []


def test_every_optimizer_is_learned_unless_one_is_chosen():
    assert build()[1].optimizers == ("adam", "sgd")
    samples, info = build(optimizer="sgd")
    assert info.optimizers == ("sgd",)
    assert {k[2] for k in by_key(samples)} == {"sgd", "none"}
    with pytest.raises(dataset.DatasetError, match="optimizer 'adamw'"):
        build(optimizer="adamw")


def test_metrics_without_labels_are_left_out_or_refused():
    assert not any("sm_util" in m for m in build()[1].metrics)
    with pytest.raises(dataset.DatasetError, match="no labels for"):
        build(metrics=["infer.sm_util_percent"])


def test_precision_and_optimizer_are_appended_to_the_global_features():
    s = by_key(build()[0])[("r1", 8, "sgd")]
    assert s.u.shape == (1, len(schema.GLOBAL_FEATURES) + len(targets.EXTRA_GLOBAL_FEATURES))
    assert s.u[0, -5:].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_mixed_devices_must_be_chosen_between():
    rows = [*ROWS, record("g1", 8, "infer", device=GPU, util=55.0)]
    with pytest.raises(dataset.DatasetError, match="choose one with --device"):
        dataset.select_records(rows)
    chosen = dataset.select_records(rows, GPU.slug())
    assert [r.config_hash for r in chosen] == ["g1"]
    info = build(chosen)[1]
    assert "infer.sm_util_percent" in info.metrics
    assert info.device_name == "NVIDIA A100-SXM4-80GB"


SLICE = dataclasses.replace(GPU, memory_bytes=10 << 30, mig_profile="1g.10gb")


def test_several_devices_are_chosen_by_name_or_pooled_under_one_label_source():
    rows = [record("g1", 8, "infer", device=GPU), record("g1", 8, "infer", device=SLICE)]
    with pytest.raises(dataset.DatasetError, match="choose one with --device"):
        dataset.select_records(rows)
    assert len(dataset.select_records(rows, pool=True)) == 2
    both = f"{GPU.slug()},{SLICE.slug()}/measured"
    assert dataset.select_records(rows, both, pool=True) == rows
    with pytest.raises(dataset.DatasetError, match="only for a device-aware checkpoint"):
        dataset.select_records(rows, both)
    with pytest.raises(dataset.DatasetError, match="none matched"):
        dataset.select_records(rows, f"{GPU.slug()},cuda-voodoo")
    # CPU and GPU rows, or measured and derived ones, are different labels: never pooled.
    with pytest.raises(dataset.DatasetError, match="one label source and device kind"):
        dataset.select_records([*rows, *ROWS], pool=True)
    derived = dataclasses.replace(
        rows[1], label_source=records.LabelSource.DERIVED_ALLOCATOR_REPLAY
    )
    with pytest.raises(dataset.DatasetError, match="one label source and device kind"):
        dataset.select_records([rows[0], derived], f"{GPU.slug()},{SLICE.slug()}", pool=True)


def test_a_device_aware_sample_set_pools_devices_each_sample_reading_its_own():
    """A cluster's observations come from whole GPUs and MIG slices; a device-aware model
    learns from all of them, the same configuration on two devices being two samples."""
    from kubeseer.hardware import mig
    from kubeseer.predictor import device

    rows = [
        record("g1", 8, "train", device=GPU, memory=3e9),
        record("g1", 8, "infer", device=GPU, memory=1e9),
        record("g1", 8, "train", device=SLICE, memory=3.1e9),
        record("g2", 8, "infer", device=SLICE, memory=2e9),
        record("g2", 64, "infer", device=SLICE, oom=True, memory=9e9),
    ]
    samples, info = build(
        rows, device_aware=True, metrics=["train.memory_bytes", "infer.memory_bytes"]
    )
    found = {(s.config_hash, float(s.device_x[0, 0])): s for s in samples}
    whole, sliced = mig.device("A100-SXM4-80GB"), mig.device("A100-SXM4-80GB", "1g.10gb")
    on_whole = float(device.features(whole, "fp32")[0, 0])
    on_slice = float(device.features(sliced, "fp32")[0, 0])
    assert on_whole != on_slice
    assert found[("g1", on_whole)].y.tolist() == [[3e9, 1e9]]
    assert found[("g1", on_slice)].y.tolist() == [[3.1e9, 0.0]]
    assert found[("g1", on_slice)].y_mask.tolist() == [[True, False]]
    assert len(samples) == 3
    assert info.device == f"{GPU.slug()},{SLICE.slug()}"
    assert info.device_name == "NVIDIA A100-SXM4-80GB"
    assert info.sources == (
        "NVIDIA A100-SXM4-80GB (measured): 2 records",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb (measured): 2 records",
    )
    assert info.censored == 1
    # The out-of-memory row of the slice bounds its sample, read on the slice.
    (bound,) = dataset.build_bounds(rows, info, graph_fn=fake_graphs)
    torch.testing.assert_close(bound.device_x, device.features(sliced, "fp32"))
    # Without a device-aware model the devices stay apart.
    with pytest.raises(dataset.DatasetError, match="choose one with --device"):
        build(rows)


def test_digest_ignores_record_order_but_not_labels():
    assert dataset.digest(ROWS) == dataset.digest(ROWS[::-1])
    changed = [*ROWS[:-1], record("v1", 64, "train", memory=1e9)]
    assert dataset.digest(changed) != dataset.digest(ROWS)


def test_graph_cache_round_trips_under_the_schema_version_and_graph_revision(tmp_path):
    cache = dataset.GraphCache(tmp_path)
    g = graph(4)
    cache.put("abc123", 32, g)
    path = cache.path("abc123", 32)
    version = f"v{schema.SCHEMA_VERSION}-r{dataset.GRAPH_REVISION}"
    assert version in path.parts and path.name == "b32.pt"
    loaded = cache.get("abc123", 32)
    assert torch.equal(loaded.x, g.x) and torch.equal(loaded.edge_index, g.edge_index)
    assert cache.get("abc123", 64) is None
    assert not list(path.parent.glob("*.tmp"))


def test_unreadable_cache_file_is_a_miss(tmp_path):
    cache = dataset.GraphCache(tmp_path)
    cache.path("abc", 1).parent.mkdir(parents=True)
    cache.path("abc", 1).write_bytes(b"truncated")
    assert cache.get("abc", 1) is None


def test_cache_rejects_path_like_hashes(tmp_path):
    with pytest.raises(dataset.DatasetError, match="alphanumeric"):
        dataset.GraphCache(tmp_path).path("../etc", 1)


def test_cached_graphs_are_used_and_unbuildable_specs_reported(tmp_path):
    cache = dataset.GraphCache(tmp_path)
    cache.put("r1", 8, graph(5))
    graphs, failures = dataset.build_graphs(
        {"r1": ("{}", {8}), "v1": ("not json", {8})}, cache_dir=tmp_path
    )
    assert graphs[("r1", 8)].x.shape[0] == 5
    assert len(failures) == 1 and failures[0].startswith("v1:")


def test_nothing_buildable_is_an_error():
    with pytest.raises(dataset.DatasetError):
        dataset.build_samples(ROWS, graph_fn=lambda spec, batches: {})


def test_cpu_step_time_is_learned_from_process_cpu_time_and_gpu_from_wall_time():
    cpu = by_key(build()[0])[("r1", 8, "adam")]
    assert cpu.y[0, 1] == 0.3  # the record's wall time is 0.9, its CPU time 0.3
    gpu_rows = [record("g1", 8, "infer", device=GPU, util=55.0, step=0.7)]
    gpu = build(gpu_rows)[0][0]
    assert gpu.y[0, -1] == pytest.approx(0.7)


def test_memory_can_be_learned_from_the_allocator_peak():
    rows = [
        record("r1", 8, "train", memory=3e9, allocator=2e9),
        record("r1", 8, "infer", memory=1e9, allocator=5e8),
    ]
    device_samples, device_info = build(rows)
    allocator_samples, allocator_info = build(rows, memory_label=targets.MemoryLabel.ALLOCATOR)
    assert device_samples[0].y[0, 0] == 3e9 and device_samples[0].y[0, 2] == 1e9
    assert allocator_samples[0].y[0, 0] == 2e9 and allocator_samples[0].y[0, 2] == 5e8
    assert allocator_info.memory_label is targets.MemoryLabel.ALLOCATOR
    assert allocator_info.digest != device_info.digest


def test_derived_rows_have_only_allocator_memory():
    """Derived fake-CUDA rows carry an allocator peak and nothing else."""
    rows = [record("r1", b, "infer", memory=None, step=None, allocator=b * 1e6) for b in (1, 8)]
    with pytest.raises(dataset.DatasetError, match="no labels"):
        build(rows)
    samples, info = build(rows, memory_label=targets.MemoryLabel.ALLOCATOR)
    assert info.metrics == ("infer.memory_bytes",)
    assert sorted(float(s.y[0, 0]) for s in samples) == [1e6, 8e6]


def test_select_metrics_narrows_and_reorders_label_columns():
    samples, info = build()
    narrowed = dataset.select_metrics(
        samples, info.metrics, ("infer.step_time_s", "train.memory_bytes")
    )
    s = by_key(narrowed)[("r1", 8, "adam")]
    assert s.y.tolist() == [[0.1, 3e9]]
    assert by_key(samples)[("r1", 8, "adam")].y.shape == (1, 4), "originals are untouched"
    only_infer = dataset.select_metrics(samples, info.metrics, ("infer.memory_bytes",))
    assert ("v1", 8, "adam") not in by_key(only_infer), "samples without the label are left out"


def test_memory_priors_come_from_each_graphs_memory_graph():
    from kubeseer.predictor import analytic_memory as am
    from kubeseer.predictor import prior

    def with_memory(spec_json, batches):
        graphs = fake_graphs(spec_json, batches)
        for b, g in graphs.items():
            g.memory_graph = am.MemoryGraph((am.OpNode("MatMul", 64 * b, 256),), ())
        return graphs

    samples, info = dataset.build_samples(ROWS, graph_fn=with_memory, memory_prior=True)
    s = by_key(samples)[("r1", 8, "sgd")]
    memory_graph = with_memory("{}", [8])[8].memory_graph
    expected = prior.log_priors(prior.breakdowns(memory_graph, Precision.FP32, "sgd"))
    assert s.prior_log.tolist() == [expected]
    narrowed = dataset.select_metrics(samples, info.metrics, ("infer.memory_bytes",))
    assert by_key(narrowed)[("r1", 8, "sgd")].prior_log.tolist() == [expected], (
        "priors keep one column per targets.METRICS entry"
    )
    with pytest.raises(dataset.DatasetError, match="no memory graph"):
        build(memory_prior=True)


def test_graph_cache_keeps_memory_graphs_beside_the_tensors(tmp_path):
    from kubeseer.predictor import analytic_memory as am

    cache = dataset.GraphCache(tmp_path)
    memory_graph = am.MemoryGraph((am.OpNode("Relu", 10, 0),), (), input_elements=10)
    assert cache.get_memory("abc", 4) is None
    cache.put_memory("abc", 4, memory_graph)
    assert cache.get_memory("abc", 4) == memory_graph
    assert cache.get_with_memory("abc", 4) is None, "the tensors are not cached yet"
    cache.put("abc", 4, graph(3))
    assert cache.get_with_memory("abc", 4).memory_graph == memory_graph
    assert cache.memory_path("abc", 4).parent.parent.parent.name == "memory-graphs"
    cache.memory_path("abc", 4).write_text("{not json")
    assert cache.get_memory("abc", 4) is None


def test_reserved_memory_is_the_device_figure_less_the_runtimes_context():
    rows = [
        dataclasses.replace(record("g1", 8, "infer", device=GPU, memory=3e9), context_bytes=5e8),
        # A record without its context has no reserved label.
        record("g2", 8, "infer", device=GPU, memory=2e9, step=0.5),
    ]
    samples, info = build(rows, memory_label=targets.MemoryLabel.RESERVED)
    memory = info.metrics.index("infer.memory_bytes")
    found = {s.config_hash: s for s in samples}
    assert found["g1"].y[0, memory] == 2.5e9
    assert not found["g2"].y_mask[0, memory]
    assert info.context_bytes == 5e8


def test_device_aware_samples_carry_the_records_gpu_and_its_cost_terms():
    from kubeseer.hardware import mig
    from kubeseer.predictor import cost_model, device

    rows = [record("g1", 8, "infer", device=GPU, util=55.0, step=0.7)]
    sample = build(rows, device_aware=True)[0][0]
    a100 = mig.device("A100-SXM4-80GB")
    torch.testing.assert_close(sample.device_x, device.features(a100, "fp32"))
    assert sample.cost_terms.shape == (1, len(cost_model.DEVICE_TERMS))
    unknown = dataclasses.replace(GPU, name="NVIDIA Voodoo 5")
    with pytest.raises(dataset.DatasetError, match="hardware table"):
        build([record("g1", 8, "infer", device=unknown)], device_aware=True)
