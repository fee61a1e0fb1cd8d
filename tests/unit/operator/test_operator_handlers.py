"""kopf shells: registration, settings, credentials, and the mapping onto kopf's errors."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import kubernetes.client
import pytest

from kubeseer.operator import dljob, errors, handlers, main, ports, stalls
from kubeseer.operator.config import GpuBackend, OperatorConfig
from kubeseer.operator.fetch import errors as fetch_errors


@pytest.mark.parametrize(
    ("backend", "inventory"),
    [
        (GpuBackend.EXTENDED, [("pods", "on_pod")]),
        (
            GpuBackend.DRA,
            [("resourceslices", "on_resource_slice"), ("resourceclaims", "on_resource_claim")],
        ),
    ],
)
def test_every_handler_is_registered_on_the_registry_given(
    backend: GpuBackend, inventory: list[tuple[str, str]]
) -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, backend)
    changing = {(h.selector.any_name, h.id) for h in registry._changing.get_all_handlers()}
    assert changing == {("dljobs", "reconcile")}
    watching = [(h.selector.any_name, h.fn.__name__) for h in registry._watching.get_all_handlers()]
    assert sorted(watching) == sorted(
        [
            ("dljobs", "on_dljob_event"),
            ("jobs", "on_workload_job"),
            ("nodes", "on_node"),
            *inventory,
        ]
    )
    # The inventory's watches come before the workload's: a device freed by an attempt has
    # left the inventory before the next attempt is placed.
    assert watching.index(inventory[-1]) < watching.index(("jobs", "on_workload_job"))
    assert kopf.OperatorRegistry()._changing.get_all_handlers() == []


def test_settings_need_no_crd_or_namespace_watches_and_post_only_warnings() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings, OperatorConfig(max_workers=7))
    assert settings.scanning.disabled
    assert settings.posting.level == logging.WARNING
    assert settings.execution.max_workers == 7


def context(world: Any, *, dra: bool = False) -> handlers.OperatorContext:
    return handlers.OperatorContext(
        config=world.config,
        cluster=world.cluster,  # type: ignore[arg-type]
        inventory=world.inventory,
        reconciler=world.reconciler,
        login=lambda: kopf.ConnectionInfo(server="https://127.0.0.1:1"),
        devices=world.devices if dra else None,
    )


def call_on_dljob(world: Any, retry: int = 0) -> None:
    ref = world.submit()
    body = world.cluster.dljobs[ref.name]
    asyncio.run(
        handlers.on_dljob(
            memo=context(world),
            spec=body["spec"],
            status=body["status"],
            name=ref.name,
            namespace=ref.namespace,
            uid=ref.uid,
            retry=retry,
        )
    )


def test_a_transient_failure_becomes_a_temporary_error_with_the_configured_delay(
    make_world: Any,
) -> None:
    world = make_world()
    world.models.sources["resnet"] = fetch_errors.UnreachableError("timed out")
    with pytest.raises(kopf.TemporaryError) as raised:
        call_on_dljob(world)
    assert raised.value.delay == world.config.retry_delay_s


def test_a_failed_dljob_becomes_a_permanent_error(make_world: Any) -> None:
    world = make_world()
    world.predict_fn.table[b"resnet-bytes"] = (500.0, 600.0)
    with pytest.raises(kopf.PermanentError, match="NoFit"):
        call_on_dljob(world)


def test_an_api_outage_while_recording_progress_is_retried(make_world: Any) -> None:
    world = make_world()

    def unavailable(ref: Any, patch: Any) -> Any:
        raise errors.UnavailableError("503", status=503)

    world.cluster.patch_status = unavailable  # type: ignore[method-assign]
    with pytest.raises(kopf.TemporaryError):
        call_on_dljob(world)


def test_the_memo_must_be_the_operator_context() -> None:
    with pytest.raises(TypeError, match="OperatorContext"):
        handlers.on_login(memo=kopf.Memo())


def job_body(name: str, **status: Any) -> dict[str, Any]:
    """An attempt's Job as the watch delivers it: owned by the DLJob `resnet`."""
    owner = {"apiVersion": "kubeseer.io/v1alpha1", "kind": "DLJob", "name": "resnet", "uid": "u"}
    return {
        "metadata": {"name": name, "namespace": "ml", "ownerReferences": [owner]},
        "status": status,
    }


def failed(reason: str) -> dict[str, Any]:
    return {"conditions": [{"type": "Failed", "status": "True", "reason": reason}], "failed": 1}


LABELS = {"kubeseer.io/dljob": "resnet", "kubeseer.io/attempt": "0"}


def job_event(world: Any, kind: str, body: dict[str, Any]) -> None:
    asyncio.run(
        handlers.on_workload_job(
            memo=context(world),
            event={"type": kind},
            body=body,
            labels=LABELS,
            name=body["metadata"]["name"],
            namespace="ml",
        )
    )


def test_a_job_with_a_ready_pod_moves_the_dljob_to_running(make_world: Any) -> None:
    world = make_world()
    call_on_dljob(world)
    job_event(world, "MODIFIED", job_body("resnet-0", active=1))
    assert world.cluster.status("resnet")["phase"] == "Placed"
    job_event(world, "MODIFIED", job_body("resnet-0", active=1, ready=1))
    assert world.cluster.status("resnet")["phase"] == "Running"


@pytest.mark.parametrize(
    ("kind", "status"),
    [("DELETED", {"active": 1, "ready": 1}), ("MODIFIED", failed("BackoffLimitExceeded"))],
    ids=["the Job deleted", "its pod deleted (the Job counts it failed)"],
)
def test_a_running_workload_deleted_by_hand_starts_the_next_attempt(
    make_world: Any, kind: str, status: dict[str, Any]
) -> None:
    """Issue 17: the DLJob stayed Running for ever once its pod was deleted."""
    world = make_world()
    call_on_dljob(world)
    job_event(world, "MODIFIED", job_body("resnet-0", active=1, ready=1))
    job_event(world, kind, job_body("resnet-0", **status))
    status = world.cluster.status("resnet")
    assert (status["phase"], status["placement"]["attempt"]) == ("Placed", 1)
    assert status["attempts"][0]["outcome"] == "Deleted"
    assert "resnet-1" in world.cluster.workloads
    ready = world.condition("resnet", handlers.dljob.ConditionType.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "WorkloadDeleted")


def test_a_failed_pod_of_the_job_fails_the_dljob_with_its_exit(make_world: Any) -> None:
    world = make_world()
    call_on_dljob(world)
    terminated = {"terminated": {"exitCode": 2, "message": "bad flag"}}
    statuses = [{"name": "main", "state": terminated}]
    world.cluster.job_pods["resnet-0"] = [
        {"status": {"phase": "Failed", "containerStatuses": statuses}}
    ]
    job_event(world, "MODIFIED", job_body("resnet-0", **failed("BackoffLimitExceeded")))
    ready = world.condition("resnet", handlers.dljob.ConditionType.WORKLOAD_READY)
    assert ready["reason"] == "PodFailed"
    assert "container main exited with code 2: bad flag" in ready["message"]


def test_a_finished_job_deleted_later_changes_nothing(make_world: Any) -> None:
    world = make_world()
    call_on_dljob(world)
    complete = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    job_event(world, "MODIFIED", job_body("resnet-0", **complete))
    patches = world.cluster.patches
    job_event(world, "DELETED", job_body("resnet-0", **complete))
    assert world.cluster.patches == patches
    assert world.cluster.status("resnet")["phase"] == "Succeeded"


def test_an_allocated_claim_is_held_in_the_dra_inventory_and_written_to_its_dljob(
    make_world: Any,
) -> None:
    world = make_world(dra=True)
    call_on_dljob(world)
    template = world.cluster.claim_templates["resnet-0"]
    spec = template["spec"]["spec"]
    rung = spec["devices"]["requests"][0]["firstAvailable"][0]["name"]
    node, device = "gpu-a100-40-dra-dynamic-0", "gpu-0-mig-1g5gb-19-6"
    claim = {
        "metadata": {"name": "resnet-0-x-gpu-y", "namespace": "ml", **template["spec"]["metadata"]},
        "spec": spec,
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": f"gpu/{rung}",
                            "driver": "gpu.nvidia.com",
                            "pool": node,
                            "device": device,
                        }
                    ]
                }
            }
        },
    }
    label = "NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.5gb"
    # Placing assumed one 1g.5gb taken: 6 of 7 free until the claim says which.
    assert world.devices.snapshot().free_units(*label) == 6
    asyncio.run(
        handlers.on_resource_claim(
            memo=context(world, dra=True), event={"type": "MODIFIED", "object": claim}
        )
    )
    assert world.cluster.status("resnet")["allocation"]["device"] == f"{node}/{device}"
    assert world.devices.snapshot().free_units(*label) == 6  # held, no longer assumed
    asyncio.run(
        handlers.on_resource_claim(
            memo=context(world, dra=True), event={"type": "DELETED", "object": claim}
        )
    )
    assert world.devices.snapshot().free_units(*label) == 7


def test_kopf_logs_in_with_the_clients_token_or_certificate() -> None:
    token = kubernetes.client.Configuration(
        host="https://10.0.0.1:6443", api_key={"BearerToken": "abc"}
    )
    token.api_key_prefix = {"BearerToken": "Bearer"}
    info = main.connection_info(token)
    assert (info.server, info.scheme, info.token) == ("https://10.0.0.1:6443", "Bearer", "abc")
    cert = kubernetes.client.Configuration(host="https://127.0.0.1:6443")
    cert.cert_file, cert.key_file, cert.ssl_ca_cert = "/c.crt", "/c.key", "/ca.crt"
    info = main.connection_info(cert)
    assert (info.certificate_path, info.private_key_path, info.ca_path) == (
        "/c.crt",
        "/c.key",
        "/ca.crt",
    )
    assert info.token is None


def test_the_job_and_pod_watches_feed_the_stall_watch(make_world: Any) -> None:
    """A resumed Job without pods, seen by the Job watch, is looked at after the grace; its
    pod, seen by the pod watch, is followed while it waits unschedulable."""
    world = make_world(move_after_s=30.0)
    call_on_dljob(world)
    body = job_body("resnet-0", startTime="2026-11-25T14:00:00Z")
    body["metadata"].update(uid="uid-job-resnet-0", labels=dict(LABELS))
    job_event(world, "MODIFIED", body)
    world.now += stalls.POD_GRACE_S
    assert [s.kind for s in world.reconciler.stalls.due()] == [stalls.StallKind.MISSING_PODS]

    pod = {
        "metadata": {
            "name": "resnet-0-x7k2p",
            "namespace": "ml",
            "labels": {**LABELS, stalls.JOB_NAME_LABEL: "resnet-0"},
        },
        "spec": {"containers": []},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    asyncio.run(handlers.on_pod(memo=context(world), event={"type": "ADDED", "object": pod}))
    assert world.reconciler.stalls.unschedulable("ml/resnet-0")


def test_events_outside_kopfs_handlers_are_posted_directly() -> None:
    """kopf posts events only from inside its handling of an object; the sweep of stalled
    attempts runs on a thread of its own."""
    posted: list[tuple[Any, ...]] = []
    events = handlers.KopfEvents(lambda *event: posted.append(event))
    ref = dljob.DLJobRef("ml", "resnet", "u")
    events.emit(ref, ports.EventType.WARNING, dljob.Reason.QUOTA_EXCEEDED, "no room")
    assert posted == [(ref, ports.EventType.WARNING, dljob.Reason.QUOTA_EXCEEDED, "no room")]
