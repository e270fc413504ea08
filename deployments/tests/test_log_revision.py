"""Whose Triton log the logs API and the deployment page show: the serving revision's, not the newest server's. A
canary rolled back started after the server that serves, and showing its log ("failed to stop server") read as if
what serves had failed. The answer says which revision the log is of; the canary's is asked for by number."""

from __future__ import annotations

from pathlib import Path

from deployments.models import Deployment, Revision, TritonServer
from models_registry.models import ModelVersion
from tests.support.deploying import post_deployment as create
from tests.support.people import Person

STABLE_LOG = "I0101 00:00:00.000000 1 server.cc:1] revision 1 serving\n"
CANARY_LOG = "E0101 00:00:01.000000 1 main.cc:1] failed to stop server: Internal - Exit timeout expired\n"


def server(deployment: Deployment, revision: Revision, log: Path, text: str) -> TritonServer:
    log.write_text(text)
    return TritonServer.objects.create(deployment=deployment, revision=revision, pid=2**22 + revision.number,
                                       http_port=1, grpc_port=2, metrics_port=3, log_path=str(log),
                                       state=TritonServer.State.READY)


def with_canary(tmp_path: Path, *, rolled_back: bool) -> Deployment:
    """digits-prod with revision 1 serving and revision 2's server started after it, as a canary or rolled back."""
    deployment = Deployment.objects.get()
    stable = deployment.revision
    assert stable is not None
    canary = Revision.objects.create(deployment=deployment, number=2, spec=stable.spec)
    Deployment.objects.filter(pk=deployment.pk).update(
        serving_revision=stable, status=Deployment.Status.READY, canary_revision=None if rolled_back else canary,
        canary_percent=0 if rolled_back else 20)
    server(deployment, stable, tmp_path / "r1.log", STABLE_LOG)
    server(deployment, canary, tmp_path / "r2.log", CANARY_LOG)  # the newer server
    return Deployment.objects.get()


def test_after_a_canary_rollback_the_log_is_the_serving_revisions_and_says_so(
        alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    with_canary(tmp_path, rolled_back=True)

    body = alice.client().get("/api/v1/deployments/digits-prod/logs/").json()

    assert body == {"log": STABLE_LOG, "revision": 1, "revision_role": "serving", "canary_revision": None}


def test_the_rolled_back_canarys_log_is_there_when_asked_for_by_number(
        alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    with_canary(tmp_path, rolled_back=True)

    body = alice.client().get("/api/v1/deployments/digits-prod/logs/?revision=2").json()

    assert body["log"] == CANARY_LOG
    assert (body["revision"], body["revision_role"]) == (2, "retired")


def test_during_a_canary_the_answer_names_it_and_its_log_is_one_query_away(
        alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    with_canary(tmp_path, rolled_back=False)
    client = alice.client()

    stable = client.get("/api/v1/deployments/digits-prod/logs/").json()
    canary = client.get("/api/v1/deployments/digits-prod/logs/?revision=2").json()

    assert (stable["log"], stable["revision"], stable["revision_role"], stable["canary_revision"]) == (
        STABLE_LOG, 1, "serving", 2)
    assert (canary["log"], canary["revision"], canary["revision_role"]) == (CANARY_LOG, 2, "canary")


def test_a_revision_it_does_not_have_is_a_400_naming_revision(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    client = alice.client()

    for query, says in (("revision=9", "digits-prod has no revision 9"), ("revision=0", "at least 1"),
                        ("revision=two", "must be an integer")):
        response = client.get(f"/api/v1/deployments/digits-prod/logs/?{query}")
        assert response.status_code == 400, query
        assert says in " ".join(response.json()["error"]["fields"]["revision"]), (query, response.json())


def test_another_teams_revision_number_shows_nothing_of_its_log(
        alice: Person, charlie: Person, digits: ModelVersion, tmp_path: Path) -> None:
    create(alice)
    with_canary(tmp_path, rolled_back=False)

    response = charlie.client().get("/api/v1/deployments/digits-prod/logs/?revision=2")

    assert response.status_code == 404
    assert "failed to stop server" not in response.content.decode()

