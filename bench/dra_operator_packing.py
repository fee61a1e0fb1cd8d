"""Does the operator pack a DRA job stream as well as its ladder does with claims made by hand?

Question (issue 19): `bench/dra_packing.py` sends a seeded stream of jobs to the real
kube-scheduler as ResourceClaims it creates itself from kubeseer's cost-ordered ladder. In
production the operator makes those claims: it plans from its own view of the cluster (the
driver's ResourceSlices minus the claims' allocations), writes each attempt's
ResourceClaimTemplate, creates a suspended Job that uses it, resumes it, and reads the
allocation back into the DLJob's status. This runs the same stream both ways, in one run of the
real control plane, on the same 16 dynamic-MIG GPUs (`deploy/devcluster/dra-bench.yaml`):

* (a) direct: `dra_packing.run` with the ladder (claims and pods created by the script);
* (b) operator: every job a DLJob, served by the real operator (its GPU backend auto-detected
  as DRA) with the operator's own identity. What the operator allocated is read from the
  DLJob's `status.allocation`, not from the claims.

The protocol is `dra_packing`'s, in virtual time: at an arrival the job is submitted and the
scheduler either allocates its claim (the job runs) or finds its pod unschedulable (the DLJob is
deleted and the job waits); at a departure the job's DLJob is deleted, its claim released, and
the waiting jobs are tried again first-come first-served (skipping those no free device could
hold, `Holdings.could_fit`). Jobs, predictions, slowdowns and every figure are
`dra_packing`'s; the operator's predictor answers each job with the stream's prediction for it
(its model is a ConfigMap key whose bytes name the job), because this measures placement, not
prediction (`bench/dljob_latency.py` times the operator with the real predictor).

Figures, as ratios of (b) to (a): jobs placed, finished, the share placed on their first rung,
the mean predicted slowdown and the GPU memory stranded; and the wall time per attempt, which
is the operator's overhead over a claim made by hand (DLJob to allocated claim: fetch, plan,
Job, template, resume, status).

    .venv/bin/python bench/dra_operator_packing.py [--jobs 240] [--rate 60] [--seeds 3]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kubernetes import client, config

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster, errors, inventory
from kubeseer.operator import local
from kubeseer.operator import main as operator_main
from kubeseer.operator.config import GpuBackend, OperatorConfig
from kubeseer.placement import plan
from kubeseer.prediction import Mode, Precision, Prediction


def _sibling(name: str) -> ModuleType:
    """Another bench script, by path (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dra_packing = _sibling("dra_packing")

DEPLOY = resources.path("deploy")
GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
NAMESPACE = "dra-operator-bench"
STREAM_CONFIGMAP = "stream"
_POLL_S = 0.05
_TIMEOUT_S = 60.0
DIRECT = "direct claims (dra_packing)"
OPERATOR = "through the operator"
_KEEP_RUNNING = {
    # KWOK completes a Job's pod 1-6 s after it runs unless told otherwise; the bench ends jobs.
    "pod-complete.stage.kwok.x-k8s.io/delay": "240h",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "240h",
}


def job_key(seed: int, job: dra_packing.Job) -> str:
    """What a job's model bytes say: its stream and its place in it."""
    return f"{seed}-{job.index}"


class StreamPredictor:
    """The operator's predictor for the bench: a job's model bytes are its `job_key`, and the
    answer is that job's prediction."""

    def __init__(self, streams: Mapping[int, Sequence[dra_packing.Job]]) -> None:
        self.by_key = {job_key(s, j): j.prediction for s, jobs in streams.items() for j in jobs}

    def cached(self, *args: Any, **kwargs: Any) -> Prediction | None:
        return None

    def predict(
        self,
        model: bytes | Path,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
    ) -> Prediction:
        data = model.read_bytes() if isinstance(model, Path) else model
        return self.by_key[data.decode()]


class OperatorScheduler:
    """DLJobs in one namespace; the allocation the operator records for each, or a refusal."""

    def __init__(self, api: client.ApiClient, seed: int, jobs: Sequence[dra_packing.Job]) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = f"{NAMESPACE}-{seed}"
        self.core.create_namespace({"metadata": {"name": self.namespace}})
        data = {
            f"{j.index}.onnx": base64.b64encode(job_key(seed, j).encode()).decode() for j in jobs
        }
        self.core.create_namespaced_config_map(
            self.namespace, {"metadata": {"name": STREAM_CONFIGMAP}, "binaryData": data}
        )
        self._serial = 0
        self.attempt_s: list[float] = []

    def attempt(self, job: dra_packing.Job) -> tuple[str, dict[str, Any]] | None:
        """Submit the job as a DLJob; its `status.allocation`, or None (the DLJob deleted
        again) when the scheduler finds its pod unschedulable."""
        self._serial += 1
        name = f"d{self._serial:05d}"
        began = time.monotonic()
        p = job.prediction
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DLJob",
            "metadata": {"name": name},
            "spec": {
                "model": {"configMapRef": {"name": STREAM_CONFIGMAP, "key": f"{job.index}.onnx"}},
                "mode": p.mode.value,
                "batchSize": p.batch_size,
                "precision": p.precision.value,
                "template": {
                    "metadata": {"annotations": _KEEP_RUNNING},
                    "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                },
                "placement": {"maxSlowdown": dra_packing.MAX_SLOWDOWN},
            },
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            status = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            ).get("status", {})
            if status.get("phase") == "Failed":
                raise RuntimeError(f"DLJob {name} failed: {status.get('message')}")
            if status.get("allocation"):
                self.attempt_s.append(time.monotonic() - began)
                return name, dict(status["allocation"])
            if self._unschedulable(name):
                self.release(name, wait=False)
                return None
            time.sleep(_POLL_S)
        raise RuntimeError(f"the operator neither placed nor refused {name} in {_TIMEOUT_S} s")

    def close(self) -> None:
        """Delete every DLJob left and wait until their claims are released (the next run
        needs the devices), then the namespace."""
        self.custom.delete_collection_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, propagation_policy="Foreground"
        )
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            left = self.custom.list_namespaced_custom_object(
                "resource.k8s.io", "v1", self.namespace, "resourceclaims"
            )["items"]
            if not left:
                break
            time.sleep(0.1)
        self.core.delete_namespace(self.namespace)

    def _unschedulable(self, name: str) -> bool:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"kubeseer.io/dljob={name}"
        ).items
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for pod in pods
            for c in pod.status.conditions or ()
        )

    def release(self, name: str, *, wait: bool = True) -> None:
        """Delete the DLJob (its Job, pod and claim go with it); with `wait`, until its claim
        is released."""
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground"
        )
        deadline = time.monotonic() + _TIMEOUT_S
        while wait and time.monotonic() < deadline:
            left = self.custom.list_namespaced_custom_object(
                "resource.k8s.io",
                "v1",
                self.namespace,
                "resourceclaims",
                label_selector=f"kubeseer.io/dljob={name}",
            )["items"]
            if not left:
                return
            time.sleep(_POLL_S)
        if wait:
            raise RuntimeError(f"the claim of DLJob {name} was not released in {_TIMEOUT_S} s")


def run_operator(
    api: client.ApiClient,
    nodes: inventory.Inventory,
    seed: int,
    jobs: Sequence[dra_packing.Job],
    horizon_s: float,
) -> tuple[dra_packing.Outcome, list[float]]:
    """The stream through the operator, in virtual time (`dra_packing.replay`'s protocol)."""
    scheduler = OperatorScheduler(api, seed, jobs)

    def ask(job: dra_packing.Job, made: plan.Plan) -> dra_packing.Granted | None:
        answer = scheduler.attempt(job)
        if answer is None:
            return None
        name, got = answer
        pool, device = str(got["device"]).split("/", 1)
        row = next(r for r in made.ladder if r.rank == got["rank"])
        return dra_packing.Granted(name, pool, device, row, bool(got["firstChoice"]))

    try:
        outcome = dra_packing.replay(
            api,
            nodes,
            jobs,
            dra_packing.ladder_plan,
            horizon_s,
            ask,
            scheduler.release,
            prune=True,
        )
    finally:
        scheduler.close()
    return outcome, scheduler.attempt_s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=240, help="arrivals per seed (default 240)")
    parser.add_argument("--rate", type=float, default=dra_packing.ARRIVALS_PER_HOUR)
    parser.add_argument("--seeds", type=int, default=3, help="streams, averaged (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        bins = binaries.build() if binaries.go_available() else binaries.locate()
    except errors.BinariesMissingError as e:
        print(f"dra_operator_packing: skipped, no control plane here ({e})")
        return 0
    nodes = inventory.load(dra_packing.INVENTORY)
    largest = min(
        p.usable_memory_bytes
        for m in dra_packing.PRODUCTS
        for p in m.profiles
        if p.compute_slices == 7
    )
    horizon = args.jobs / args.rate * 3600.0
    cluster_gib = (
        sum(g.model.whole.usable_memory_bytes for g in dra_packing.Holdings(nodes).gpus.values())
        / dra_packing.GIB
    )
    seeds = range(19, 19 + args.seeds)
    streams = {s: dra_packing.stream(s, args.jobs, largest, args.rate) for s in seeds}
    runs: dict[str, list[dict[str, float]]] = {DIRECT: [], OPERATOR: []}
    per_attempt: dict[str, list[float]] = {DIRECT: [], OPERATOR: []}
    placed_s: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="dra-operator-bench-") as scratch,
        cluster.LocalCluster(
            inventory_file=dra_packing.INVENTORY,
            crd_files=sorted((DEPLOY / "crds").glob("*.yaml")),
            rbac_files=sorted((DEPLOY / "rbac").glob("*.yaml")),
            bins=bins,
        ) as local_cluster,
    ):
        api = config.new_client_from_config(config_file=str(local_cluster.admin_kubeconfig))
        settings = OperatorConfig(
            metrics_port=0,
            health_port=0,
            leader_election=False,
            fetch_cache_dir=Path(scratch) / "models",
        )
        built = operator_main.build(
            settings,
            kubeconfig=str(local_cluster.operator_kubeconfig),
            predictor=StreamPredictor(streams),
        )
        if built.backend is not GpuBackend.DRA:
            raise SystemExit(f"the operator chose {built.backend.value}, not dra")
        with local.OperatorThread(built):
            for seed, jobs in streams.items():
                direct = dra_packing.run(
                    api,
                    nodes,
                    jobs,
                    dra_packing.ladder_plan,
                    horizon,
                    f"{dra_packing.NAMESPACE}-direct-{seed}",
                    prune=True,
                )
                through, attempt_s = run_operator(api, nodes, seed, jobs, horizon)
                for label, got in ((DIRECT, direct), (OPERATOR, through)):
                    runs[label].append(dra_packing._figures(got, horizon, cluster_gib))
                    per_attempt[label].append(got.wall_s / max(1, got.attempts))
                    print(
                        f"  seed {seed}, {label}: {got.placed} placed, {got.attempts} attempts, "
                        f"{got.wall_s:.0f} s",
                        flush=True,
                    )
                placed_s += attempt_s
        api.close()
    keys = ("placed", "finished", "first_choice_share", "mean_slowdown", "stranded_share")
    rows = {
        label: {k: statistics.mean(r[k] for r in got) for k in keys} for label, got in runs.items()
    }
    for label, row in rows.items():
        for key in ("placed", "finished", "mean_slowdown", "stranded_share"):
            row[f"{key}_vs_direct"] = row[key] / rows[DIRECT][key] if rows[DIRECT][key] else 0.0
        row["seconds_per_attempt"] = statistics.mean(per_attempt[label])
    print(
        f"{args.jobs} jobs per seed over {horizon / 3600:.1f} h, {args.seeds} seed(s), 16 "
        f"dynamic-MIG GPUs ({cluster_gib:,.0f} GiB), the cost-ordered ladder, real kube-scheduler"
    )
    print(
        f"{'path':<30} {'placed':>7} {'x direct':>9} {'finished':>9} {'x direct':>9} "
        f"{'1st rung':>9} {'slowdown':>9} {'stranded':>9} {'s/attempt':>10}"
    )
    for label, row in rows.items():
        print(
            f"{label:<30} {row['placed']:>7.1f} {row['placed_vs_direct']:>9.3f} "
            f"{row['finished']:>9.1f} {row['finished_vs_direct']:>9.3f} "
            f"{100 * row['first_choice_share']:>8.1f}% {row['mean_slowdown']:>8.2f}x "
            f"{100 * row['stranded_share']:>8.1f}% {row['seconds_per_attempt']:>10.2f}"
        )
    if placed_s:
        ordered = sorted(placed_s)
        print(
            f"operator, DLJob created -> claim allocated and recorded: median "
            f"{statistics.median(ordered):.2f} s, p90 {ordered[int(0.9 * (len(ordered) - 1))]:.2f} "
            f"s ({len(ordered)} placements)"
        )
    if args.json:
        document = {
            "jobs": args.jobs,
            "seeds": list(seeds),
            "rate_per_hour": args.rate,
            "rows": rows,
            "runs": runs,
            "placed_attempt_s": placed_s,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
