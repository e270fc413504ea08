"""The canary API: PATCH with a rollout, POST .../promote and .../rollback; who may (bob of the same team does,
charlie of another team sees nothing), what is refused and how (a 4xx that says what to fix). The reconciler is not
run here: the canary's launch is written as the reconciler would record it (test_canary.py runs its steps)."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEntry
from deployments.models import Deployment, Event
from models_registry.models import ModelVersion
from tests.support.people import Person
from tests.support.versions import make_ready_version


@pytest.fixture
def ready(alice: Person, digits: ModelVersion) -> Deployment:
    response = alice.client().post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]},
                                   format="json")
    assert response.status_code == 201, response.json()
    deployment = Deployment.objects.get()
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.READY,
                                                       serving_revision=deployment.revision,
                                                       upstream_url="http://127.0.0.1:9", grpc_upstream="127.0.0.1:10")
    return Deployment.objects.get()


def patch(person: Person, body: Any) -> Any:
    return person.client().patch("/api/v1/deployments/digits-prod/", body, format="json")


CHANGE = {"models": [{"model": "digits", "max_batch_size": 4}]}


def serve_canary(deployment: Deployment) -> None:
    """What the reconciler records once the canary's launch is ready."""
    row = Deployment.objects.get(pk=deployment.pk)
    launch = {"revision_id": row.canary_revision_id, "url": "http://127.0.0.1:11", "grpc_target": "127.0.0.1:12",
              "description": "pid 2", "ref": 2}
    Deployment.objects.filter(pk=deployment.pk).update(canary_launch=launch, canary_upstream_url=launch["url"],
                                                       canary_grpc_upstream=launch["grpc_target"])


def test_bob_starts_a_canary_with_guardrails_and_the_api_shows_it(bob: Person, ready: Deployment) -> None:
    response = patch(bob, {**CHANGE, "rollout": {"strategy": "canary", "percent": 10, "max_error_rate": 0.02,
                                                 "window_seconds": 30, "auto_promote": True}})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["revision"] == 1 and body["serving_revision"] == 1  # the stable revision serves on
    assert body["models"][0]["max_batch_size"] != 4  # what is shown is the stable revision's
    assert body["canary"] == {"revision": 2, "percent": 10, "state": "starting", "serving_since": None,
                              "max_error_rate": 0.02, "max_p99_ratio": 2.0, "window_seconds": 30, "min_requests": 100,
                              "auto_promote": True}
    assert Event.objects.filter(message="Revision 2 created by bob as a canary for 10% of the requests.").exists()
    assert AuditEntry.objects.get(action="deployment.canary").detail["percent"] == 10


def test_a_plain_patch_has_no_canary(alice: Person, ready: Deployment) -> None:
    response = patch(alice, {**CHANGE, "rollout": {"strategy": "atomic"}})
    assert response.status_code == 200 and response.json()["canary"] is None
    assert response.json()["revision"] == 2


def test_promote_moves_the_route_and_rollback_ends_the_canary(alice: Person, bob: Person, ready: Deployment) -> None:
    assert patch(alice, {**CHANGE, "rollout": {"strategy": "canary", "percent": 50}}).status_code == 200
    response = bob.client().post("/api/v1/deployments/digits-prod/promote")
    assert response.status_code == 409
    assert response.json()["error"]["message"].startswith("The canary of revision 2 is not serving yet")
    serve_canary(ready)
    response = bob.client().post("/api/v1/deployments/digits-prod/promote")
    assert response.status_code == 200, response.json()
    assert response.json()["serving_revision"] == 2 and response.json()["canary"] is None
    row = Deployment.objects.get()
    assert row.upstream_url == "http://127.0.0.1:11" and row.grpc_upstream == "127.0.0.1:12"
    assert row.serving_launch is not None and row.serving_launch.ref == 2 and row.drain_until is not None
    # Another canary, rolled back.
    assert patch(alice, {"models": [{"model": "digits", "max_batch_size": 2}],
                         "rollout": {"strategy": "canary", "percent": 5}}).status_code == 200
    response = alice.client().post("/api/v1/deployments/digits-prod/rollback")
    assert response.status_code == 200 and response.json()["canary"] is None
    assert Deployment.objects.get().serving_revision.number == 2
    assert AuditEntry.objects.filter(action="deployment.rollback", username="alice").exists()


def test_without_a_canary_promote_and_rollback_say_so(alice: Person, ready: Deployment) -> None:
    for action, message in [("promote", "There is no canary to promote"),
                            ("rollback", "There is no canary to roll back")]:
        response = alice.client().post(f"/api/v1/deployments/digits-prod/{action}")
        assert response.status_code == 409
        assert response.json()["error"]["message"].startswith(message)


def test_charlie_cannot_see_promote_or_roll_back(alice: Person, charlie: Person, ready: Deployment) -> None:
    assert patch(alice, {**CHANGE, "rollout": {"strategy": "canary", "percent": 50}}).status_code == 200
    serve_canary(ready)
    for action in ("promote", "rollback"):
        assert charlie.client().post(f"/api/v1/deployments/digits-prod/{action}").status_code == 404
    assert patch(charlie, {**CHANGE, "rollout": {"strategy": "canary", "percent": 50}}).status_code == 404
    assert Deployment.objects.get().canary_upstream_url == "http://127.0.0.1:11"


def test_a_change_during_a_canary_is_a_409_that_says_what_to_do(alice: Person, ready: Deployment) -> None:
    assert patch(alice, {**CHANGE, "rollout": {"strategy": "canary", "percent": 50}}).status_code == 200
    response = patch(alice, {"models": [{"model": "digits", "max_batch_size": 2}]})
    assert response.status_code == 409
    assert "promote it (POST .../promote) or roll it back" in response.json()["error"]["message"]


def test_a_canary_needs_a_ready_deployment(alice: Person, ready: Deployment) -> None:
    Deployment.objects.filter(pk=ready.pk).update(status=Deployment.Status.STARTING)
    response = patch(alice, {**CHANGE, "rollout": {"strategy": "canary", "percent": 50}})
    assert response.status_code == 409 and "running and ready" in response.json()["error"]["message"]
    assert Deployment.objects.get().revisions.count() == 1  # nothing made


@pytest.mark.parametrize("rollout, field", [
    ({"strategy": "canary"}, "percent"),
    ({"strategy": "canary", "percent": 0}, "percent"),
    ({"strategy": "canary", "percent": 100}, "percent"),
    ({"strategy": "canary", "percent": "20"}, "percent"),
    ({"strategy": "canary", "percent": 20.5}, "percent"),
    ({"strategy": "canary", "percent": True}, "percent"),
    ({"strategy": "blue-green", "percent": 20}, "strategy"),
    ({"strategy": "canary", "percent": 20, "max_error_rate": 1.5}, "max_error_rate"),
    ({"strategy": "canary", "percent": 20, "max_p99_ratio": 0.5}, "max_p99_ratio"),
    ({"strategy": "canary", "percent": 20, "window_seconds": 1}, "window_seconds"),
    ({"strategy": "canary", "percent": 20, "min_requests": 0}, "min_requests"),
    ({"strategy": "canary", "percent": 20, "auto_promote": "yes"}, "auto_promote"),
])
def test_hostile_rollouts_are_400s_naming_the_field(alice: Person, ready: Deployment, rollout: Any, field: str) -> None:
    response = patch(alice, {**CHANGE, "rollout": rollout})
    assert response.status_code == 400, response.json()
    assert any(key.startswith(f"rollout.{field}") or key == "rollout" for key in response.json()["error"]["fields"])
    assert Deployment.objects.get().revisions.count() == 1


@pytest.mark.parametrize("rollout", ["canary", 20, None, [], {"percent": 20}])
def test_a_rollout_that_is_not_an_object_is_a_400(alice: Person, ready: Deployment, rollout: Any) -> None:
    response = patch(alice, {**CHANGE, "rollout": rollout})
    assert response.status_code == 400, response.json()
    assert "rollout" in str(response.json()["error"])


def test_a_canary_of_no_change_is_a_400(alice: Person, ready: Deployment) -> None:
    response = patch(alice, {"rollout": {"strategy": "canary", "percent": 20}})
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["rollout"] == [
        "a canary needs a change: these are the settings in effect already"]


def test_the_version_a_canary_serves_cannot_be_deleted(alice: Person, ready: Deployment) -> None:
    """Deleting it released its bytes under a serving canary: promoted, its revision could never start again."""
    make_ready_version(alice)  # version 2
    assert patch(alice, {"models": [{"model": "digits", "version": 2}],
                         "rollout": {"strategy": "canary", "percent": 10}}).status_code == 200
    serve_canary(ready)
    response = alice.client().delete("/api/v1/models/digits/versions/2/")
    assert response.status_code == 409, response.content[:300]
    assert "digits-prod" in response.json()["error"]["message"]
    assert ModelVersion.objects.filter(model__name="digits", number=2).exists()
    assert alice.client().post("/api/v1/deployments/digits-prod/rollback").status_code == 200
    assert alice.client().delete("/api/v1/models/digits/versions/2/").status_code == 204
