"""Deployment.grpc_upstream: what the gRPC gateway forwards to, switched with the HTTP route. (The data migration
that filled it for deployments serving before it existed went with the fold of the migrations: every database
that needed it has run it.)"""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment, Revision, TritonServer
from tests.support.people import Person


def serving(person: Person, name: str, runtime: str, upstream_url: str) -> Deployment:
    deployment = Deployment.objects.create(team=person.team, name=name, runtime=runtime, upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": []})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    deployment.refresh_from_db()
    return deployment


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
