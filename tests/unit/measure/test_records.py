import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kubeseer.measure import records, storage


def test_records_survive_a_parquet_round_trip_unchanged(tmp_path, make_record):
    rows = [make_record(), make_record(batch_size=16, status=records.Status.OUT_OF_MEMORY)]
    storage.write_part(tmp_path, rows)
    assert storage.read_records(tmp_path) == rows


def test_parquet_files_carry_the_schema_version(tmp_path, make_record):
    part = storage.write_part(tmp_path, [make_record()])
    metadata = pq.read_schema(part).metadata
    assert metadata[b"kubeseer.schema_version"] == str(records.SCHEMA_VERSION).encode()


def test_reading_a_file_of_another_schema_version_is_refused(tmp_path, make_record):
    part = storage.write_part(tmp_path, [make_record()])
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata({"kubeseer.schema_version": "0"}), part)
    with pytest.raises(records.SchemaError, match="schema version"):
        storage.read_records(tmp_path)


def test_reading_keeps_the_first_row_of_each_key(tmp_path, make_record):
    first = make_record(step_time_median_s=0.010)
    storage.write_part(tmp_path, [first])
    storage.write_part(tmp_path, [make_record(step_time_median_s=0.5)])
    assert storage.read_records(tmp_path) == [first]


def test_derived_and_measured_labels_of_one_config_are_both_kept(tmp_path, make_record):
    derived = make_record(label_source=records.LabelSource.DERIVED_FAKE_CUDA_ALLOCATOR)
    storage.write_part(tmp_path, [make_record(), derived])
    assert len(storage.read_records(tmp_path)) == 2


def test_compacting_leaves_one_part_with_the_deduplicated_rows(tmp_path, make_record):
    storage.write_part(tmp_path, [make_record()])
    storage.write_part(tmp_path, [make_record(), make_record(batch_size=1)])
    compacted = storage.compact(tmp_path)
    assert storage.part_files(tmp_path) == [compacted]
    assert [r.batch_size for r in storage.read_records(tmp_path)] == [8, 1]


def test_merge_writes_one_dataset_per_device(tmp_path, make_record):
    a, b = tmp_path / "a", tmp_path / "b"
    storage.write_part(a, [make_record()])
    cpu_device = dataclasses.replace(
        make_record().device, kind=records.DeviceKind.CPU, name="AMD EPYC", mig_profile=None
    )
    storage.write_part(b, [make_record(device=cpu_device), make_record()])
    counts = storage.merge([a, b], tmp_path / "merged")
    assert counts == {"cuda-nvidia-a100-sxm4-80gb-1g-10gb": 1, "cpu-amd-epyc": 1}
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == sorted(counts)


def test_censored_rows_report_censored(make_record):
    assert make_record(status=records.Status.OUT_OF_MEMORY).censored
    assert not make_record().censored


def test_reading_a_missing_dataset_names_the_path(tmp_path, make_record):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        storage.read_records(tmp_path / "nowhere")


def test_every_column_is_documented_with_its_unit_in_docs_dataset_md():
    docs = (Path(__file__).resolve().parents[3] / "docs" / "dataset.md").read_text()
    for name in records.SCHEMA.names:
        assert f"| `{name}` |" in docs, name
    assert f"## Schema (version {records.SCHEMA_VERSION})" in docs


def test_every_file_explains_its_targets(tmp_path, make_record):
    part = storage.write_part(tmp_path, [make_record()])
    targets = json.loads(pq.read_schema(part).metadata[b"kubeseer.targets"])
    assert set(targets) == set(records.TARGET_LABELS)
