"""The one prediction cache, keyed by everything that changes the answer.

A prediction is deterministic in its request and its checkpoint, and the operator asks the same
question on every reconcile of a job (and for every replica, retry and sweep of a model), so
the predictor remembers its answers. The key is the whole request: leaving any part out serves
one job another job's figures (a 65,536-token sequence once got a 16-token one's 600 MiB). It
holds the checkpoint's identity too, so that a cache can never answer with figures of weights
or margins it no longer holds.

No torch here: the operator looks answers up by the model's digest before it fetches the model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from kubeseer.prediction import Attention, Mode, Precision, Prediction
from kubeseer.predictor import targets


@dataclass(frozen=True)
class Key:
    """A prediction request in full, with its model known by digest.

    Attributes:
        checkpoint: identity of the predictor's checkpoint (`checkpoint.fingerprint`).
        model_digest: sha256 of the serialised ONNX model.
        batch_size: samples per step.
        mode: train or infer.
        precision: fp32, fp16 or bf16.
        optimizer: the training optimizer; `targets.NO_OPTIMIZER` for inference, whatever the
            caller passed.
        inputs: every bound symbolic dimension, sorted by name.
        gpu: the GPU asked about (it decides a warning), or None.
        attention: the kernel the job's attention runs.
    """

    checkpoint: str
    model_digest: str
    batch_size: int
    mode: Mode
    precision: Precision
    optimizer: str
    inputs: tuple[tuple[str, int], ...]
    gpu: str | None
    attention: Attention = Attention.AUTO


def key(
    checkpoint: str,
    model_digest: str,
    batch_size: int,
    mode: Mode,
    precision: Precision,
    *,
    optimizer: str,
    inputs: Mapping[str, int] | None,
    gpu: str | None,
    attention: Attention = Attention.AUTO,
) -> Key:
    """The key of a request, written one way whatever order or spelling the caller used."""
    return Key(
        checkpoint=checkpoint,
        model_digest=model_digest,
        batch_size=batch_size,
        mode=mode,
        precision=precision,
        optimizer=optimizer if mode is Mode.TRAIN else targets.NO_OPTIMIZER,
        inputs=tuple(sorted((name, int(value)) for name, value in (inputs or {}).items())),
        gpu=gpu,
        attention=attention,
    )


class PredictionCache:
    """A least-recently-used map from `Key` to `Prediction`, safe to share between threads.

    Predictions are computed outside the lock: two threads asking the same new question may both
    compute it (the same answer, stored twice), which costs less than holding every other
    request back while one is computed.

    Args:
        size: predictions kept; the least recently used go first.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cache size must not be negative, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Prediction] = OrderedDict()

    def get(self, request: Key) -> Prediction | None:
        """The prediction stored for `request`, or None."""
        with self._lock:
            made = self._entries.get(request)
            if made is not None:
                self._entries.move_to_end(request)
            return made

    def put(self, request: Key, prediction: Prediction) -> None:
        """Store `prediction` for `request`, dropping the least recently used beyond `size`."""
        with self._lock:
            self._entries[request] = prediction
            self._entries.move_to_end(request)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
