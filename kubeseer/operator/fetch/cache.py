"""Verified models on disk, named by their sha256, bounded in bytes (least recently used out).

A file lands here only after its bytes hashed to its name, through a temporary file beside the
cache and an atomic rename. Whoever reads a model takes a private hard link to it (`checkout`),
so that eviction by a concurrent fetch can remove the name but never the bytes being read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from kubeseer import digests
from kubeseer.operator.fetch import errors

_PARTIAL = ".partial-"
_CHECKOUT = ".inuse-"
_STALE_S = 24 * 3600.0


class DigestCache:
    """Models under `root` named by sha256, at most `max_bytes` of them (LRU by mtime).

    Args:
        root: the cache directory (created on first write).
        max_bytes: bound on the named models; checked-out links do not count.
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def get(self, digest: str) -> tuple[Path, int] | None:
        """The cached model and its size, marked as recently used; None when absent."""
        path = self.root / digest
        try:
            os.utime(path)
            return path, path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise errors.CacheError(f"cannot use the model cache at {self.root}: {e}") from e

    @contextlib.contextmanager
    def staging(self) -> Iterator[tuple[Path, BinaryIO]]:
        """A temporary file beside the cache (same file system, so `put` is an atomic rename)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.root, prefix=_PARTIAL)
        except OSError as e:
            raise errors.CacheError(f"cannot write to the model cache at {self.root}: {e}") from e
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as sink:
                yield path, sink
        finally:
            path.unlink(missing_ok=True)

    def put(self, staged: Path, digest: str) -> Path:
        """Move a staged file under its digest and evict past the bound."""
        final = self.root / digest
        try:
            os.replace(staged, final)
        except OSError as e:
            raise errors.CacheError(
                f"cannot store the model in the cache at {self.root}: {e}"
            ) from e
        self._evict(keep=final)
        return final

    def checkout(self, digest: str) -> Path:
        """A private name for the cached model that eviction leaves alone; the caller unlinks it.

        Raises:
            CacheError: the model is no longer cached, or the link cannot be made.
        """
        link = self.root / f"{_CHECKOUT}{uuid.uuid4().hex}"
        try:
            os.link(self.root / digest, link)
        except OSError as e:
            raise errors.CacheError(f"cannot read model {digest} from the cache: {e}") from e
        return link

    def sweep(self) -> None:
        """Remove staged files and checkouts a crashed process left behind (a day old)."""
        cutoff = time.time() - _STALE_S
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.iterdir():
                if path.name.startswith((_PARTIAL, _CHECKOUT)):
                    with contextlib.suppress(FileNotFoundError):
                        if path.stat().st_mtime < cutoff:
                            path.unlink()

    def _evict(self, keep: Path) -> None:
        entries = []
        for path in self.root.iterdir():
            if not digests.is_sha256(path.name):
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                entries.append((stat.st_mtime, path, stat.st_size))
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries, key=lambda e: (e[0], e[1].name)):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
