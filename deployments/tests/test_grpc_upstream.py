"""Deployment.grpc_upstream: what the gRPC gateway forwards to, filled for deployments that were already serving
when it was added (migration 0004), so that they need no restart."""

from __future__ import annotations

import importlib
from typing import Any

from django.apps import apps

from conftest import Person
from deployments.models import Deployment, Revision, TritonServer

migration = importlib.import_module("deployments.migrations.0004_deployment_grpc_upstream")


def serving(person: Person, name: str, runtime: str, upstream_url: str) -> Deployment:
    deployment = Deployment.objects.create(team=person.team, name=name, runtime=runtime, upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": []})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    deployment.refresh_from_db()
    return deployment


def test_the_migration_finds_the_grpc_port_of_the_server_already_serving(alice: Person) -> None:
    local = serving(alice, "digits", "local", "http://127.0.0.1:41000")
    assert local.serving_revision is not None
    for state, http_port, grpc_port in [("stopped", 41000, 42999), ("ready", 41000, 42001), ("ready", 43000, 43001)]:
        TritonServer.objects.create(deployment=local, revision=local.serving_revision, pid=1, http_port=http_port,
                                    grpc_port=grpc_port, metrics_port=1, log_path="x", state=state)
    serving(alice, "digits-k8s", "kubernetes", "http://digits.modelport-acme.svc.cluster.local:8000")
    serving(alice, "stopped", "local", "")
    migration.fill_grpc_upstream(apps, None)
    values = dict(Deployment.objects.values_list("name", "grpc_upstream"))
    assert values == {"digits": "127.0.0.1:42001", "digits-k8s": "digits.modelport-acme.svc.cluster.local:8001",
                      "stopped": ""}


def test_the_local_runtime_launch_names_the_servers_grpc_endpoint(alice: Person) -> None:
    from deployments.runtimes.local.runtime import _describe

    deployment = serving(alice, "digits", "local", "")
    assert deployment.serving_revision is not None
    server = TritonServer.objects.create(deployment=deployment, revision=deployment.serving_revision, pid=1,
                                         http_port=41000, grpc_port=41001, metrics_port=41002, log_path="x")
    launch = _describe(server)
    assert (launch.url, launch.grpc_target) == ("http://127.0.0.1:41000", "127.0.0.1:41001")


def test_stopping_clears_both_upstreams_in_one_update(alice: Person, monkeypatch: Any) -> None:
    from deployments import reconcile

    deployment = serving(alice, "digits", "local", "http://127.0.0.1:41000")
    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream="127.0.0.1:41001",
                                                       desired_state=Deployment.Desired.STOPPED)
    deployment.refresh_from_db()

    class Runtime:
        def stop(self, deployment: Deployment) -> None:
            row = Deployment.objects.get(pk=deployment.pk)
            assert (row.upstream_url, row.grpc_upstream) == ("", "")  # the gateways let go before Triton stops

    reconcile._stop(deployment, Runtime())  # type: ignore[arg-type]
    deployment.refresh_from_db()
    assert (deployment.status, deployment.upstream_url, deployment.grpc_upstream) == ("stopped", "", "")
