"""kopf shells: registration, settings, credentials, and the mapping onto kopf's errors."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import kubernetes.client
import pytest

from kubeseer.operator import errors, handlers, main
from kubeseer.operator.config import OperatorConfig
from kubeseer.operator.fetch import errors as fetch_errors


def test_every_handler_is_registered_on_the_registry_given() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    changing = {(h.selector.any_name, h.id) for h in registry._changing.get_all_handlers()}
    assert changing == {("dljobs", "reconcile")}
    watching = [(h.selector.any_name, h.fn.__name__) for h in registry._watching.get_all_handlers()]
    assert sorted(watching) == sorted(
        [
            ("dljobs", "on_dljob_event"),
            ("pods", "on_workload_pod"),
            ("jobs", "on_workload_job"),
            ("nodes", "on_node"),
            ("pods", "on_pod"),
        ]
    )
    # A pod's inventory entry is updated before its DLJob hears of it (a deleted pod's slice is
    # free again when the next attempt is placed).
    assert watching.index(("pods", "on_pod")) < watching.index(("pods", "on_workload_pod"))
    assert kopf.OperatorRegistry()._changing.get_all_handlers() == []


def test_settings_need_no_crd_or_namespace_watches_and_post_only_warnings() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings, OperatorConfig(max_workers=7))
    assert settings.scanning.disabled
    assert settings.posting.level == logging.WARNING
    assert settings.execution.max_workers == 7


def context(world: Any) -> handlers.OperatorContext:
    return handlers.OperatorContext(
        config=world.config,
        cluster=world.cluster,  # type: ignore[arg-type]
        inventory=world.inventory,
        reconciler=world.reconciler,
        login=lambda: kopf.ConnectionInfo(server="https://127.0.0.1:1"),
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


def pod_body(name: str, phase: str) -> dict[str, Any]:
    """A workload pod as the watch delivers it: owned by the DLJob `resnet`."""
    owner = {"apiVersion": "kubeseer.io/v1alpha1", "kind": "DLJob", "name": "resnet", "uid": "u"}
    return {
        "metadata": {"name": name, "namespace": "ml", "ownerReferences": [owner]},
        "status": {"phase": phase},
    }


def pod_event(world: Any, kind: str, body: dict[str, Any], labels: dict[str, str]) -> None:
    asyncio.run(
        handlers.on_workload_pod(
            memo=context(world),
            event={"type": kind},
            body=body,
            labels=labels,
            name=body["metadata"]["name"],
            namespace="ml",
        )
    )


def test_pods_of_jobs_are_left_to_the_job_handler(make_world: Any) -> None:
    world = make_world()
    call_on_dljob(world)
    labels = {
        "kubeseer.io/dljob": "resnet",
        "kubeseer.io/attempt": "0",
        "batch.kubernetes.io/job-name": "resnet-0",
    }
    pod_event(world, "MODIFIED", pod_body("resnet-0", "Running"), labels)
    assert world.cluster.status("resnet")["phase"] == "Placed"
    del labels["batch.kubernetes.io/job-name"]
    pod_event(world, "MODIFIED", pod_body("resnet-0", "Running"), labels)
    assert world.cluster.status("resnet")["phase"] == "Running"


def test_a_running_pod_deleted_by_hand_starts_the_next_attempt(make_world: Any) -> None:
    """Issue 17: the DLJob stayed Running for ever once its pod was deleted."""
    world = make_world()
    call_on_dljob(world)
    labels = {"kubeseer.io/dljob": "resnet", "kubeseer.io/attempt": "0"}
    pod_event(world, "MODIFIED", pod_body("resnet-0", "Running"), labels)
    pod_event(world, "DELETED", pod_body("resnet-0", "Running"), labels)
    status = world.cluster.status("resnet")
    assert (status["phase"], status["placement"]["attempt"]) == ("Placed", 1)
    assert status["attempts"][0]["outcome"] == "Deleted"
    assert "resnet-1" in world.cluster.workloads
    ready = world.condition("resnet", handlers.dljob.ConditionType.WORKLOAD_READY)
    assert (ready["status"], ready["reason"]) == ("False", "WorkloadDeleted")


def test_a_finished_pod_deleted_later_changes_nothing(make_world: Any) -> None:
    world = make_world()
    call_on_dljob(world)
    labels = {"kubeseer.io/dljob": "resnet", "kubeseer.io/attempt": "0"}
    pod_event(world, "MODIFIED", pod_body("resnet-0", "Succeeded"), labels)
    patches = world.cluster.patches
    pod_event(world, "DELETED", pod_body("resnet-0", "Succeeded"), labels)
    assert world.cluster.patches == patches
    assert world.cluster.status("resnet")["phase"] == "Succeeded"


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
