"""The operator's configuration: one typed object, read once at start from `KUBESEER_*` variables.

Every setting has a documented default (docs/dljob.md, "Running the operator"), so an operator
with no environment at all is valid; a malformed value stops the start with a message naming
the variable rather than surfacing later as a confusing reconcile failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from kubeseer import units

PREFIX = "KUBESEER_"
_T = TypeVar("_T")


class ConfigError(ValueError):
    """A `KUBESEER_*` variable holds a value the operator cannot use."""


class GpuBackend(StrEnum):
    """How a DLJob's pods get their GPU (`KUBESEER_GPU_BACKEND`, docs/dra.md)."""

    AUTO = "auto"
    """DRA when NVIDIA's DRA driver's DeviceClasses exist and no node has a GPU device plugin,
    else extended resources; decided once at start."""
    EXTENDED = "extended"
    """A device plugin's extended resources: `nvidia.com/gpu`, `nvidia.com/mig-<profile>`."""
    DRA = "dra"
    """Dynamic Resource Allocation: a ResourceClaimTemplate of the plan's ladder per attempt."""


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process.

    Attributes:
        scheduler_name: `spec.schedulerName` for created pods; set it to the second scheduler
            profile (`kubeseer-scheduler`) when the extender is installed, empty for the default.
        scheduler_extender: the pods' scheduler runs kubeseer's extender (docs/extender.md), so
            a pod on extended resources is admitted to every kind of its plan's ladder that
            shares the chosen resource, and the extender's best fit picks one, rather than
            pinned to the kind the operator picked. Jobs with one replica and policy auto only.
        max_attempts: placements per DLJob including OOM escalations; the attempt that would
            exceed it fails the DLJob instead.
        move_after_s: with extended resources and the kind pinned (no scheduler extender): how
            long every pod of an attempt must wait unschedulable before the attempt moves to
            another kind of its plan that is free (`waiting`); 0 never moves.
        retry_delay_s: delay before kopf retries a step that failed transiently.
        max_retries: transient failures tolerated per DLJob before it is marked Failed.
        max_workers: threads running reconciles (prediction, placement, API calls) at once.
        fetch_workers: threads downloading models at once, apart from `max_workers`, so that
            slow model servers hold fetch threads only, never the reconciles of other DLJobs; one
            namespace holds at most a quarter of them, and namespaces take turns.
        inventory_resync_s: how often a namespaced operator (`-n`) re-lists nodes and pods of
            the whole cluster, since it watches pods of its namespaces only.
        metrics_port: port of the Prometheus `/metrics` endpoint; 0 disables it.
        health_port: port of kopf's liveness endpoint `/healthz`; 0 disables it.
        gpu_backend: how pods get their GPU: `extended` resources of a device plugin, `dra`
            (ResourceClaims of the plan's ladder), or `auto` (`GpuBackend.AUTO`).
        predictor_checkpoint: a SeerNet-Multi checkpoint to load instead of the shipped one.
        checkpoint_check_s: how often that file is checked for a new checkpoint, which then
            serves every new prediction without a restart; 0 never checks.
        prediction_cache_size: predictions kept per (digest, batch, mode, precision, inputs).
        fetch_max_bytes: largest model accepted, from a URL or a ConfigMap.
        fetch_connect_timeout_s: connect timeout of one model download attempt.
        fetch_read_timeout_s: read timeout (between bytes) of one model download attempt.
        fetch_timeout_s: deadline of a whole model fetch, retries included.
        fetch_min_rate_bytes_s: slowest average download rate accepted after the first 10 s;
            0 turns the check off.
        fetch_allowed_hosts: hosts exempt from the SSRF guard (loopback, link-local and
            cluster-internal addresses are refused otherwise).
        fetch_cache_dir: where fetched models are kept by digest.
        s3_endpoint: the S3-compatible endpoint `s3://` URLs refer to; empty refuses them.
        s3_secret: name of the Secret in `operator_namespace` with `accessKeyId` and
            `secretAccessKey`; empty means anonymous access.
        operator_namespace: the namespace the operator runs in (for the S3 Secret and the
            leader Lease).
        leader_election: hold a Lease in `operator_namespace` while acting, so that of several
            operator processes exactly one acts and another takes over when it stops.
        lease_name: the Lease's name; operators sharing it exclude each other.
        lease_duration_s: how long a Lease not renewed stays held (a killed leader's successor
            waits this long); renewed every third of it.
        observation_store: where every finished attempt is recorded (docs/feedback.md): a
            directory (a PersistentVolume) or `s3://bucket/prefix` on `s3_endpoint` with the
            `s3_secret` credentials (which then need write access); empty keeps no records
            (error metrics and recalibrated margins still work, from this run's jobs only).
        recalibration_min_samples: finished jobs a (GPU product, family) group needs before its
            recalibrated memory margin replaces a coarser one or the checkpoint's.
        recalibration_window: the most recent jobs of a group its margin is computed from.
    """

    scheduler_name: str = ""
    scheduler_extender: bool = False
    max_attempts: int = 3
    move_after_s: float = 30.0
    retry_delay_s: float = 10.0
    max_retries: int = 3
    max_workers: int = 16
    fetch_workers: int = 16
    inventory_resync_s: float = 30.0
    metrics_port: int = 9464
    health_port: int = 8080
    gpu_backend: GpuBackend = GpuBackend.AUTO
    predictor_checkpoint: Path | None = None
    checkpoint_check_s: float = 10.0
    prediction_cache_size: int = 1024
    fetch_max_bytes: int = 512 * units.MIB
    fetch_connect_timeout_s: float = 5.0
    fetch_read_timeout_s: float = 10.0
    fetch_timeout_s: float = 600.0
    fetch_min_rate_bytes_s: float = 256 * 1024
    fetch_allowed_hosts: tuple[str, ...] = ()
    fetch_cache_dir: Path = Path.home() / ".cache" / "kubeseer" / "models"
    s3_endpoint: str = ""
    s3_secret: str = ""
    operator_namespace: str = "kubeseer-system"
    leader_election: bool = True
    lease_name: str = "kubeseer-operator"
    lease_duration_s: float = 15.0
    observation_store: str = ""
    recalibration_min_samples: int = 20
    recalibration_window: int = 200

    def __post_init__(self) -> None:
        _require(self.max_attempts >= 1, "max_attempts", "must be at least 1")
        _require(self.move_after_s >= 0, "move_after_s", "must not be negative")
        _require(self.retry_delay_s > 0, "retry_delay_s", "must be positive")
        _require(self.max_retries >= 0, "max_retries", "must not be negative")
        _require(self.max_workers >= 1, "max_workers", "must be at least 1")
        _require(self.fetch_workers >= 1, "fetch_workers", "must be at least 1")
        _require(self.inventory_resync_s > 0, "inventory_resync_s", "must be positive")
        _require(0 <= self.metrics_port <= 65535, "metrics_port", "must be a port number")
        _require(0 <= self.health_port <= 65535, "health_port", "must be a port number")
        _require(self.checkpoint_check_s >= 0, "checkpoint_check_s", "must not be negative")
        _require(self.prediction_cache_size >= 1, "prediction_cache_size", "must be at least 1")
        _require(self.fetch_max_bytes >= 1, "fetch_max_bytes", "must be at least 1")
        _require(self.fetch_connect_timeout_s > 0, "fetch_connect_timeout_s", "must be positive")
        _require(self.fetch_read_timeout_s > 0, "fetch_read_timeout_s", "must be positive")
        _require(self.fetch_timeout_s > 0, "fetch_timeout_s", "must be positive")
        _require(self.fetch_min_rate_bytes_s >= 0, "fetch_min_rate_bytes_s", "must not be negative")
        _require(self.lease_duration_s >= 3, "lease_duration_s", "must be at least 3 seconds")
        _require(
            self.recalibration_min_samples >= 1, "recalibration_min_samples", "must be at least 1"
        )
        _require(
            self.recalibration_window >= self.recalibration_min_samples,
            "recalibration_window",
            "must be at least recalibration_min_samples",
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read every field from `KUBESEER_<FIELD IN UPPER CASE>`, defaults for those unset."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse(f.name, raw, _PARSERS[f.name])
        return cls(**values)  # type: ignore[arg-type]


def _require(ok: bool, name: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{PREFIX}{name.upper()} {why}")


def _parse(name: str, raw: str, parser: Callable[[str], _T]) -> _T:
    try:
        return parser(raw.strip())
    except ValueError as e:
        raise ConfigError(f"{PREFIX}{name.upper()}={raw!r} is not valid: {e}") from e


def _hosts(raw: str) -> tuple[str, ...]:
    return tuple(h.strip().lower() for h in raw.split(",") if h.strip())


def _optional_path(raw: str) -> Path | None:
    return Path(raw) if raw else None


def _backend(raw: str) -> GpuBackend:
    try:
        return GpuBackend(raw.lower())
    except ValueError:
        raise ValueError(f"expected one of {', '.join(b.value for b in GpuBackend)}") from None


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


_PARSERS: dict[str, Callable[[str], object]] = {
    "scheduler_name": str,
    "scheduler_extender": _bool,
    "max_attempts": int,
    "move_after_s": float,
    "retry_delay_s": float,
    "max_retries": int,
    "max_workers": int,
    "fetch_workers": int,
    "inventory_resync_s": float,
    "metrics_port": int,
    "health_port": int,
    "gpu_backend": _backend,
    "predictor_checkpoint": _optional_path,
    "checkpoint_check_s": float,
    "prediction_cache_size": int,
    "fetch_max_bytes": int,
    "fetch_connect_timeout_s": float,
    "fetch_read_timeout_s": float,
    "fetch_timeout_s": float,
    "fetch_min_rate_bytes_s": float,
    "fetch_allowed_hosts": _hosts,
    "fetch_cache_dir": Path,
    "s3_endpoint": str,
    "s3_secret": str,
    "operator_namespace": str,
    "leader_election": _bool,
    "lease_name": str,
    "lease_duration_s": float,
    "observation_store": str,
    "recalibration_min_samples": int,
    "recalibration_window": int,
}
