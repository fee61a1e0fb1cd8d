"""Per pod and device: peak and mean memory and SM activity, with the warm-up left out.

The measurement harness (`kubeseer.measure.cuda.Sampler`) samples memory over the whole task,
because the peak can come from building the model or the first step, and averages utilisation
only over the timed iterations, after the warm-up. The agent cannot see iterations, so its
warm-up is a time: the first `warmup_s` seconds after the pod is first seen on the device.
Memory's peak covers the whole life; mean memory and SM activity (mean and peak) cover only the
samples after the warm-up. A pod that ends inside its warm-up has a peak and no means.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeseer.profiler import attribution


@dataclass
class Window:
    """What one pod did on one device so far (mutable: the agent folds samples in)."""

    pod: attribution.PodInfo
    device_uuid: str
    model_name: str
    mig_profile: str | None
    gpu_instance_id: int | None
    started: float
    started_at: datetime
    warmup_s: float
    last: float = 0.0
    last_at: datetime | None = None
    samples: int = 0
    memory_samples: int = 0
    peak_memory_bytes: int | None = None
    last_memory_bytes: int | None = None
    memory_source: str | None = None
    _memory_sum: float = 0.0
    _memory_count: int = 0
    _sm_sum: float = 0.0
    _sm_count: int = 0
    peak_sm_percent: float | None = None
    sm_source: str = ""

    def add(self, reading: attribution.PodReading, now: float, now_at: datetime) -> None:
        """Fold one reading taken at monotonic `now` (wall time `now_at`) into the window."""
        self.pod = reading.pod
        self.samples += 1
        self.last, self.last_at = now, now_at
        self.sm_source = reading.sm_source
        warmed = now - self.started >= self.warmup_s
        if reading.memory_bytes is not None:
            self.memory_samples += 1
            self.last_memory_bytes = reading.memory_bytes
            self.memory_source = reading.memory_source.value if reading.memory_source else None
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, reading.memory_bytes)
            if warmed:
                self._memory_sum += reading.memory_bytes
                self._memory_count += 1
        if warmed and reading.sm_percent is not None:
            self._sm_sum += reading.sm_percent
            self._sm_count += 1
            self.peak_sm_percent = max(self.peak_sm_percent or 0.0, reading.sm_percent)

    @property
    def warmed_up(self) -> bool:
        """Some samples fell after the warm-up."""
        return self.last - self.started >= self.warmup_s

    @property
    def mean_memory_bytes(self) -> float | None:
        """Mean memory after the warm-up."""
        return self._memory_sum / self._memory_count if self._memory_count else None

    @property
    def mean_sm_percent(self) -> float | None:
        """Mean SM activity after the warm-up (None: unavailable, shared, or still warming)."""
        return self._sm_sum / self._sm_count if self._sm_count else None

    @property
    def sm_samples(self) -> int:
        """SM activity readings averaged into `mean_sm_percent`."""
        return self._sm_count


class Windows:
    """Every open window, keyed by (pod UID, device UUID).

    Args:
        warmup_s: seconds after a pod is first seen on a device that the means leave out.
    """

    def __init__(self, warmup_s: float) -> None:
        if warmup_s < 0:
            raise ValueError(f"warm-up must be >= 0 s, got {warmup_s}")
        self.warmup_s = warmup_s
        self._open: dict[tuple[str, str], Window] = {}

    def add(
        self, readings: tuple[attribution.PodReading, ...], now: float, now_at: datetime
    ) -> None:
        """Fold one sampling round in, opening windows for pods seen for the first time."""
        for reading in readings:
            key = (reading.pod.uid, reading.device.uuid)
            window = self._open.get(key)
            if window is None:
                window = Window(
                    pod=reading.pod,
                    device_uuid=reading.device.uuid,
                    model_name=reading.device.model_name,
                    mig_profile=reading.device.mig_profile,
                    gpu_instance_id=reading.device.gpu_instance_id,
                    started=now,
                    started_at=now_at,
                    warmup_s=self.warmup_s,
                )
                self._open[key] = window
            window.add(reading, now, now_at)

    def of_pod(self, uid: str) -> list[Window]:
        """The pod's windows, one per device it was seen on."""
        return [w for (pod, _), w in self._open.items() if pod == uid]

    def pods(self) -> set[str]:
        """UIDs of pods with an open window."""
        return {pod for pod, _ in self._open}

    def close(self, uid: str) -> list[Window]:
        """Remove and return the pod's windows (it ended)."""
        keys = [k for k in self._open if k[0] == uid]
        return [self._open.pop(k) for k in keys]
