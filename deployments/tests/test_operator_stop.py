"""`make stop-triton` (manage.py local_tritons --stop) stops the dedicated Tritons while the portal is stopped: the
next health check tells each deployment it was stopped on purpose, not that its Triton died (a newcomer's walk,
issue 31)."""

from __future__ import annotations

from pathlib import Path

from deployments.launch import Launch
from deployments.models import Deployment, TritonServer
from deployments.runtimes.local import runtime as local_runtime
from models_registry.models import ModelVersion
from tests.support.deploying import post_deployment as create
from tests.support.people import Person

GONE_PID = 2**22 + 11  # above the kernel's default pid_max: no process has it


def _serving(tmp_path: Path) -> tuple[Deployment, TritonServer, Launch]:
    deployment = Deployment.objects.get()
    server = TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=GONE_PID,
                                         http_port=1, grpc_port=2, metrics_port=3,
                                         log_path=str(tmp_path / "triton.log"), state=TritonServer.State.READY)
    assert deployment.revision is not None
    return deployment, server, Launch(revision_id=deployment.revision.pk, url="http://127.0.0.1:1", description="",
                                      ref=server.pk)


def test_a_triton_stopped_by_an_operator_is_expected(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    deployment, server, launch = _serving(tmp_path)
    local_runtime.mark_stopped_by_operator([GONE_PID])
    health = local_runtime.LocalRuntime().check(deployment, launch)
    assert not health.ok and health.expected
    assert health.message == f"its Triton (pid {GONE_PID}) was stopped by an operator (make stop-triton)"
    assert not list(tmp_path.glob("*.stopped-by-operator"))  # told once
    assert TritonServer.objects.get(pk=server.pk).state == TritonServer.State.STOPPED


def test_a_triton_that_died_unmarked_is_still_an_error(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    deployment, _, launch = _serving(tmp_path)
    health = local_runtime.LocalRuntime().check(deployment, launch)
    assert not health.ok and not health.expected
    assert health.message == f"the Triton process (pid {GONE_PID}) died"


def test_the_mark_names_only_the_servers_it_stopped(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    _serving(tmp_path)
    local_runtime.mark_stopped_by_operator([GONE_PID + 1])
    assert not list(tmp_path.glob("*.stopped-by-operator"))


def test_a_mark_for_an_earlier_server_of_the_same_log_is_no_excuse(alice: Person, digits: ModelVersion,
                                                                   tmp_path: Path) -> None:
    """The revision's Triton started again writes the same log: if it dies, it died."""
    create(alice)
    deployment, _, launch = _serving(tmp_path)
    (tmp_path / "triton.log.stopped-by-operator").write_text(str(GONE_PID - 1))
    health = local_runtime.LocalRuntime().check(deployment, launch)
    assert not health.expected and health.message == f"the Triton process (pid {GONE_PID}) died"
