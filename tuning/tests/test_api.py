"""The tune API: validation (every bad input a 400 that says what to fix), access (charlie sees nothing), cancel,
and apply (a new revision through planning, as a PATCH makes). The worker is not run here (on_commit never fires
inside a test transaction); tuning/tests/test_runner.py runs the task's code, tests/test_tune_e2e.py a real tune."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEntry
from deployments.models import Deployment, Event, Revision
from models_registry.models import ModelVersion
from tests.support.deploying import huge_input
from tests.support.people import Person
from tuning.models import TuneRun


def tune(person: Person, name: str = "digits-prod", **body: Any) -> Any:
    payload = {"p99_ms": 20, "budget_seconds": 60, **body}
    return person.client().post(f"/api/v1/deployments/{name}/tune", payload, format="json")


def done_tune(deployment: Deployment, **fields: Any) -> TuneRun:
    version = ModelVersion.objects.get(model__name="digits", number=1)
    values: dict[str, Any] = {
        "deployment": deployment, "team": deployment.team, "model_version": version, "p99_target_ms": 20,
        "budget_seconds": 60, "status": TuneRun.Status.DONE, "request_body": {"inputs": []},
        "recommendation": {"settings": {"instances": 2, "batching": True, "max_batch_size": 64,
                                        "queue_delay_us": 2000}, "label": "2 inst, batch 64, delay 2000 µs",
                           "throughput": 900.0, "p50_ms": 5.0, "p99_ms": 12.0, "concurrency": 16},
        "host": "h1", "machine": {"hostname": "h1", "cores": 2, "cpu_model": "x", "gpu": "none"},
    }
    values.update(fields)
    return TuneRun.objects.create(**values)


def test_alice_queues_a_tune_with_the_try_it_request(alice: Person, deployment: Deployment) -> None:
    response = tune(alice)
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued"
    assert body["model"] == "digits" and body["version"] == 1
    assert body["p99_target_ms"] == 20 and body["budget_seconds"] == 60
    run = TuneRun.objects.get()
    assert run.team == alice.team and run.created_by == alice.user
    [request_input] = run.request_body["inputs"]
    assert request_input["name"] and request_input["data"]
    assert Event.objects.filter(deployment=deployment, message__contains="Tune").exists()
    assert AuditEntry.objects.filter(action="deployment.tune").exists()


def test_a_user_supplied_request_is_kept(alice: Person, deployment: Deployment) -> None:
    sent = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    response = tune(alice, sample="request", request=sent)
    assert response.status_code == 202, response.json()
    assert TuneRun.objects.get().request_body == sent


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"p99_ms": 0}, "p99_ms", "greater than or equal to 0.001"),
    ({"p99_ms": -5}, "p99_ms", "greater than or equal to 0.001"),
    ({"p99_ms": "20"}, "p99_ms", ""),
    ({"budget_seconds": 10}, "budget_seconds", "30"),
    ({"budget_seconds": 7200}, "budget_seconds", "3600"),
    ({"budget_seconds": 60.5}, "budget_seconds", ""),
    ({"concurrency_min": 8, "concurrency_max": 4}, "concurrency_max", "at least concurrency_min"),
    ({"concurrency_max": 100000}, "concurrency_max", "256"),
    ({"concurrency_min": 0}, "concurrency_min", "1"),
    ({"sample": "recorded"}, "sample", "not supported yet"),
    ({"sample": "martian"}, "sample", ""),
    ({"sample": "request"}, "request", "give the request body"),
    ({"sample": "request", "request": {"inputs": "x"}}, "request", "non-empty list"),
    ({"sample": "request", "request": {"inputs": [{"shape": [1]}]}}, "request", "each with a \"name\""),
    ({"request": {"inputs": [{"name": "x"}]}}, "request", "only with sample 'request'"),
    # What the gateway refuses never reaches the tune's Triton by the load generator either.
    ({"sample": "request", "request": {"inputs": [{"name": "x", "shape": [2**62], "datatype": "FP32", "data": []}]}},
     "request", "x"),
    ({"sample": "request", "request": {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                                                   "parameters": {"shared_memory_region": "r"}}]}},
     "request", "shared"),
    ({"sample": "request", "request": {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}},
     "request", "shape"),
    ({"sample": "request", "request": {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}},
     "request", "x"),
    ({"model": "nope"}, "model", "no model named 'nope'"),
])
def test_bad_input_is_a_400_that_says_what_to_fix(alice: Person, deployment: Deployment, body: dict[str, Any],
                                                 field: str, words: str) -> None:
    response = tune(alice, **body)
    assert response.status_code == 400, response.json()
    messages = response.json()["error"]["fields"][field]
    assert words in " ".join(messages)
    assert not TuneRun.objects.exists()


@pytest.mark.parametrize("payload", [
    [], "tune", None, {"p99_ms": 20, "budget_seconds": 60, "model": "a\x00b"},
    {"p99_ms": 20, "budget_seconds": 60, "sample": "request", "request": {"inputs": [{"name": "x" * 2_000_000}]}},
    {"p99_ms": 20, "budget_seconds": 60, "sample": "request", "request": {"inputs": [{"name": "x", "data": "\x00"}]}},
])
def test_hostile_bodies_are_refused_without_a_500(alice: Person, deployment: Deployment, payload: Any) -> None:
    response = alice.client().post("/api/v1/deployments/digits-prod/tune", payload, format="json")
    assert 400 <= response.status_code < 500, response.content[:300]
    assert not TuneRun.objects.exists()


@pytest.mark.parametrize("raw", ['{"p99_ms": 1e400, "budget_seconds": 60}', '{"p99_ms": NaN, "budget_seconds": 60}',
                                 '{"p99_ms": 20, "budget_seconds": 60', "[" * 5000 + "]" * 5000])
def test_out_of_range_numbers_and_broken_json_are_a_400(alice: Person, deployment: Deployment, raw: str) -> None:
    response = alice.client().post("/api/v1/deployments/digits-prod/tune", raw, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert not TuneRun.objects.exists()


def test_a_second_tune_waits_for_the_first_to_end(alice: Person, bob: Person, deployment: Deployment) -> None:
    assert tune(alice).status_code == 202
    response = tune(bob)
    assert response.status_code == 409
    assert "queued or running already" in response.json()["error"]["message"]


def test_a_team_queues_at_most_its_share_of_tunes(alice: Person, bob: Person,
                                                 deployment: Deployment) -> None:
    """One deployment, one tune; and a team with many deployments cannot queue hour-long tunes on each of them
    ahead of every other team (TUNE_MAX_ACTIVE_PER_TEAM, 2 by default)."""
    for name in ("digits-b", "digits-c"):
        assert alice.client().post("/api/v1/deployments/", {"name": name, "models": [{"model": "digits"}]},
                                   format="json").status_code == 201
    assert tune(alice).status_code == 202
    assert tune(bob, "digits-b").status_code == 202
    refused = tune(alice, "digits-c")
    assert refused.status_code == 409
    assert "TUNE_MAX_ACTIVE_PER_TEAM" in refused.json()["error"]["message"]
    assert TuneRun.objects.filter(deployment__team=alice.team).count() == 2
    # An ended tune frees its place.
    first = TuneRun.objects.get(deployment=deployment)
    assert alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{first.pk}/cancel").status_code == 202
    assert tune(alice, "digits-c").status_code == 202


def test_a_generated_request_the_gateway_would_refuse_is_not_sent(alice: Person, deployment: Deployment) -> None:
    """Too large to fill in, the example goes with empty data and a [2**62] shape: sent straight to Triton it
    kills the model's stub. The tune asks for the user's own request instead."""
    huge_input(deployment)
    response = tune(alice)
    assert response.status_code == 400, response.json()
    [message] = response.json()["error"]["fields"]["sample"]
    assert "give your own with sample 'request'" in message and "limit" in message
    assert not TuneRun.objects.exists()
    sent = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert tune(alice, sample="request", request=sent).status_code == 202


def test_bob_sees_the_teams_tunes_and_charlie_sees_nothing(alice: Person, bob: Person, charlie: Person,
                                                           deployment: Deployment) -> None:
    run_id = tune(alice).json()["id"]
    listed = bob.client().get("/api/v1/deployments/digits-prod/tunes/")
    assert [t["id"] for t in listed.json()] == [run_id]
    assert bob.client().get(f"/api/v1/deployments/digits-prod/tunes/{run_id}/").json()["status"] == "queued"
    client = charlie.client()
    assert tune(charlie).status_code == 404
    assert client.get("/api/v1/deployments/digits-prod/tunes/").status_code == 404
    assert client.get(f"/api/v1/deployments/digits-prod/tunes/{run_id}/").status_code == 404
    assert client.post(f"/api/v1/deployments/digits-prod/tunes/{run_id}/apply").status_code == 404
    assert client.post(f"/api/v1/deployments/digits-prod/tunes/{run_id}/cancel").status_code == 404
    assert TuneRun.objects.get().status == "queued"


def test_a_tune_of_another_deployment_is_not_found_under_this_one(alice: Person, deployment: Deployment,
                                                                  digits: ModelVersion) -> None:
    run = done_tune(deployment)
    alice.client().post("/api/v1/deployments/", {"name": "other", "models": [{"model": "digits"}]}, format="json")
    assert alice.client().get(f"/api/v1/deployments/other/tunes/{run.pk}/").status_code == 404


def test_cancelling_a_queued_tune_ends_it(alice: Person, deployment: Deployment) -> None:
    run_id = tune(alice).json()["id"]
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run_id}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    again = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run_id}/cancel")
    assert again.status_code == 409
    assert tune(alice).status_code == 202  # no longer in the way


def test_apply_makes_a_revision_with_the_recommended_settings(bob: Person, deployment: Deployment) -> None:
    run = done_tune(deployment)
    response = bob.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply")
    assert response.status_code == 200, response.json()
    assert response.json()["applied_revision"] == 2
    # Every setting it changed, before and after, in the answer (the page and the CLI show the same list).
    assert response.json()["changes"] == [
        {"model": "digits", "setting": "max_queue_delay_microseconds", "before": 0, "after": 2000, "narrows": False,
         "why": ""},
        {"model": "digits", "setting": "instances", "before": 1, "after": 2, "narrows": False, "why": ""}]
    revision = Revision.objects.get(deployment=deployment, number=2)
    [entry] = revision.spec.models
    assert entry.instance_group.count == 2
    assert entry.max_batch_size == 64
    assert entry.dynamic_batching is not None and entry.dynamic_batching.max_queue_delay_microseconds == 2000
    deployment.refresh_from_db()
    assert deployment.revision == revision and deployment.status == "pending"
    assert AuditEntry.objects.filter(action="deployment.tune.apply").exists()


def test_applying_what_serves_already_makes_no_revision_and_a_canary_of_it_is_a_400(
        alice: Person, deployment: Deployment) -> None:
    """The rule of every change (deployments.actions): a second Apply of the same settings rolls nothing out."""
    first, second = done_tune(deployment), done_tune(deployment)
    assert alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{first.pk}/apply").status_code == 200
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", serving_revision=Revision.objects.get(number=2))
    as_canary = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{second.pk}/apply",
                                    {"rollout": {"strategy": "canary", "percent": 10}}, format="json")
    assert as_canary.status_code == 400
    assert as_canary.json()["error"]["fields"] == {"rollout": [
        "a canary needs a change: these are the settings in effect already"]}
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{second.pk}/apply")
    assert response.status_code == 200, response.json()
    assert response.json()["applied_revision"] == 2  # the revision that serves those settings
    assert Revision.objects.filter(deployment=deployment).count() == 2
    assert Deployment.objects.get().status == "ready"


def test_apply_of_batching_off_switches_batching_off(alice: Person, deployment: Deployment) -> None:
    run = done_tune(deployment, recommendation={"settings": {"instances": 1, "batching": False,
                                                             "max_batch_size": 0, "queue_delay_us": 0}})
    assert alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply").status_code == 200
    [entry] = Revision.objects.get(deployment=deployment, number=2).spec.models
    assert entry.dynamic_batching is None


def test_apply_as_a_canary_serves_the_tuned_revision_beside_the_stable_one(alice: Person,
                                                                           deployment: Deployment) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", serving_revision=deployment.revision,
                                                       upstream_url="http://127.0.0.1:9")
    run = done_tune(deployment)
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply",
                                   {"rollout": {"strategy": "canary", "percent": 10}}, format="json")
    assert response.status_code == 200, response.json()
    deployment.refresh_from_db()
    assert deployment.revision.number == 1 and deployment.serving_revision.number == 1  # the stable one serves on
    assert deployment.canary_revision.number == 2 and deployment.canary_percent == 10
    [entry] = deployment.canary_revision.spec.models
    assert entry.instance_group.count == 2 and entry.max_batch_size == 64
    assert AuditEntry.objects.get(action="deployment.tune.apply").detail["canary_percent"] == 10
    # A second apply while the canary runs is refused: promote or roll back first.
    again = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply")
    assert again.status_code == 409
    assert Revision.objects.filter(deployment=deployment).count() == 2


def test_apply_as_a_canary_of_a_deployment_that_does_not_serve_is_a_409(alice: Person,
                                                                        deployment: Deployment) -> None:
    run = done_tune(deployment)
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply",
                                   {"rollout": {"strategy": "canary", "percent": 10}}, format="json")
    assert response.status_code == 409
    assert "canary needs a deployment that is running and ready" in response.json()["error"]["message"]
    assert Revision.objects.filter(deployment=deployment).count() == 1


@pytest.mark.parametrize("body", [{"rollout": {"strategy": "canary"}}, {"rollout": {"strategy": "canary",
                                                                                    "percent": 100}},
                                  {"rollout": "canary"}, {"rollout": {"strategy": "blue-green"}}, ["rollout"],
                                  {"rollout": {"strategy": "canary", "percent": "10"}}])
def test_apply_refuses_a_bad_rollout_and_changes_nothing(alice: Person, deployment: Deployment, body: Any) -> None:
    run = done_tune(deployment)
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["message"]
    assert Revision.objects.filter(deployment=deployment).count() == 1
    assert TuneRun.objects.get(pk=run.pk).applied_revision is None


NARROWING = {"settings": {"instances": 1, "batching": True, "max_batch_size": 8, "queue_delay_us": 0},
             "label": "1 inst, batch 8, delay 0 µs"}


def test_apply_that_lowers_the_max_batch_size_is_refused_until_the_user_chooses_it(
    alice: Person, deployment: Deployment
) -> None:
    """Issue 25: an apply lowered max_batch_size from 64 to 8 without a word, and batches of 16 then got 400s."""
    run = done_tune(deployment, recommendation=NARROWING)
    url = f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply"
    refused = alice.client().post(url)
    assert refused.status_code == 400
    [message] = refused.json()["error"]["fields"]["narrow"]
    assert "digits: max_batch_size 64 → 8 (a request of more than 8 rows, accepted today, would be refused" in message
    assert '"narrow": true' in message
    assert Revision.objects.filter(deployment=deployment).count() == 1
    assert TuneRun.objects.get(pk=run.pk).applied_revision is None
    assert alice.client().post(url, {"narrow": "yes"}, format="json").status_code == 400  # a boolean, exactly

    chosen = alice.client().post(url, {"narrow": True}, format="json")
    assert chosen.status_code == 200, chosen.json()
    assert chosen.json()["changes"] == [{"model": "digits", "setting": "max_batch_size", "before": 64, "after": 8,
                                         "narrows": True, "why": "a request of more than 8 rows, accepted today, "
                                                                 "would be refused with a 400"}]
    [entry] = Revision.objects.get(deployment=deployment, number=2).spec.models
    assert entry.max_batch_size == 8
    entry_audit = AuditEntry.objects.get(action="deployment.tune.apply")
    assert entry_audit.detail["narrowed"] is True and entry_audit.detail["changes"][0]["before"] == 64
    assert Event.objects.filter(deployment=deployment, message__contains="max_batch_size 64 → 8").exists()


def test_apply_without_a_recommendation_is_a_409(alice: Person, deployment: Deployment) -> None:
    for fields in ({"status": TuneRun.Status.RUNNING}, {"recommendation": None}):
        run = done_tune(deployment, **fields)
        response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply")
        assert response.status_code == 409
        assert "no recommendation" in response.json()["error"]["message"]
    assert Revision.objects.filter(deployment=deployment).count() == 1


def test_a_tune_id_out_of_range_is_a_404(alice: Person, deployment: Deployment) -> None:
    for path in ("", "apply", "cancel"):
        url = f"/api/v1/deployments/digits-prod/tunes/{10 ** 30}/{path}"
        response = alice.client().get(url) if not path else alice.client().post(url)
        assert response.status_code == 404, (path, response.content[:200])


def test_apply_keeps_a_shared_deployment_in_its_pool(alice: Person, digits: ModelVersion) -> None:
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits-shared", "models": [{"model": "digits"}],
        "placement": {"mode": "shared", "pool": "shared", "idle_unload_seconds": 90}}, format="json")
    assert response.status_code == 201, response.json()
    deployment = Deployment.objects.get(name="digits-shared")
    run = done_tune(deployment)
    applied = alice.client().post(f"/api/v1/deployments/digits-shared/tunes/{run.pk}/apply")
    assert applied.status_code == 200, applied.json()
    placement = Revision.objects.get(deployment=deployment, number=2).spec.placement
    assert (placement.mode, placement.pool, placement.idle_unload_seconds) == ("shared", "shared", 90)
    assert "placement" not in {change["setting"] for change in applied.json()["changes"]}
