"""Fixtures of the operator's unit tests: DLJob specs, nodes, pods, predictions, a placement,
and a reconciler wired to an in-memory API server (`make_world`).

Builders are handed out as fixtures (tests run in pytest's importlib mode, where test modules
cannot import each other).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics, resources
from kubeseer.devcluster import inventory as devcluster_inventory
from kubeseer.devcluster.dra import slices
from kubeseer.operator import backends, dljob, errors, models, ports, predict, reconcile
from kubeseer.operator.config import OperatorConfig
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.fetch import cancel
from kubeseer.operator.fetch import errors as fetch_errors
from kubeseer.operator.inventory import InventoryCache
from kubeseer.placement import policy
from kubeseer.prediction import Attention, Estimate, Mode, Precision, Prediction
from kubeseer.predictor import cache

GIB = 1 << 30


def _dljob_spec(**overrides: Any) -> dict[str, Any]:
    """A valid DLJob spec as the API server would store it (defaults applied)."""
    spec: dict[str, Any] = {
        "model": {"configMapRef": {"name": "resnet", "key": "model.onnx"}},
        "mode": "infer",
        "batchSize": 8,
        "precision": "fp32",
        "attention": "auto",
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"team": "vision"}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "example.org/infer:1", "command": ["python"]},
                    {"name": "sidecar", "image": "example.org/log:1"},
                ]
            },
        },
        "placement": {"policy": "auto", "coverage": 0.95, "maxSlowdown": 2.0},
    }
    spec.update(copy.deepcopy(overrides))
    return spec


def _prediction(
    memory_gib: float = 3.0, upper_gib: float = 4.0, sm_util: float = 20.0
) -> Prediction:
    """A prediction with the given memory (GiB) and SM utilisation (percent)."""
    return Prediction(
        mode=Mode.INFER,
        batch_size=8,
        precision=Precision.FP32,
        memory_bytes=Estimate(memory_gib * GIB, upper_gib * GIB),
        sm_util_percent=Estimate(sm_util, sm_util + 10),
        step_time_s=Estimate(0.010, 0.015),
        coverage=0.95,
        model_digest="ab" * 32,
        predictor_version="test-1",
        label_device="A100-80GB",
    )


def _node(
    name: str, product: str, allocatable: dict[str, str], *, ready: bool = True
) -> dict[str, Any]:
    """A Node object as the API returns it."""
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", **allocatable},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _pod(
    name: str,
    resource: str,
    *,
    node_name: str = "",
    phase: str = "Running",
    namespace: str = "default",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod requesting one unit of `resource`."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}],
        },
        "status": {"phase": phase},
    }


A100_80 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def _cluster_nodes() -> list[dict[str, Any]]:
    """An A100-80GB with two 1g.10gb and one 3g.40gb slice, and an H100 with two whole GPUs."""
    return [
        _node(
            "a100",
            A100_80,
            {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
        ),
        _node("h100", H100, {"nvidia.com/gpu": "2"}),
    ]


_PLACEMENT = policy.Placement(
    policy=policy.PolicyName.AUTO,
    resource="nvidia.com/mig-1g.10gb",
    profile="1g.10gb",
    gpu_product="A100-80GB",
    product_label=A100_80,
    usable_memory_bytes=9728 << 20,
    compute_share=14 / 108,
    predicted_slowdown=1.5,
    node_hint="a100",
    reason="smallest free MIG profile",
)


NS = "ml"


def merge_patch(
    target: Mapping[str, Any], patch: Mapping[str, Any], *, strategic: bool = False
) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch; `strategic` also merges lists of
    named objects (containers) by name, as a strategic merge patch does."""
    result = dict(target)
    for key, value in patch.items():
        old = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(old, Mapping):
            result[key] = merge_patch(old, value, strategic=strategic)
        elif strategic and isinstance(value, list) and isinstance(old, list):
            by_name = {item["name"]: item for item in value}
            merged = [
                merge_patch(item, by_name[item["name"]], strategic=True)
                if item.get("name") in by_name
                else item
                for item in old
            ]
            result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


class FakeCluster:
    """An API server holding DLJobs, Jobs, ResourceClaimTemplates and events in memory. Like the
    real one, it lets a Job's pod template change only while the Job is suspended (KEP-5440) and
    has no start time (the Job controller clears it once a suspended Job's pods are gone)."""

    def __init__(self) -> None:
        self.dljobs: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.claim_templates: dict[str, dict[str, Any]] = {}
        self.create_error: errors.ApiError | None = None
        self.patches = 0
        self.job_patches: list[tuple[str, dict[str, Any], bool]] = []
        self.job_pods: dict[str, list[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []

    def add(self, name: str, spec: dict[str, Any]) -> dljob.DLJobRef:
        self.dljobs[name] = {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": spec,
            "status": {},
        }
        return dljob.DLJobRef(NS, name, f"uid-{name}")

    def add_ref(self, name: str) -> dljob.DLJobRef:
        """The reference of a DLJob already added."""
        return dljob.DLJobRef(NS, name, f"uid-{name}")

    def status(self, name: str) -> dict[str, Any]:
        return self.dljobs[name]["status"]

    def patch_status(self, ref: dljob.DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        self.patches += 1
        obj = self.dljobs[ref.name]
        obj["status"] = merge_patch(obj["status"], patch)
        return copy.deepcopy(obj["status"])

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return copy.deepcopy(self.dljobs.get(name))

    def create_job(self, manifest: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        if self.create_error is not None:
            raise self.create_error
        name = manifest["metadata"]["name"]
        if name in self.workloads:
            return False, copy.deepcopy(self.workloads[name])
        stored = copy.deepcopy(dict(manifest))
        stored["metadata"]["uid"] = f"uid-job-{name}"
        self.workloads[name] = stored
        return True, copy.deepcopy(stored)

    def patch_job(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, strategic: bool
    ) -> Mapping[str, Any]:
        job = self.workloads[name]
        patched = merge_patch(job, patch, strategic=strategic)
        changed = patched["spec"]["template"] != job["spec"]["template"]
        started = (job.get("status") or {}).get("startTime")
        if changed and (not job["spec"].get("suspend") or started):  # judged by the Job as stored
            raise errors.InvalidObjectError("422 field is immutable", status=422)
        self.job_patches.append((name, copy.deepcopy(dict(patch)), strategic))
        self.workloads[name] = patched
        return copy.deepcopy(patched)

    def job_exists(self, namespace: str, name: str) -> bool:
        return name in self.workloads

    def create_claim_template(self, manifest: Mapping[str, Any]) -> bool:
        name = manifest["metadata"]["name"]
        if name in self.claim_templates:
            return False
        self.claim_templates[name] = copy.deepcopy(dict(manifest))
        return True

    def list_job_pods(self, namespace: str, job_name: str) -> list[Mapping[str, Any]]:
        return list(self.job_pods.get(job_name, []))

    def list_events(
        self, namespace: str, involved_uid: str, reason: str
    ) -> list[Mapping[str, Any]]:
        return [
            copy.deepcopy(e)
            for e in self.events
            if e["involvedObject"]["uid"] == involved_uid and e["reason"] == reason
        ]

    def pod_spec(self, name: str) -> dict[str, Any]:
        """The pod template's spec of a Job."""
        return dict(self.workloads[name]["spec"]["template"]["spec"])


class FakeModels:
    """Model sources by ConfigMap name: bytes, or the error loading them raises. A load writes
    the bytes to a file of its own, as the real store checks a model out of its cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sources: dict[str, bytes | fetch_errors.FetchError] = {"resnet": b"resnet-bytes"}
        self.loads = 0
        self.served: dict[tuple[str, str], str] = {}
        self._names = itertools.count()

    def verified(self, source: dljob.ModelSource, namespace: str) -> str | None:
        if source.config_map is None:
            return None
        served = self.served.get((namespace, source.config_map.name))
        return served if source.sha256 is not None and served == source.sha256 else None

    def load(
        self,
        source: dljob.ModelSource,
        namespace: str,
        cancellation: cancel.Cancellation | None = None,
    ) -> models.LoadedModel:
        self.loads += 1
        assert source.config_map is not None
        found = self.sources[source.config_map.name]
        if isinstance(found, fetch_errors.FetchError):
            raise found
        digest = hashlib.sha256(found).hexdigest()
        if source.sha256 is not None and source.sha256 != digest:
            raise fetch_errors.DigestMismatchError(f"sha256 {digest}, not {source.sha256}")
        self.served[(namespace, source.config_map.name)] = digest
        path = self.root / f"model-{next(self._names)}"
        path.write_bytes(found)
        return models.LoadedModel(path, digest, len(found), from_cache=False)

    def checked_out(self) -> list[Path]:
        """Model files not yet released."""
        return sorted(self.root.iterdir())


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def emit(
        self, ref: dljob.DLJobRef, kind: ports.EventType, reason: dljob.Reason, message: str
    ) -> None:
        self.posted.append((kind.value, reason.value, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.posted]


class Predictor:
    """Predicts by model bytes: memory table in GiB, or an error to raise; caches its answers
    in the predictor's own cache, as `kubeseer.predictor.api.Predictor` does."""

    def __init__(self) -> None:
        self.table: dict[bytes, tuple[float, float] | Exception] = {b"resnet-bytes": (3.0, 4.0)}
        self.launch_limits: dict[bytes, tuple[str, ...]] = {}
        self.calls = 0
        self.given: list[type] = []
        self.attentions: list[Attention] = []
        self.cache = cache.PredictionCache(8)

    @staticmethod
    def key(
        digest: str,
        batch: int,
        mode: Mode,
        precision: Precision,
        inputs: Mapping[str, int],
        attention: Attention,
    ) -> cache.Key:
        return cache.key(
            "fake",
            digest,
            batch,
            mode,
            precision,
            optimizer="adam",
            inputs=inputs,
            gpu=None,
            attention=attention,
        )

    def cached(
        self,
        model_digest: str,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention,
    ) -> Prediction | None:
        return self.cache.get(
            self.key(model_digest, batch_size, mode, precision, inputs, attention)
        )

    def predict(
        self,
        model: bytes | Path,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention,
    ) -> Prediction:
        self.calls += 1
        self.given.append(type(model))
        self.attentions.append(attention)
        model = model.read_bytes() if isinstance(model, Path) else model
        entry = self.table[model]
        if isinstance(entry, Exception):
            raise entry
        made = replace(
            _prediction(*entry),
            mode=mode,
            batch_size=batch_size,
            precision=precision,
            launch_limits=self.launch_limits.get(model, ()),
        )
        key = self.key(
            hashlib.sha256(model).hexdigest(), batch_size, mode, precision, inputs, attention
        )
        self.cache.put(key, made)
        return made


DRA_NODES = resources.path("deploy", "devcluster", "dra-nodes.yaml")


def dra_slices() -> list[dict[str, Any]]:
    """The ResourceSlices the dev cluster publishes for `deploy/devcluster/dra-nodes.yaml`: an
    H100 with static MIG (2 x 1g.10gb, 2g.20gb, 3g.40gb; and a whole H100), two H100s and an
    A100-40GB with dynamic MIG, shaped as NVIDIA's DRA driver publishes them."""
    nodes = devcluster_inventory.load(DRA_NODES)
    return [dict(s) for node in nodes.dra_nodes() for s in slices.build_slices(node)]


class World:
    """A reconciler over the fakes, with the inventory seeded from `cluster_nodes()` (extended
    resources) or, with `dra=True`, from `dra_slices()`."""

    def __init__(self, root: Path, *, dra: bool = False, **config: Any) -> None:
        self.cluster = FakeCluster()
        self.models = FakeModels(root)
        self.events = Events()
        self.predict_fn = Predictor()
        self.registry = CollectorRegistry()
        self.metrics = metrics.OperatorMetrics(self.registry)
        self.inventory = InventoryCache()
        self.inventory.replace_all(_cluster_nodes(), [])
        self.devices = dra_inventory.DraInventoryCache()
        self.devices.replace_all(dra_slices(), [], [])
        backend: backends.Backend = (
            backends.DynamicResources(self.devices)
            if dra
            else backends.ExtendedResources(self.inventory)
        )
        self.config = OperatorConfig(**{"max_retries": 2, "retry_delay_s": 1.5, **config})
        self.now = 0.0
        """Monotonic seconds of the stall watch (`stalls`), moved on by the tests."""
        self.reconciler = reconcile.Reconciler(
            cluster=self.cluster,
            models=self.models,
            predictor=predict.CachedPredictor(self.predict_fn, self.metrics),
            backend=backend,
            events=self.events,
            operator_metrics=self.metrics,
            config=self.config,
            clock=lambda: datetime(2026, 11, 22, 4, tzinfo=UTC),
            monotonic=lambda: self.now,
        )

    def submit(self, name: str = "resnet", **spec: Any) -> dljob.DLJobRef:
        return self.cluster.add(name, _dljob_spec(**spec))

    def reconcile(
        self,
        ref: dljob.DLJobRef,
        retry: int = 0,
        cancellation: cancel.Cancellation | None = None,
    ) -> dljob.Phase | None:
        body = self.cluster.dljobs[ref.name]
        return asyncio.run(
            self.reconciler.reconcile(
                ref,
                body["spec"],
                copy.deepcopy(body["status"]),
                retry=retry,
                cancellation=cancellation,
            )
        )

    def condition(self, name: str, kind: dljob.ConditionType) -> dict[str, Any]:
        found = [c for c in self.cluster.status(name)["conditions"] if c["type"] == kind.value]
        assert len(found) == 1
        return found[0]

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
def dljob_spec() -> Callable[..., dict[str, Any]]:
    """`dljob_spec(**overrides)`: a valid DLJob spec as stored (defaults applied)."""
    return _dljob_spec


@pytest.fixture
def prediction() -> Callable[..., Prediction]:
    """`prediction(memory_gib, upper_gib, sm_util)`: an inference prediction."""
    return _prediction


@pytest.fixture
def node() -> Callable[..., dict[str, Any]]:
    """`node(name, product, allocatable, ready=True)`: a Node as the API returns it."""
    return _node


@pytest.fixture
def pod() -> Callable[..., dict[str, Any]]:
    """`pod(name, resource, node_name=, phase=, namespace=, labels=)`: a GPU pod."""
    return _pod


@pytest.fixture
def cluster_nodes() -> list[dict[str, Any]]:
    """An A100-80GB with two 1g.10gb and one 3g.40gb slice, and an H100 with two whole GPUs."""
    return _cluster_nodes()


@pytest.fixture
def mig_placement() -> policy.Placement:
    """A placement on an A100-80GB 1g.10gb slice."""
    return _PLACEMENT


@pytest.fixture
def make_world(tmp_path: Path) -> Callable[..., World]:
    """`make_world(dra=False, **config)`: a reconciler over the in-memory fakes."""
    worlds = itertools.count()

    def make(*, dra: bool = False, **config: Any) -> World:
        root = tmp_path / f"world-{next(worlds)}"
        root.mkdir()
        return World(root, dra=dra, **config)

    return make
