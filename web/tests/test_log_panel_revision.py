"""The deployment page's Triton-log panel shows the serving revision's log, not the newest server's (a canary's,
or one rolled back), and says whose it is and how to read the canary's."""

from __future__ import annotations

from pathlib import Path

from deployments.models import Deployment, Revision, TritonServer
from models_registry.models import ModelVersion
from tests.support.deploying import deploy
from tests.support.people import Person, signed_in


def server(deployment: Deployment, revision: Revision, log: Path, text: str) -> None:
    log.write_text(text)
    TritonServer.objects.create(deployment=deployment, revision=revision, pid=2**22 + revision.number, http_port=1,
                                grpc_port=2, metrics_port=3, log_path=str(log), state=TritonServer.State.READY)


def test_the_panel_shows_the_serving_revisions_log_and_says_whose(alice: Person, digits: ModelVersion,
                                                                   tmp_path: Path) -> None:
    deployment = deploy(alice)
    stable = deployment.revision
    assert stable is not None
    canary = Revision.objects.create(deployment=deployment, number=2, spec=stable.spec)
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=stable, status=Deployment.Status.READY,
                                                       canary_revision=canary, canary_percent=20)
    server(deployment, stable, tmp_path / "r1.log", "I0101 server.cc:1] revision 1 serving\n")
    server(deployment, canary, tmp_path / "r2.log", "E0101 main.cc:1] failed to stop server\n")

    page = signed_in(alice).get("/deployments/digits-prod/logs/").content.decode()

    assert "revision 1 serving" in page and "failed to stop server" not in page
    assert "The log of revision 1 (serving)." in page
    assert "modelport logs digits-prod --revision 2" in page


def test_after_a_rollback_the_panel_offers_no_canary(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    deployment = deploy(alice)
    stable = deployment.revision
    assert stable is not None
    rolled_back = Revision.objects.create(deployment=deployment, number=2, spec=stable.spec)
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=stable, status=Deployment.Status.READY)
    server(deployment, stable, tmp_path / "r1.log", "I0101 server.cc:1] revision 1 serving\n")
    server(deployment, rolled_back, tmp_path / "r2.log", "E0101 main.cc:1] failed to stop server\n")

    page = signed_in(alice).get("/deployments/digits-prod/logs/").content.decode()

    assert "revision 1 serving" in page and "failed to stop server" not in page
    assert "The log of revision 1 (serving)." in page and "--revision" not in page
