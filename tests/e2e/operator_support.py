"""What the operator's end-to-end tests share: models, DLJob manifests, API shortcuts, and the
operator run in a thread with test settings.

Not a test module: `test_operator*.py` import it (pytest puts this directory on sys.path).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import socket
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from onnx import TensorProto, helper

from kubeseer.operator import local, main
from kubeseer.operator.config import OperatorConfig

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"


def mlp(width: int, layers: int, features: int = 256) -> bytes:
    """A Gemm/Relu MLP with a symbolic batch; weights are external data (never read)."""
    nodes, inits, offset, prev, fan_in = [], [], 0, "x", features
    for i in range(layers):
        for name, dims in ((f"w{i}", [fan_in, width]), (f"b{i}", [width])):
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
            t.data_location = TensorProto.EXTERNAL
            length = 4 * (dims[0] * (dims[1] if len(dims) > 1 else 1))
            for k, v in (("location", "w.bin"), ("offset", offset), ("length", length)):
                e = t.external_data.add()
                e.key, e.value = k, str(v)
            offset += length
            inits.append(t)
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"]))
        prev, fan_in = f"r{i}", width
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


SMALL = mlp(width=1024, layers=2)
# 8 layers of 65536 x 65536: 34G parameters, far beyond any GPU when trained with Adam.
HUGE = mlp(width=65536, layers=8, features=65536)
CORRUPT = b"\x08\x07this is not a protobuf of an ONNX model\xff\xfe"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def operator_config(tmp: Path, **overrides: Any) -> OperatorConfig:
    """Fast retries, loopback models allowed, no fixed ports."""
    values: dict[str, Any] = {
        "retry_delay_s": 0.5,
        "max_retries": 1,
        "metrics_port": free_port(),
        "health_port": free_port(),
        "fetch_allowed_hosts": ("127.0.0.1",),
        "fetch_connect_timeout_s": 1.0,
        "fetch_read_timeout_s": 5.0,
        "fetch_cache_dir": tmp / "models",
        **overrides,
    }
    return OperatorConfig(**values)


@contextlib.contextmanager
def operator_thread(built: main.Operator, namespaces: tuple[str, ...] = ()) -> Iterator[None]:
    """`local.OperatorThread`, and once it has stopped, the sockets its event loop left behind
    collected here rather than in whichever later test the garbage collector happens to run.

    kopf closes its aiohttp sessions on the way out, but a transport is only released on a
    later iteration of a loop that by then has closed with the thread; the garbage collector
    then warns about each socket, and pytest reports that against an unrelated test (a CI run
    failed that way at the setup of a measurement unit test). In a deployed operator the loop
    lives as long as the process, so this is a property of running kopf in a test's thread.
    """
    try:
        with local.OperatorThread(built, namespaces=namespaces):
            yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


RUNS_FOR = "24h"
"""How long KWOK keeps a DLJob's pod Running before it completes it (the general pod-complete
stage reads the delay, and the jitter that caps it, from the pod's annotations), so that a test
sees a running job and can make it fail; `dljob(..., runs_for=None)` lets it finish in 1-6 s."""


def kwok_runs_for(duration: str) -> dict[str, str]:
    """Pod annotations that keep KWOK from completing a Job's pod for `duration`."""
    return {
        "pod-complete.stage.kwok.x-k8s.io/delay": duration,
        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": duration,
    }


def dljob(
    name: str,
    model: Mapping[str, Any],
    *,
    mode: str = "infer",
    batch: int = 8,
    runs_for: str | None = RUNS_FOR,
    **spec: Any,
) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {"containers": [{"name": "main", "image": "example/job:1"}]}
    }
    if runs_for is not None:
        template["metadata"] = {"annotations": kwok_runs_for(runs_for)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": {
            "model": dict(model),
            "mode": mode,
            "batchSize": batch,
            "template": template,
            **spec,
        },
    }


def submit(api: client.ApiClient, namespace: str, body: Mapping[str, Any]) -> None:
    custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, dict(body))


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def configmap(api: client.ApiClient, namespace: str, name: str, data: bytes) -> dict[str, str]:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace,
        {"metadata": {"name": name}, "binaryData": {"model.onnx": base64.b64encode(data).decode()}},
    )
    return {"name": name, "key": "model.onnx"}


def phase_is(api: client.ApiClient, namespace: str, name: str, *phases: str) -> Any:
    def probe() -> dict[str, Any] | None:
        body = get(api, namespace, name)
        return body if body.get("status", {}).get("phase") in phases else None

    return probe


def condition(body: Mapping[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in body["status"].get("conditions", []) if c["type"] == kind]
    assert found, f"no {kind} condition in {body['status']}"
    return dict(found[0])


def pods_of(
    api: client.ApiClient, namespace: str, name: str, attempt: int | None = None
) -> list[Any]:
    """The pods of a DLJob's Jobs (of one attempt, if given), by the labels kubeseer sets."""
    selector = f"kubeseer.io/dljob={name}"
    if attempt is not None:
        selector += f",kubeseer.io/attempt={attempt}"
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items)


def jobs_of(api: client.ApiClient, namespace: str) -> list[Any]:
    """Every Job of the namespace."""
    return list(client.BatchV1Api(api).list_namespaced_job(namespace).items)


def oom_kill(api: client.ApiClient, namespace: str, pod: str) -> None:
    """Make a running pod end as the kernel's OOM killer ends a container."""
    _end(api, namespace, pod, "Failed", 137, "OOMKilled")


def finish(api: client.ApiClient, namespace: str, pod: str) -> None:
    """End a running pod as a kubelet reports a container that exited 0."""
    _end(api, namespace, pod, "Succeeded", 0, "Completed")


def _end(
    api: client.ApiClient, namespace: str, pod: str, phase: str, exit_code: int, reason: str
) -> None:
    """KWOK runs no container, so a pod's end is written as a kubelet would write it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "example/job:1",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
    )


def table(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """`kubectl get dlj` as the API server renders it (printer columns)."""
    response = api.call_api(
        "GET",
        f"{api.configuration.host}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    response.read()
    return dict(json.loads(response.data))


def events_of(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    """The events posted about the DLJob (or any object) called `name`."""
    return list(
        client.CoreV1Api(api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
