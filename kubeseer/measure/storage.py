"""Parquet storage: one append-only dataset directory per device, deduplicated on read.

A dataset directory holds immutable part files (`part-<UTC stamp>-<pid>-<n>.parquet`); writers
only ever add new parts, so an interrupted collection loses at most the rows it had not
flushed, and two collections can never corrupt each other's rows. Deduplication happens on
read (first written wins) and on `compact`, keyed by device, label source and
`Record.key` (config hash, batch size, mode, precision, optimizer).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from kubeseer.measure import records

PART_GLOB: Final[str] = "part-*.parquet"

DedupKey = tuple[str, str, str, int, str, str, str]

_counter = itertools.count()


def dedup_key(record: records.Record) -> DedupKey:
    """Key under which two rows describe the same measurement (same device, same source)."""
    return (record.device.slug(), record.label_source.value, *record.key)


def part_files(path: Path) -> list[Path]:
    """Every part file under `path` (a part file itself, a dataset, or a tree of datasets).

    Files are returned oldest first (by name, which starts with the UTC stamp), so that
    "first written wins" is well defined.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no dataset at {path}")
    return sorted(path.rglob(PART_GLOB), key=lambda p: (p.name, str(p)))


def _read_table(path: Path) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise records.SchemaError(f"{path}: not a readable Parquet file: {e}") from e
    version = (table.schema.metadata or {}).get(b"kubeseer.schema_version")
    if version != str(records.SCHEMA_VERSION).encode():
        raise records.SchemaError(
            f"{path}: schema version {version!r}, this reader understands {records.SCHEMA_VERSION}"
        )
    return table


def iter_records(path: Path) -> Iterator[records.Record]:
    """All rows under `path`, duplicates included, in write order."""
    for part in part_files(path):
        for row in _read_table(part).to_pylist():
            yield records.from_row(row)


def deduplicate(rows: Iterable[records.Record]) -> list[records.Record]:
    """Keep the first row of every `dedup_key`, preserving order."""
    seen: set[DedupKey] = set()
    kept: list[records.Record] = []
    for record in rows:
        key = dedup_key(record)
        if key not in seen:
            seen.add(key)
            kept.append(record)
    return kept


def read_records(path: str | os.PathLike[str]) -> list[records.Record]:
    """The deduplicated records of a dataset (or a tree of per-device datasets).

    This is the predictor's entry point into the measured data.

    Raises:
        FileNotFoundError: nothing exists at `path`.
        records.SchemaError: a part file was written under another schema version.
    """
    return deduplicate(iter_records(Path(path)))


def write_part(directory: Path, rows: list[records.Record]) -> Path:
    """Append `rows` to the dataset in `directory` as one new, immutable part file.

    The file is written under a temporary name and renamed, so a reader never sees half a part.
    """
    if not rows:
        raise ValueError("refusing to write an empty part file")
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"part-{stamp}-{os.getpid()}-{next(_counter):05d}.parquet"
    final = directory / name
    temporary = directory / f".{name}.tmp"
    pq.write_table(records.to_table(rows), temporary, compression="zstd")
    temporary.replace(final)
    return final


def compact(directory: Path) -> Path | None:
    """Rewrite a dataset's parts as one deduplicated part (rows in their original order).

    The new part is in place before the old ones are removed, so an interruption leaves
    duplicates (harmless: reads deduplicate) rather than a loss; parts a running collection
    adds meanwhile are left alone, so compacting a dataset being written to is safe.
    """
    parts = part_files(directory)
    if len(parts) <= 1:
        return parts[0] if parts else None
    rows = [records.from_row(row) for part in parts for row in _read_table(part).to_pylist()]
    merged = write_part(directory, deduplicate(rows))
    for part in parts:
        part.unlink()
    return merged


def merge(sources: Iterable[Path], destination: Path) -> dict[str, int]:
    """Copy the rows of `sources` into per-device datasets under `destination`.

    Rows already present in the destination win over incoming ones. Returns the number of
    rows each device dataset holds afterwards.
    """
    existing: list[records.Record] = []
    if destination.exists():
        existing = list(iter_records(destination))
    incoming = [row for source in sources for row in iter_records(source)]
    combined = deduplicate([*existing, *incoming])
    known = {dedup_key(r) for r in existing}
    by_device: dict[str, list[records.Record]] = {}
    for record in combined:
        if dedup_key(record) not in known:
            by_device.setdefault(record.device.slug(), []).append(record)
    for slug, rows in by_device.items():
        write_part(destination / slug, rows)
    counts: dict[str, int] = {}
    for record in combined:
        counts[record.device.slug()] = counts.get(record.device.slug(), 0) + 1
    return counts
