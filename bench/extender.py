"""Is the scheduler extender fast enough, and does it pack GPUs better than default scoring?

Two parts, both on the local control plane (real etcd, kube-apiserver, kube-scheduler, KWOK) with
`kubeseer extender` running as its own process, as deployed.

**Latency** at 10, 100 and 1,000 KWOK GPU nodes (a mix of single- and mixed-strategy MIG nodes
and whole GPUs, half their units held by bound pods): filter then prioritize of one kubeseer pod
(the pod body kube-scheduler really sent, tests/unit/extender/fixtures/filter-request.json) over
*every* node, timed at the client over a kept-alive connection, as kube-scheduler calls it (the
request bodies encoded before the clock starts, as kube-scheduler's are in Go). Every
node is the worst case: kube-scheduler sends at most `percentageOfNodesToScore` of them (42 % at
1,000 nodes). Goal: p99 <= 20 ms at 1,000 nodes (kube-scheduler's default extender timeout is
5 s). Peer, same server, same run: a pod of another scheduler, which the extender passes through
after decoding it; the ratio is what deciding costs over the protocol's floor. Also reported:
the extender's CPU per pair, its CPU with no calls (its watches following the nodes'
heartbeats), and the machine's 1-minute load average before, between and after the runs.

**Packing**: one seeded stream of GPU jobs arriving and finishing over time on a fixed inventory
whose devices are all `nvidia.com/gpu` but of different kinds, so that a job several kinds hold
can go to any of them (`--inventory single`: the device plugin's single strategy, A100-80GB nodes
of 1g.10gb, 2g.20gb and 3g.40gb slices and whole A100s and H100s, 108 devices; `whole`: whole
A100-40GB, A100-80GB, H100 and H100 NVL GPUs, 36 devices), run three times through the real
kube-scheduler:

* *default*: each pod asks for its `nvidia.com/gpu` units and requires (node affinity on
  `nvidia.com/gpu.product`) a kind that holds it, as the operator writes it when the extender is
  installed (`workload.admit_products`), which is what kube-scheduler's default scoring places
  when the extender is down;
* *smallest-fit rule*: each pod is pinned (node selector) to the smallest kind that holds it, as
  HAMi and Volcano choose a MIG profile and as the operator pins a pod without the extender;
* *extender*: the *default* pod plus kubeseer's predicted-memory annotation and the
  `kubeseer-scheduler` profile; the extender filters and scores.

The arrivals are a Poisson process in phases of offered load (device-seconds asked for per second
over the devices there are): 90 s at 0.6, 90 s at 1.5 (more than the cluster can serve), 90 s at
0.6 (`--phases`), then 60 s for the queue to drain; each job runs 20-90 s once bound. Job sizes
are drawn uniformly from the shipped predictor's calibrated upper bounds for real architectures
of the zoo (ResNet, VGG, DenseNet, MobileNet, ViT, BERT, GPT-2; training and inference, several
batches), bench/data/extender-jobs.json (`--refresh-jobs` recomputes it, a few minutes): most are
small, a tenth need more than 19.5 GiB; 15 % of the training jobs are data-parallel on 2 or 4
devices of one node. Reported per arm: jobs placed within the horizon (by size, and by the end of
each phase), wait from arrival to binding (jobs never placed count with their wait so far),
stranded memory (usable memory of the devices jobs hold minus what they are predicted to use,
averaged over time), the share of the inventory's memory in use, and the device-seconds a free
device sat idle while a job that fits it waited (scheduling lag included: what a better choice
could still have used).

    .venv/bin/python bench/extender.py [--part latency|packing|all] [--sizes 10,100,1000]
        [--calls 300] [--inventory single|whole] [--phases 90:0.6,90:1.5,90:0.6] [--seed 7]
        [--multi-device-share 0.15] [--json PATH] [--refresh-jobs]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import http.client
import itertools
import json
import os
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from kubeseer.devcluster import binaries, cluster, inventory
from kubeseer.extender import local, nodes, stanza
from kubeseer.operator import workload

REPO = Path(__file__).resolve().parents[1]
JOBS_FILE = REPO / "bench" / "data" / "extender-jobs.json"
POD_FIXTURE = REPO / "tests" / "unit" / "extender" / "fixtures" / "filter-request.json"
DEVCLUSTER_NODES = REPO / "deploy" / "devcluster" / "nodes.yaml"
GIB = 1 << 30
MIB = 1 << 20
GOAL_P99_MS = 20.0
WARM_UP = 20  # calls before timing starts (connection, caches)
IDLE_WINDOW_S = 10.0  # the extender's own CPU with no calls (its watches) is measured this long

# Architectures and batches of the job table (standard zoo specs, fp32).
ARCHITECTURES: dict[str, tuple[int, ...]] = {
    "resnet50": (16, 32, 64, 128, 256, 512),
    "resnet152": (16, 32, 64, 128, 256),
    "wide_resnet50_2": (16, 32, 64, 128, 256),
    "vgg16": (8, 16, 32, 64, 128, 256),
    "densenet121": (16, 32, 64, 128, 256),
    "mobilenet_v2": (32, 64, 128, 256, 512),
    "vit-b16": (8, 16, 32, 64, 128, 256),
    "vit-l16": (4, 8, 16, 32, 64, 128),
    "bert-base": (8, 16, 32, 64, 128, 256),
    "bert-large": (4, 8, 16, 32, 64, 128),
    "gpt2-small": (1, 2, 4, 8, 16),
    "gpt2-medium": (1, 2, 4, 8),
}
LARGEST_DEVICE_BYTES = 79 * GIB
MULTI_DEVICE_SHARE = 0.15  # of training jobs, data-parallel on 2 or 4 devices of one node

# Latency: the node types cycled to build N nodes (inventory schema of deploy/devcluster).
LATENCY_NODE_TYPES: tuple[dict[str, Any], ...] = (
    {"gpuModel": "A100-SXM4-80GB", "gpus": 4, "migStrategy": "single",
     "migLayouts": [{"1g.10gb": 7}] * 4},
    {"gpuModel": "A100-SXM4-80GB", "gpus": 4, "migStrategy": "single",
     "migLayouts": [{"3g.40gb": 2}] * 4},
    {"gpuModel": "H100-80GB-HBM3", "gpus": 8, "migStrategy": "none"},
    {"gpuModel": "A100-SXM4-80GB", "gpus": 4, "migStrategy": "mixed",
     "migLayouts": [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, {"2g.20gb": 3}]},
    {"gpuModel": "A100-SXM4-40GB", "gpus": 2, "migStrategy": "mixed",
     "migLayouts": [{"1g.5gb": 7}, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}]},
)  # fmt: skip


def _single(profile: str, per_gpu: int) -> dict[str, Any]:
    """An A100-80GB node type with every GPU cut into one profile (single strategy)."""
    layouts = [{profile: per_gpu}] * 4
    return {"gpuModel": "A100-SXM4-80GB", "migStrategy": "single", "migLayouts": layouts}


A100_1G, A100_2G, A100_3G = _single("1g.10gb", 7), _single("2g.20gb", 3), _single("3g.40gb", 2)

# Packing: two fixed inventories (name prefix, count, node type); every node has 64 CPUs. In both
# every device is `nvidia.com/gpu` and the kinds differ, so a job that several kinds hold can be
# served by any of them: that choice is the scheduler's, and what the arms differ in.
# single: the device plugin's single strategy, A100-80GB GPUs cut into one profile per node, and
# whole GPUs (108 devices: 56 x 1g.10gb, 24 x 2g.20gb, 16 x 3g.40gb, 12 whole).
# whole: whole GPUs of four products (36 devices: 16 A100-40GB, 8 A100-80GB, 8 H100-80GB,
# 4 H100 NVL).
PACKING_INVENTORIES: dict[str, tuple[tuple[str, int, dict[str, Any]], ...]] = {
    "single": (
        ("a100-1g", 2, {**A100_1G, "gpus": 4}),
        ("a100-2g", 2, {**A100_2G, "gpus": 4}),
        ("a100-3g", 2, {**A100_3G, "gpus": 4}),
        ("h100", 2, {"gpuModel": "H100-80GB-HBM3", "gpus": 4, "migStrategy": "none"}),
        ("a100", 1, {"gpuModel": "A100-SXM4-80GB", "gpus": 4, "migStrategy": "none"}),
    ),
    "whole": (
        ("a100-40", 2, {"gpuModel": "A100-SXM4-40GB", "gpus": 8, "migStrategy": "none"}),
        ("a100-80", 1, {"gpuModel": "A100-SXM4-80GB", "gpus": 8, "migStrategy": "none"}),
        ("h100", 1, {"gpuModel": "H100-80GB-HBM3", "gpus": 8, "migStrategy": "none"}),
        ("h100-nvl", 1, {"gpuModel": "H100-NVL", "gpus": 4, "migStrategy": "none"}),
    ),
}  # fmt: skip

# GPU products the packing inventories add to the dev cluster's (GFD's figures; whole GPUs only).
EXTRA_GPU_MODELS: dict[str, Any] = {
    "H100-NVL": {
        "product": "NVIDIA-H100-NVL",
        "memoryMiB": 95830,
        "family": "hopper",
        "computeCapability": "9.0",
        "multiprocessors": 132,
    },
}

# The load: (seconds, offered load) phases, the offered load being the device-seconds jobs ask
# for per second over the devices there are. Arrivals exceed capacity in the middle phase.
DEFAULT_PHASES = ((90.0, 0.6), (90.0, 1.5), (90.0, 0.6))
DRAIN_S = 60.0  # the horizon: arrivals end, then this long for the queue to drain
DURATION_S = (20.0, 90.0)  # each job runs uniformly this long once bound

# -- the job table ------------------------------------------------------------------------------


def refresh_jobs() -> None:
    """Recompute bench/data/extender-jobs.json with the shipped predictor (ONNX without weights)."""
    from kubeseer.predictor import api
    from kubeseer.zoo import export, registry

    predictor = api.Predictor.load(None)
    rows: list[dict[str, Any]] = []
    version = ""
    with tempfile.TemporaryDirectory() as scratch:
        for name, batches in ARCHITECTURES.items():
            began = time.monotonic()
            spec = registry.standard_spec(name)
            path = Path(scratch) / f"{name}.onnx"
            export.export_onnx(spec, path, with_weights=False)
            inputs = {"seq": spec.input["seq_len"]} if "seq_len" in spec.input else None
            for mode in ("train", "infer"):
                for batch in batches:
                    p = predictor.predict(str(path), batch, mode, "fp32", inputs=inputs)
                    version = p.predictor_version
                    rows.append(
                        {
                            "model": name,
                            "mode": mode,
                            "batch": batch,
                            "precision": "fp32",
                            "point_bytes": round(p.memory_bytes.point),
                            "upper_bytes": round(p.memory_bytes.upper),
                        }
                    )
            print(f"  {name}: {time.monotonic() - began:.0f} s", file=sys.stderr)
    JOBS_FILE.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "about": "Predicted peak GPU memory (calibrated upper bound, fp32) of standard zoo "
        "architectures, made by `bench/extender.py --refresh-jobs` with the shipped predictor.",
        "predictor_version": version,
        "rows": rows,
    }
    JOBS_FILE.write_text(json.dumps(document, indent=1) + "\n")


@dataclass(frozen=True)
class Job:
    """One job of the stream: when it arrives (s after start), how long it runs, what it needs."""

    index: int
    arrival_s: float
    duration_s: float
    need_bytes: int
    model: str
    devices: int = 1

    @property
    def name(self) -> str:
        return f"job-{self.index:04d}"


def job_stream(
    phases: Sequence[tuple[float, float]],
    devices: int,
    seed: int,
    multi_device_share: float = MULTI_DEVICE_SHARE,
) -> list[Job]:
    """Jobs drawn uniformly from the table (the rows a single 80 GB device holds), arriving as
    a Poisson process whose rate in each phase gives that phase's offered load on `devices`
    devices, each running uniformly 20-90 s. A share of the training jobs are data-parallel on 2
    or 4 devices of one node (the row's memory on each)."""
    table = json.loads(JOBS_FILE.read_text())["rows"]
    usable = [r for r in table if r["upper_bytes"] <= LARGEST_DEVICE_BYTES]
    training = sum(1 for r in usable if r["mode"] == "train") / len(usable)
    units_per_job = 1 + multi_device_share * training * 2  # 2 or 4 devices: 3 on average
    mean_duration = sum(DURATION_S) / 2
    rng = random.Random(seed)
    jobs: list[Job] = []
    start = 0.0
    for span, load in phases:
        rate = load * devices / (units_per_job * mean_duration)
        clock = start
        while True:
            clock += rng.expovariate(rate)
            if clock >= start + span:
                break
            row = rng.choice(usable)
            # With a share of 0 no draw is made, so the single-device stream of a seed is stable.
            parallel = (
                multi_device_share > 0
                and row["mode"] == "train"
                and rng.random() < multi_device_share
            )
            jobs.append(
                Job(
                    index=len(jobs),
                    arrival_s=round(clock, 3),
                    duration_s=round(rng.uniform(*DURATION_S), 3),
                    need_bytes=int(row["upper_bytes"]),
                    model=f"{row['model']}/{row['mode']}/b{row['batch']}",
                    devices=rng.choice((2, 4)) if parallel else 1,
                )
            )
        start += span
    return jobs


# -- clusters ------------------------------------------------------------------------------------


def gpu_models() -> dict[str, Any]:
    """The GPU models of the shared dev inventory (GFD figures, MIG profiles)."""
    return yaml.safe_load(DEVCLUSTER_NODES.read_text())["gpuModels"]


def write_inventory(path: Path, node_list: Sequence[dict[str, Any]]) -> None:
    models = {**gpu_models(), **EXTRA_GPU_MODELS}
    path.write_text(yaml.safe_dump({"gpuModels": models, "nodes": list(node_list)}))


@contextlib.contextmanager
def running(
    inventory_file: Path, run_dir: Path, ready_timeout_s: float
) -> Iterator[tuple[cluster.LocalCluster, local.ExtenderProcess]]:
    """A local control plane with the extender stanza, and the extender process serving it."""
    port = local.free_port()
    with cluster.LocalCluster(
        run_dir=run_dir,
        inventory_file=inventory_file,
        extender_url=local.url_for(port),
        ready_timeout_s=ready_timeout_s,
        bins=binaries.locate(),
    ) as local_cluster:
        extender = local.ExtenderProcess(
            local_cluster.admin_kubeconfig, port, run_dir / "logs" / "extender.log"
        )
        extender.start(timeout_s=ready_timeout_s)
        try:
            yield local_cluster, extender
        finally:
            extender.stop()


def api_for(local_cluster: cluster.LocalCluster, pool: int = 16) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(local_cluster.admin_kubeconfig), client_configuration=configuration
    )
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def holder_pod(name: str, node: str, resource: str) -> dict[str, Any]:
    """A pod bound straight to `node` (no scheduler) holding one unit of `resource`."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {resource: "1"}}}
            ],
        },
    }


def wait_until(what: str, probe: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


# -- latency -------------------------------------------------------------------------------------


@dataclass
class LatencyRow:
    nodes: int
    calls: int
    p50_ms: float
    p99_ms: float
    passthrough_p50_ms: float
    passthrough_p99_ms: float
    cpu_ms: float
    passthrough_cpu_ms: float
    passed_nodes: int
    start_s: float
    idle_cpu_ms_per_s: float
    load_1m: list[float]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def latency(sizes: Sequence[int], calls: int, scratch: Path) -> list[LatencyRow]:
    fixture = json.loads(POD_FIXTURE.read_text())["Pod"]
    rows = []
    for size in sizes:
        node_list = []
        for i in range(size):
            kind = LATENCY_NODE_TYPES[i % len(LATENCY_NODE_TYPES)]
            node_list.append({"name": f"gpu-{i:04d}", "cpu": "64", "memory": "512Gi", **kind})
        run_dir = scratch / f"latency-{size}"
        run_dir.mkdir()
        write_inventory(run_dir / "nodes.yaml", node_list)
        began = time.monotonic()
        with running(run_dir / "nodes.yaml", run_dir, ready_timeout_s=900) as (lc, extender):
            start_s = time.monotonic() - began
            held = hold_half(lc, node_list)
            wait_until(
                "the extender to cache the bound pods",
                lambda held=held: (
                    extender.metric("kubeseer_extender_cached_objects", kind="pod") == held
                ),
                120,
            )
            names = [n["name"] for n in node_list]
            cpu, idle_began = extender.cpu_seconds(), time.monotonic()
            time.sleep(IDLE_WINDOW_S)
            idle_ms_per_s = (extender.cpu_seconds() - cpu) / (time.monotonic() - idle_began) * 1000
            loads = [os.getloadavg()[0]]
            decided, passed, cpu_ms = time_calls(
                extender.port, fixture, names, calls, extender.cpu_seconds
            )
            loads.append(os.getloadavg()[0])
            other = copy.deepcopy(fixture)
            other["spec"]["schedulerName"] = "default-scheduler"
            floor, _, floor_cpu_ms = time_calls(
                extender.port, other, names, calls, extender.cpu_seconds
            )
            loads.append(os.getloadavg()[0])
        rows.append(
            LatencyRow(
                nodes=size,
                calls=calls,
                p50_ms=round(statistics.median(decided), 2),
                p99_ms=round(percentile(decided, 99), 2),
                passthrough_p50_ms=round(statistics.median(floor), 2),
                passthrough_p99_ms=round(percentile(floor, 99), 2),
                cpu_ms=round(cpu_ms, 2),
                passthrough_cpu_ms=round(floor_cpu_ms, 2),
                passed_nodes=passed,
                start_s=round(start_s, 1),
                idle_cpu_ms_per_s=round(idle_ms_per_s, 2),
                load_1m=[round(x, 2) for x in loads],
            )
        )
        print(f"  {size} nodes: {asdict(rows[-1])}", file=sys.stderr)
    return rows


def hold_half(local_cluster: cluster.LocalCluster, node_list: Sequence[dict[str, Any]]) -> int:
    """Bind pods straight to nodes so that about half of every node's GPU units are held."""
    specs = inventory.parse({"gpuModels": gpu_models(), "nodes": list(node_list)}).nodes
    pods = []
    for spec in specs:
        for resource, units in spec.extended_resources().items():
            for unit in range(units // 2):
                name = f"hold-{spec.name}-{resource.rsplit('/', 1)[1]}-{unit}"
                pods.append(holder_pod(name.replace(".", "-"), spec.name, resource))
    api = api_for(local_cluster)
    core = client.CoreV1Api(api)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: core.create_namespaced_pod("default", p), pods))
    api.close()
    return len(pods)


def time_calls(
    port: int, pod: dict[str, Any], names: list[str], calls: int, cpu: Callable[[], float]
) -> tuple[list[float], int, float]:
    """Milliseconds per filter + prioritize pair, how many nodes passed the filter, and the
    extender's CPU milliseconds per timed pair (`cpu`: its CPU seconds so far).

    The request bodies are encoded before the clock starts (kube-scheduler encodes them in Go;
    this client's Python JSON is no part of the extender's latency) and the answers are read in
    full but decoded only during the warm-up, which also finds each body's surviving nodes.
    """
    variants = []
    for memory_gib in (4, 8, 16, 30, 60):
        body = copy.deepcopy(pod)
        body["metadata"]["annotations"][workload.ANNOTATION_PREDICTED_MEMORY] = str(
            memory_gib * GIB
        )
        variants.append(body)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    durations: list[float] = []
    passed = 0
    try:
        encoded = []
        for body in variants:
            filter_body = encode_args(body, names)
            survivors = json.loads(post(connection, "/filter", filter_body))["NodeNames"]
            encoded.append((filter_body, encode_args(body, survivors)))
            passed = max(passed, len(survivors))
        for call in range(calls + WARM_UP):
            if call == WARM_UP:
                cpu_began = cpu()
            filter_body, prioritize_body = encoded[call % len(encoded)]
            began = time.perf_counter()
            post(connection, "/filter", filter_body)
            post(connection, "/prioritize", prioritize_body)
            elapsed = (time.perf_counter() - began) * 1000
            if call >= WARM_UP:
                durations.append(elapsed)
        cpu_ms = (cpu() - cpu_began) / calls * 1000
    finally:
        connection.close()
    return durations, passed, cpu_ms


def encode_args(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def post(connection: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}: {data[:200]!r}")
    return data


# -- packing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """A kind of device of the packing inventory (every one is `nvidia.com/gpu`)."""

    product_label: str
    memory_bytes: int
    compute_slices: int


@dataclass
class ArmResult:
    arm: str
    jobs: int
    placed: int
    wait_mean_s: float
    wait_p95_s: float
    stranded_gib: float
    stranded_share: float
    memory_in_use: float
    idle_while_waiting_device_s: float
    placed_by_size: dict[str, str] = field(default_factory=dict)
    placed_by_time: dict[str, int] = field(default_factory=dict)
    wait_mean_by_size_s: dict[str, float] = field(default_factory=dict)


SIZE_CLASSES = (
    (9.5, "<= 9.5 GiB"),
    (19.5, "<= 19.5 GiB"),
    (39.5, "<= 39.5 GiB"),
    (80, "> 39.5 GiB"),
)
ARMS = ("default", "smallest-fit rule", "extender")


def size_class(need_bytes: int) -> str:
    return next(label for limit, label in SIZE_CLASSES if need_bytes <= limit * GIB)


def packing(
    inventory_name: str,
    phases: Sequence[tuple[float, float]],
    seed: int,
    multi_device_share: float,
    scratch: Path,
) -> tuple[list[ArmResult], dict[str, Any]]:
    node_list = []
    for prefix, count, kind in PACKING_INVENTORIES[inventory_name]:
        for i in range(count):
            node_list.append({"name": f"{prefix}-{i}", "cpu": "64", "memory": "512Gi", **kind})
    run_dir = scratch / f"packing-{inventory_name}"
    run_dir.mkdir()
    write_inventory(run_dir / "nodes.yaml", node_list)
    models = {**gpu_models(), **EXTRA_GPU_MODELS}
    specs = inventory.parse({"gpuModels": models, "nodes": node_list}).nodes
    devices: dict[str, Device] = {}
    units: dict[str, int] = {}
    for spec in specs:
        device = nodes.from_node(dict(inventory.build_node(spec))).devices["nvidia.com/gpu"]
        devices[spec.name] = Device(
            device.product_label, device.memory_bytes, device.compute_slices
        )
        units[spec.name] = spec.extended_resources()["nvidia.com/gpu"]
    capacity = sum(devices[n].memory_bytes * units[n] for n in units)
    jobs = job_stream(phases, sum(units.values()), seed, multi_device_share)
    horizon_s = sum(span for span, _ in phases) + DRAIN_S
    results = []
    with running(run_dir / "nodes.yaml", run_dir, ready_timeout_s=300) as (lc, extender):
        for arm in ARMS:
            print(f"  arm {arm} ...", file=sys.stderr)
            results.append(
                run_arm(arm, jobs, lc, extender, devices, units, capacity, phases, horizon_s)
            )
            print(f"    {asdict(results[-1])}", file=sys.stderr)
    kinds = sorted(set(devices.values()), key=lambda d: (d.memory_bytes, d.compute_slices))
    about = {
        "inventory": inventory_name,
        "devices": {
            d.product_label: sum(units[n] for n in units if devices[n] == d) for d in kinds
        },
        "phases": [{"seconds": span, "offered_load": load} for span, load in phases],
        "horizon_s": horizon_s,
        "seed": seed,
        "jobs": len(jobs),
        "capacity_gib": round(capacity / GIB, 1),
        "jobs_by_size": {
            label: sum(1 for j in jobs if size_class(j.need_bytes) == label)
            for _, label in SIZE_CLASSES
        },
        "multi_device_jobs": sum(1 for j in jobs if j.devices > 1),
        "offered_device_s": round(sum(j.devices * j.duration_s for j in jobs)),
    }
    return results, about


def admitted(arm: str, job: Job, devices: dict[str, Device]) -> set[str]:
    """The product labels a job's pod may land on in an arm.

    *default* and *extender*: every kind that holds the job, as the operator writes it when the
    extender is installed (`workload.admit_products`: what default scoring sees when the
    extender is down); *smallest-fit rule*: the smallest such kind only (fewest bytes, then
    fewest compute slices), as the operator pins it without the extender and as HAMi and
    Volcano choose a MIG profile.
    """
    holding = sorted(
        {d for d in devices.values() if d.memory_bytes >= job.need_bytes},
        key=lambda d: (d.memory_bytes, d.compute_slices, d.product_label),
    )
    if arm == "smallest-fit rule":
        holding = holding[:1]
    return {d.product_label for d in holding}


def pod_for(arm: str, job: Job, devices: dict[str, Device]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "4Gi"},
                    "limits": {"nvidia.com/gpu": str(job.devices)},
                },
            }
        ],
    }
    metadata: dict[str, Any] = {"name": job.name, "labels": {"bench": "extender"}}
    kinds = sorted(admitted(arm, job, devices))
    if arm == "smallest-fit rule":
        spec["nodeSelector"] = {"nvidia.com/gpu.product": kinds[0]}
    else:
        workload.admit_products(spec, kinds)
    if arm == "extender":
        spec["schedulerName"] = stanza.SCHEDULER_NAME
        metadata["annotations"] = {workload.ANNOTATION_PREDICTED_MEMORY: str(job.need_bytes)}
    return {"metadata": metadata, "spec": spec}


def run_arm(
    arm: str,
    jobs: Sequence[Job],
    local_cluster: cluster.LocalCluster,
    extender: local.ExtenderProcess,
    devices: dict[str, Device],
    units: dict[str, int],
    capacity: int,
    phases: Sequence[tuple[float, float]],
    horizon_s: float,
) -> ArmResult:
    """Create each job's pod when it arrives, delete it when it has run its duration since it
    was bound, and integrate what the devices hold over the horizon."""
    api = api_for(local_cluster)
    core = client.CoreV1Api(api)
    namespace = f"pack-{arm.split()[0].split('-')[0]}-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    bound: queue.Queue[tuple[str, str, float]] = queue.Queue()
    stop = threading.Event()
    watcher = threading.Thread(
        target=watch_bindings, args=(api, namespace, bound, stop), daemon=True
    )
    watcher.start()
    fits = {j.name: admitted(arm, j, devices) for j in jobs}
    start = time.monotonic()
    arrivals = list(jobs)
    by_name = {j.name: j for j in jobs}
    waiting: set[str] = set()
    placed: dict[str, tuple[str, float]] = {}
    running_until: dict[str, float] = {}
    used = dict.fromkeys(units, 0)
    stranded_integral = used_integral = idle_integral = 0.0
    last = 0.0
    while True:
        now = time.monotonic() - start
        step = now - last
        last = now
        holding = [(by_name[n], placed[n][0]) for n in running_until]
        stranded_integral += step * sum(
            j.devices * (devices[node].memory_bytes - j.need_bytes) for j, node in holding
        )
        used_integral += step * sum(j.devices * j.need_bytes for j, _ in holding)
        idle_integral += step * idle_for_waiting(waiting, by_name, fits, devices, units, used)
        if now >= horizon_s:
            break
        while arrivals and arrivals[0].arrival_s <= now:
            job = arrivals.pop(0)
            core.create_namespaced_pod(namespace, pod_for(arm, job, devices))
            waiting.add(job.name)
        with contextlib.suppress(queue.Empty):
            while True:
                name, node, at = bound.get_nowait()
                if name in placed or name not in by_name:
                    continue
                job = by_name[name]
                placed[name] = (node, at - start)
                waiting.discard(name)
                running_until[name] = at - start + job.duration_s
                used[node] += job.devices
        for name in [n for n, end in running_until.items() if end <= now]:
            del running_until[name]
            used[placed[name][0]] -= by_name[name].devices
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        time.sleep(0.05)
    stop.set()
    waits: dict[str, float] = {}
    for job in jobs:
        if job.name in placed:
            waits[job.name] = placed[job.name][1] - job.arrival_s
        elif job.arrival_s < horizon_s:
            waits[job.name] = horizon_s - job.arrival_s
    by_size, wait_by_size = {}, {}
    for _, label in SIZE_CLASSES:
        members = [j for j in jobs if size_class(j.need_bytes) == label and j.devices == 1]
        got = sum(1 for j in members if j.name in placed)
        by_size[label] = f"{got}/{len(members)}"
        if members:
            wait_by_size[label] = round(statistics.mean(waits[j.name] for j in members), 1)
    multi = [j for j in jobs if j.devices > 1]
    by_size["multi-device"] = f"{sum(1 for j in multi if j.name in placed)}/{len(multi)}"
    if multi:
        wait_by_size["multi-device"] = round(statistics.mean(waits[j.name] for j in multi), 1)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    core.delete_namespace(namespace)
    wait_until(
        "the extender's cache to drop the arm's pods",
        lambda: (extender.metric("kubeseer_extender_cached_objects", kind="pod") or 0) == 0,
        120,
    )
    api.close()
    used_total = used_integral + stranded_integral
    return ArmResult(
        arm=arm,
        jobs=len(jobs),
        placed=len(placed),
        wait_mean_s=round(statistics.mean(waits.values()), 1),
        wait_p95_s=round(percentile(list(waits.values()), 95), 1),
        stranded_gib=round(stranded_integral / horizon_s / GIB, 1),
        stranded_share=round(stranded_integral / used_total, 3) if used_total else 0.0,
        memory_in_use=round(used_integral / horizon_s / capacity, 3),
        idle_while_waiting_device_s=round(idle_integral),
        placed_by_size=by_size,
        placed_by_time={
            f"{end:g} s": sum(1 for _, at in placed.values() if at <= end)
            for end in itertools.accumulate(span for span, _ in phases)
        },
        wait_mean_by_size_s=wait_by_size,
    )


def idle_for_waiting(
    waiting: set[str],
    by_name: dict[str, Job],
    fits: dict[str, set[str]],
    devices: dict[str, Device],
    units: dict[str, int],
    used: dict[str, int],
) -> int:
    """Free devices that a waiting job could run on now (its memory, its arm's kinds, enough
    free units on the node), at most one job per device: capacity the scheduler left idle while
    a job that fits it waited (scheduling lag included)."""
    if not waiting:
        return 0
    idle = 0
    for node, total in units.items():
        free = total - used[node]
        label = devices[node].product_label
        if free <= 0:
            continue
        takers = sum(
            by_name[n].devices for n in waiting if label in fits[n] and by_name[n].devices <= free
        )
        idle += min(free, takers)
    return idle


def watch_bindings(
    api: client.ApiClient,
    namespace: str,
    bound: queue.Queue[tuple[str, str, float]],
    stop: threading.Event,
) -> None:
    """Report each pod's node the first time a watch event shows it bound."""
    core = client.CoreV1Api(api)
    seen: set[str] = set()
    while not stop.is_set():
        stream = watch.Watch().stream(
            core.list_namespaced_pod, namespace, timeout_seconds=5, deserialize=False
        )
        for event in stream:
            obj = event.get("object") or {}
            name = (obj.get("metadata") or {}).get("name", "")
            node = (obj.get("spec") or {}).get("nodeName")
            if node and name not in seen:
                seen.add(name)
                bound.put((name, node, time.monotonic()))
            if stop.is_set():
                break


# -- report --------------------------------------------------------------------------------------


def report(latency_rows: list[LatencyRow], arms: list[ArmResult], about: dict[str, Any]) -> None:
    """Print the tables and whether each goal was met (an unmet goal is a finding, not an error)."""
    if latency_rows:
        print(
            "\n| nodes | filter+prioritize p50 | p99 | extender CPU per pair "
            "| pass-through p50 | p99 | CPU | CPU cost / floor | idle CPU (watches) "
            "| load 1 min |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in latency_rows:
            ratio = r.cpu_ms / r.passthrough_cpu_ms if r.passthrough_cpu_ms else float("nan")
            print(
                f"| {r.nodes:,} | {r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms | {r.cpu_ms:.2f} ms | "
                f"{r.passthrough_p50_ms:.2f} ms | {r.passthrough_p99_ms:.2f} ms | "
                f"{r.passthrough_cpu_ms:.2f} ms | {ratio:.2f}x | "
                f"{r.idle_cpu_ms_per_s:.1f} ms/s | {', '.join(map(str, r.load_1m))} |"
            )
        largest = max(latency_rows, key=lambda r: r.nodes)
        met = largest.p99_ms <= GOAL_P99_MS
        print(
            f"\ngoal p99 <= {GOAL_P99_MS:g} ms at {largest.nodes:,} nodes: "
            f"{largest.p99_ms:.2f} ms, {'met' if met else 'NOT met'}"
        )
    if arms:
        print(f"\nstream: {json.dumps(about)}")
        print(
            "\n| arm | placed | by size | wait mean | wait p95 | wait mean by size "
            "| stranded (avg) | stranded share | memory in use | idle while a fitting job waited |"
        )
        print("|---|---:|---|---:|---:|---|---:|---:|---:|---:|")
        for a in arms:
            sizes = ", ".join(f"{k} {v}" for k, v in a.placed_by_size.items())
            waits = ", ".join(f"{k} {v:.1f} s" for k, v in a.wait_mean_by_size_s.items())
            times = ", ".join(f"{v} by {k}" for k, v in a.placed_by_time.items())
            print(
                f"| {a.arm} | {a.placed}/{a.jobs} ({times}) | {sizes} | {a.wait_mean_s:.1f} s | "
                f"{a.wait_p95_s:.1f} s | {waits} | {a.stranded_gib:.1f} GiB | "
                f"{a.stranded_share:.1%} | {a.memory_in_use:.1%} | "
                f"{a.idle_while_waiting_device_s:,.0f} device-s |"
            )
        default, extender = arms[0], arms[-1]
        more = extender.placed > default.placed
        less = extender.stranded_gib < default.stranded_gib
        print(
            f"\nextender against default scoring (goal: places more and strands less): "
            f"places more {'yes' if more else 'NO'} ({extender.placed} vs {default.placed}), "
            f"strands less {'yes' if less else 'NO'} ({extender.stranded_gib:.1f} vs "
            f"{default.stranded_gib:.1f} GiB), waits {extender.wait_mean_s:.1f} vs "
            f"{default.wait_mean_s:.1f} s (mean), {extender.wait_p95_s:.1f} vs "
            f"{default.wait_p95_s:.1f} s (p95)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["latency", "packing", "all"], default="all")
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument(
        "--phases",
        default=",".join(f"{span:g}:{load:g}" for span, load in DEFAULT_PHASES),
        help="SECONDS:OFFERED_LOAD,... of the arrivals (default %(default)s)",
    )
    parser.add_argument("--inventory", choices=sorted(PACKING_INVENTORIES), default="single")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--multi-device-share", type=float, default=MULTI_DEVICE_SHARE)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--refresh-jobs", action="store_true")
    args = parser.parse_args(argv)
    if args.refresh_jobs or not JOBS_FILE.exists():
        print("computing the job table with the shipped predictor ...", file=sys.stderr)
        refresh_jobs()
    with tempfile.TemporaryDirectory(prefix="bench-extender-") as tmp:
        scratch = Path(tmp)
        latency_rows: list[LatencyRow] = []
        arms: list[ArmResult] = []
        about: dict[str, Any] = {}
        if args.part in ("latency", "all"):
            sizes = [int(s) for s in args.sizes.split(",")]
            latency_rows = latency(sizes, args.calls, scratch)
        if args.part in ("packing", "all"):
            phases = [
                (float(span), float(load))
                for span, load in (p.split(":") for p in args.phases.split(","))
            ]
            arms, about = packing(
                args.inventory, phases, args.seed, args.multi_device_share, scratch
            )
    report(latency_rows, arms, about)
    if args.json:
        document = {
            "latency": [asdict(r) for r in latency_rows],
            "packing": [asdict(a) for a in arms],
            "stream": about,
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
