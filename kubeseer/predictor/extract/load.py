"""Reading a model within its size limit: a file is memory-mapped, never read whole; the digest
is hashed beside the rest of the extraction; bytes that are not ONNX are refused clearly."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import onnx
from google.protobuf import message

from kubeseer import units
from kubeseer.predictor import errors
from kubeseer.predictor.extract import wire

Source = str | os.PathLike[str] | bytes | onnx.ModelProto


DEFAULT_MAX_BYTES: Final[int] = units.GIB
"""Largest serialised model accepted (1 GiB); protobuf itself stops at 2 GiB."""


@contextlib.contextmanager
def serialised(source: Source, max_bytes: int) -> Iterator[bytes | mmap.mmap]:
    """The serialised model within the size limit: a file is memory-mapped, not read.

    Mapping lets the hash and the weight-skipping parser (`wire.skeleton`) touch the pages in
    place, so a model with inline weights is never copied.
    """
    if isinstance(source, onnx.ModelProto):
        check_size(source.ByteSize(), max_bytes)
        yield source.SerializeToString()
        return
    if isinstance(source, bytes):
        check_size(len(source), max_bytes)
        yield source
        return
    path = Path(source)
    try:
        size = path.stat().st_size
        check_size(size, max_bytes)
        file = path.open("rb")
    except OSError as e:
        raise errors.NotOnnxError(f"cannot read ONNX model {path}: {e.strerror}") from e
    with file:
        if size == 0:
            yield b""
            return
        try:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise errors.NotOnnxError(f"cannot map ONNX model {path}: {e}") from e
        with mapped:
            yield mapped


class Digest:
    """sha256 of the serialised model, computed beside the extraction for large models.

    hashlib releases the GIL while hashing, so on a model with inline weights the hash (the
    single largest cost) overlaps parsing, shape inference and feature building.
    """

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self._hash = hashlib.sha256()
        self._thread: threading.Thread | None = None
        if len(data) > wire.SKELETON_MIN_MODEL_BYTES:
            self._thread = threading.Thread(target=self._hash.update, args=(data,), daemon=True)
            self._thread.start()
        else:
            self._hash.update(data)

    def wait(self) -> None:
        """Block until the hash has read all the data."""
        if self._thread is not None:
            self._thread.join()

    def hexdigest(self) -> str:
        """The hex sha256, once complete."""
        self.wait()
        return self._hash.hexdigest()


def parse(data: bytes | mmap.mmap) -> onnx.ModelProto:
    if not len(data):
        raise errors.NotOnnxError("the ONNX model is empty (0 bytes)")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(
            wire.skeleton(data) if len(data) > wire.SKELETON_MIN_MODEL_BYTES else bytes(data)
        )
    except (message.DecodeError, ValueError) as e:
        raise errors.NotOnnxError(f"not an ONNX model, or a truncated one: {e}") from e
    return model


def check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise errors.ModelTooLargeError(
            f"the serialised model is {size} bytes, above the limit of {max_bytes} bytes; "
            "store weights as external data (torch.onnx.export does by default)"
        )
