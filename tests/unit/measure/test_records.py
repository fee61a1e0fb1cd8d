import dataclasses

import pyarrow.parquet as pq
import pytest

from kubeseer.measure import records, storage


def make_record(**changes) -> records.Record:
    device = records.DeviceDescriptor(
        kind=records.DeviceKind.CUDA,
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 * 2**30,
        sm_count=108,
        cores=None,
        mig_profile="1g.10gb",
        driver_version="560.35.03",
        cuda_version="13.0",
        torch_version="2.13.0",
    )
    record = records.Record(
        schema_version=records.SCHEMA_VERSION,
        config_hash="0123456789abcdef",
        family="mlp",
        spec_json='{"arch":{},"family":"mlp","input":{}}',
        batch_size=8,
        mode="train",
        precision="bf16",
        optimizer="adam",
        device=device,
        label_source=records.LabelSource.MEASURED,
        status=records.Status.OK,
        plan="tiny",
        flops=12_345,
        params=678,
        warmup_iterations=5,
        timed_iterations=30,
        step_time_mean_s=0.012,
        step_time_median_s=0.011,
        step_time_p95_s=0.02,
        memory_bytes=1_500_000_000,
        context_bytes=500_000_000,
        allocator_peak_allocated_bytes=900_000_000,
        allocator_peak_reserved_bytes=1_000_000_000,
        rss_baseline_bytes=None,
        rss_peak_delta_bytes=None,
        sm_util_mean_percent=61.5,
        sm_util_peak_percent=93.0,
        utilisation_source="gpm-sm-activity",
        utilisation_samples=40,
        energy_j=12.5,
        threads=None,
        started_at="2026-11-22T03:00:00+00:00",
        finished_at="2026-11-22T03:00:05+00:00",
    )
    return dataclasses.replace(record, **changes)


def test_records_survive_a_parquet_round_trip_unchanged(tmp_path):
    rows = [make_record(), make_record(batch_size=16, status=records.Status.OUT_OF_MEMORY)]
    storage.write_part(tmp_path, rows)
    assert storage.read_records(tmp_path) == rows


def test_parquet_files_carry_the_schema_version(tmp_path):
    part = storage.write_part(tmp_path, [make_record()])
    metadata = pq.read_schema(part).metadata
    assert metadata[b"kubeseer.schema_version"] == str(records.SCHEMA_VERSION).encode()


def test_reading_a_file_of_another_schema_version_is_refused(tmp_path):
    part = storage.write_part(tmp_path, [make_record()])
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata({"kubeseer.schema_version": "0"}), part)
    with pytest.raises(records.SchemaError, match="schema version"):
        storage.read_records(tmp_path)


def test_reading_keeps_the_first_row_of_each_key(tmp_path):
    first = make_record(step_time_median_s=0.010)
    storage.write_part(tmp_path, [first])
    storage.write_part(tmp_path, [make_record(step_time_median_s=0.5)])
    assert storage.read_records(tmp_path) == [first]


def test_derived_and_measured_labels_of_one_config_are_both_kept(tmp_path):
    derived = make_record(label_source=records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR)
    storage.write_part(tmp_path, [make_record(), derived])
    assert len(storage.read_records(tmp_path)) == 2


def test_compacting_leaves_one_part_with_the_deduplicated_rows(tmp_path):
    storage.write_part(tmp_path, [make_record()])
    storage.write_part(tmp_path, [make_record(), make_record(batch_size=1)])
    compacted = storage.compact(tmp_path)
    assert storage.part_files(tmp_path) == [compacted]
    assert [r.batch_size for r in storage.read_records(tmp_path)] == [8, 1]


def test_merge_writes_one_dataset_per_device(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    storage.write_part(a, [make_record()])
    cpu_device = dataclasses.replace(
        make_record().device, kind=records.DeviceKind.CPU, name="AMD EPYC", mig_profile=None
    )
    storage.write_part(b, [make_record(device=cpu_device), make_record()])
    counts = storage.merge([a, b], tmp_path / "merged")
    assert counts == {"cuda-nvidia-a100-sxm4-80gb-1g-10gb": 1, "cpu-amd-epyc": 1}
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == sorted(counts)


def test_censored_rows_report_censored():
    assert make_record(status=records.Status.OUT_OF_MEMORY).censored
    assert not make_record().censored


def test_reading_a_missing_dataset_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        storage.read_records(tmp_path / "nowhere")
