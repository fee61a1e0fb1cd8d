"""A predictor checkpoint that can be replaced while the operator runs (issue 21).

The retraining CronJob writes a new checkpoint; an admin publishes it where
`KUBESEER_PREDICTOR_CHECKPOINT` points (a file on a volume, or a key of a mounted ConfigMap,
whose update the kubelet makes by swapping a symlink). `SwappingPredictor` checks that file
every `KUBESEER_CHECKPOINT_CHECK_S` seconds (`watch`, on a thread of its own) and, when it has
changed, loads it beside the one serving and then swaps them: a prediction already running
finishes on the old one, every later one uses the new one. A file that does not load (half
written, another schema) is logged and the serving checkpoint kept; it is tried again once the
file changes again.

Every prediction names the checkpoint that made it: its `predictor_version` gains
`checkpoint <first 12 hex digits of the checkpoint's fingerprint>`, which goes into the DLJob's
`status.prediction` and the pods' `kubeseer.io/predictor-version` annotation (the learning
loop keeps each checkpoint's errors apart by it). Each checkpoint keeps its own prediction
cache, so an answer cached by the old one is never served as the new one's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from kubeseer.operator import predict
from kubeseer.prediction import Attention, Mode, Precision, Prediction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """A loaded checkpoint ready to predict, and its name (`checkpoint <fingerprint>`)."""

    predictor: predict.Predictor
    name: str


Loader = Callable[[Path], Loaded]
"""Loads the checkpoint file at a path; raises `ValueError` (or an `OSError`) if it cannot."""

_Stamp = tuple[int, int, int]
"""What says a file changed: (inode, size, modification time in ns) of its target."""


def _stamp(path: Path) -> _Stamp | None:
    try:
        st = os.stat(path)  # follows the symlink a ConfigMap volume updates by swapping
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SwappingPredictor:
    """`predict.Predictor` over the checkpoint file at `path`, swapped when the file changes.

    Args:
        path: the checkpoint file to follow.
        load: how a file becomes a `Loaded` (`main.load_checkpoint`).
        first: the checkpoint serving from the start (already loaded from `path`).
    """

    def __init__(self, path: Path, load: Loader, first: Loaded) -> None:
        self.path = path
        self._load = load
        self._lock = threading.Lock()
        self._serving = first
        self._seen = _stamp(path)

    @property
    def name(self) -> str:
        """The name of the checkpoint serving now."""
        with self._lock:
            return self._serving.name

    def check(self) -> bool:
        """Load the file if it changed since it was last seen; True if it now serves.

        Never raises: a file that cannot be loaded is logged and left for its next change.
        """
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._seen:
            return False
        self._seen = stamp
        try:
            loaded = self._load(self.path)
        except (ValueError, OSError) as e:
            log.warning(
                "predictor checkpoint %s changed but does not load (%s); still serving %s",
                self.path,
                e,
                self.name,
            )
            return False
        with self._lock:
            before, self._serving = self._serving, loaded
        log.info("predictor checkpoint %s: %s replaces %s", self.path, loaded.name, before.name)
        return True

    def watch(self, stop: threading.Event, period_s: float) -> None:
        """`check` every `period_s` seconds until `stop` is set."""
        while not stop.wait(period_s):
            self.check()

    def cached(
        self,
        model_digest: str,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention = Attention.AUTO,
    ) -> Prediction | None:
        """The serving checkpoint's cached prediction, named."""
        serving = self._current()
        found = serving.predictor.cached(
            model_digest, batch_size, mode, precision, inputs=inputs, attention=attention
        )
        return None if found is None else named(found, serving.name)

    def predict(
        self,
        model: bytes | Path,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention = Attention.AUTO,
    ) -> Prediction:
        """Predict with the serving checkpoint, named."""
        serving = self._current()
        made = serving.predictor.predict(
            model, batch_size, mode, precision, inputs=inputs, attention=attention
        )
        return named(made, serving.name)

    def _current(self) -> Loaded:
        with self._lock:
            return self._serving


def named(prediction: Prediction, checkpoint: str) -> Prediction:
    """The prediction with its checkpoint's name in `predictor_version` (once)."""
    if prediction.predictor_version.endswith(checkpoint):
        return prediction
    return replace(prediction, predictor_version=f"{prediction.predictor_version}, {checkpoint}")
