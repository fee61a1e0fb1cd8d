"""The observation store: a Parquet dataset on a directory (a PersistentVolume) or a bucket.

Layout under the root (a directory, or `s3://bucket/prefix`):

```
observations/obs-<observation id>.parquet   one finished attempt per file, written by the operator
observations/part-<UTC stamp>-<n>.parquet   many attempts, written by `compact`
graphs/<model sha256>/<bindings hash>-b<batch>.npz   PerfGraphs the records refer to
```

Why one file per attempt: the name is the observation's identifier, so writing an attempt
twice (an operator that restarts half-way, a repeated event) replaces the file with the same
record instead of adding a second one: writes are idempotent. A file is whole or absent: on a
directory it is written under a hidden temporary name, flushed to disk and renamed into place;
on S3 an object appears only when its upload completes. An operator killed mid-write therefore
leaves at most a hidden temporary file, which readers ignore. A file that is damaged anyway
(a truncated copy, a disk error) is reported by `read` and skipped; every other file is still
read, and `compact` never deletes a file it could not read.

The records live outside the Kubernetes API, so deleting a DLJob or restarting the operator
loses none of them. Reads keep, per identifier, the record written last (`recorded_at`).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import secrets
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kubeseer import digests, units
from kubeseer.observations import record

OBSERVATIONS: Final[str] = "observations"
GRAPHS: Final[str] = "graphs"
MAX_FILE_BYTES: Final[int] = 256 * units.MIB
"""Largest file the store reads (a PerfGraph of a very large model is tens of MiB)."""

_counter = itertools.count()


class StoreError(Exception):
    """The store cannot be reached or written (the caller may retry later)."""


class _Backend(Protocol):
    """Whole-file operations on names relative to the store's root."""

    def list(self, prefix: str) -> list[str]: ...

    def read(self, name: str) -> bytes: ...

    def write(self, name: str, data: bytes) -> None: ...

    def delete(self, name: str) -> None: ...

    def exists(self, name: str) -> bool: ...


class DirectoryBackend:
    """A directory: atomic writes by temporary file, fsync and rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __str__(self) -> str:
        return str(self.root)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def read(self, name: str) -> bytes:
        path = self.root / name
        if path.stat().st_size > MAX_FILE_BYTES:
            raise OSError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        return path.read_bytes()

    def write(self, name: str, data: bytes) -> None:
        final = self.root / name
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.parent / f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            with temporary.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, final)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        directory = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()


class S3Backend:
    """An S3-compatible bucket through pyarrow's S3 filesystem (PUT is atomic per object)."""

    def __init__(self, filesystem: pafs.FileSystem, bucket: str, prefix: str) -> None:
        self.filesystem = filesystem
        self.base = "/".join(p for p in (bucket, prefix.strip("/")) if p)

    def __str__(self) -> str:
        return f"s3://{self.base}"

    def _path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def list(self, prefix: str) -> list[str]:
        selector = pafs.FileSelector(self._path(prefix), recursive=True, allow_not_found=True)
        infos = self.filesystem.get_file_info(selector)
        names = []
        for info in infos:
            if info.type == pafs.FileType.File and not info.base_name.startswith("."):
                names.append(info.path[len(self.base) + 1 :])
        return sorted(names)

    def read(self, name: str) -> bytes:
        info = self.filesystem.get_file_info(self._path(name))
        if info.size is not None and info.size > MAX_FILE_BYTES:
            raise OSError(f"{self._path(name)} is larger than {MAX_FILE_BYTES} bytes")
        with self.filesystem.open_input_stream(self._path(name)) as f:
            return bytes(f.read())

    def write(self, name: str, data: bytes) -> None:
        with self.filesystem.open_output_stream(self._path(name)) as f:
            f.write(data)

    def delete(self, name: str) -> None:
        self.filesystem.delete_file(self._path(name))

    def exists(self, name: str) -> bool:
        return bool(self.filesystem.get_file_info(self._path(name)).type == pafs.FileType.File)


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible endpoint (the admin's; the store never guesses one)."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 30.0


def _s3_filesystem(settings: S3Settings) -> pafs.FileSystem:
    options: dict[str, object] = {
        "region": settings.region,
        "connect_timeout": settings.connect_timeout_s,
        "request_timeout": settings.request_timeout_s,
        "allow_bucket_creation": False,
        "allow_bucket_deletion": False,
    }
    if settings.endpoint_url:
        parts = urllib.parse.urlsplit(settings.endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise StoreError(f"S3 endpoint {settings.endpoint_url!r} is not an http(s) URL")
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme
    if settings.access_key_id and settings.secret_access_key:
        options["access_key"] = settings.access_key_id
        options["secret_key"] = settings.secret_access_key
        if settings.session_token:
            options["session_token"] = settings.session_token
    else:
        options["anonymous"] = True
    return pafs.S3FileSystem(**options)


@dataclass(frozen=True)
class ReadResult:
    """Every readable observation (one per identifier), and the files that could not be read."""

    observations: list[record.Observation]
    damaged: list[str]


class Store:
    """Observations and the PerfGraphs they refer to, on a directory or a bucket.

    Args:
        backend: where the files live (`open_store` builds one from a location).
    """

    def __init__(self, backend: _Backend) -> None:
        self.backend = backend

    def __str__(self) -> str:
        return str(self.backend)

    # -- observations ---------------------------------------------------------------------------

    @staticmethod
    def name(observation_id: str) -> str:
        """Where an observation's own file lives."""
        if not observation_id.isalnum():
            raise ValueError(f"observation id {observation_id!r} is not alphanumeric")
        return f"{OBSERVATIONS}/obs-{observation_id}.parquet"

    def put(self, observation: record.Observation) -> str:
        """Write one observation (replacing an earlier write of the same attempt).

        Raises:
            StoreError: the write failed; nothing partial is left visible.
        """
        name = self.name(observation.observation_id)
        try:
            self.backend.write(name, _parquet([observation]))
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"writing {name} to {self}: {e}") from e
        return name

    def exists(self, observation_id: str) -> bool:
        """Whether the attempt was recorded in its own file (compacted records do not count)."""
        try:
            return self.backend.exists(self.name(observation_id))
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"looking for {observation_id} in {self}: {e}") from e

    def read(self) -> ReadResult:
        """All observations, the latest write of each attempt; damaged files are listed apart.

        Raises:
            StoreError: the store cannot be listed.
        """
        latest, _, damaged = self._scan()
        ordered = sorted(latest.values(), key=lambda o: (o.finished_at, o.observation_id))
        return ReadResult(ordered, damaged)

    def compact(self) -> int:
        """Merge every readable observation file into one part; returns the records kept.

        The part is written before the files it replaces are deleted, so an interruption
        leaves duplicates (reads keep one) and never a loss; damaged files are left in place.

        Raises:
            StoreError: the store cannot be listed or written.
        """
        latest, read, _ = self._scan()
        if len(read) <= 1:
            return len(latest)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        part = f"{OBSERVATIONS}/part-{stamp}-{os.getpid()}-{next(_counter):05d}.parquet"
        ordered = sorted(latest.values(), key=lambda o: (o.finished_at, o.observation_id))
        try:
            self.backend.write(part, _parquet(ordered))
            for name in read:
                self.backend.delete(name)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"compacting {self}: {e}") from e
        return len(latest)

    def _scan(self) -> tuple[dict[str, record.Observation], list[str], list[str]]:
        """(latest observation per identifier, files read, damaged files with the reason)."""
        try:
            names = [n for n in self.backend.list(OBSERVATIONS) if n.endswith(".parquet")]
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"listing {self}: {e}") from e
        latest: dict[str, record.Observation] = {}
        read: list[str] = []
        damaged: list[str] = []
        for name in names:
            try:
                rows = _rows(self.backend.read(name))
            except (OSError, pa.ArrowException, record.SchemaError) as e:
                damaged.append(f"{name}: {e}")
                continue
            read.append(name)
            for observation in rows:
                kept = latest.get(observation.observation_id)
                if kept is None or observation.recorded_at > kept.recorded_at:
                    latest[observation.observation_id] = observation
        return latest, read, damaged

    # -- PerfGraphs -----------------------------------------------------------------------------

    @staticmethod
    def graph_name(model_digest: str, inputs_json: str, batch_size: int) -> str:
        """Where the PerfGraph of a model at a batch size and bindings lives."""
        if not digests.is_sha256(model_digest):
            raise ValueError(f"model digest {model_digest!r} is not a sha256")
        bindings = hashlib.sha256(inputs_json.encode()).hexdigest()[:16]
        return f"{GRAPHS}/{model_digest}/{bindings}-b{int(batch_size)}.npz"

    def put_graph(self, name: str, data: bytes) -> None:
        """Store a PerfGraph file once (a graph is a function of its name)."""
        try:
            if not self.backend.exists(name):
                self.backend.write(name, data)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"writing {name} to {self}: {e}") from e

    def get_graph(self, name: str) -> bytes | None:
        """A stored PerfGraph file, or None."""
        try:
            if not self.backend.exists(name):
                return None
            return self.backend.read(name)
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"reading {name} from {self}: {e}") from e


def _parquet(observations: Iterable[record.Observation]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(record.to_table(list(observations)), sink, compression="zstd")
    return sink.getvalue()


def _rows(data: bytes) -> list[record.Observation]:
    table = pq.read_table(io.BytesIO(data))
    version = (table.schema.metadata or {}).get(b"kubeseer.observations.schema_version")
    if version != str(record.SCHEMA_VERSION).encode():
        raise record.SchemaError(f"schema version {version!r}")
    return [record.from_row(row) for row in table.to_pylist()]


def open_store(location: str, s3: S3Settings | None = None) -> Store:
    """A store at a directory path (or `file://` URL) or `s3://bucket/prefix`.

    Raises:
        StoreError: an unknown scheme, or `s3://` without a bucket.
    """
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StoreError(f"{location!r} names no bucket")
        return Store(S3Backend(_s3_filesystem(s3 or S3Settings()), parts.netloc, parts.path))
    if parts.scheme in ("", "file"):
        return Store(DirectoryBackend(Path(parts.path if parts.scheme else location)))
    raise StoreError(f"{location!r}: the store is a directory or s3://bucket/prefix")
