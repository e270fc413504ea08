"""The deployments API: validation, defaults, revisions and access. The reconciler is not run here (its
on_commit never fires inside a test transaction); tests/test_deploy_e2e.py runs it with a real Triton."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deployments.models import Deployment, Event, Revision
from models_registry.models import ModelVersion
from tests.support.deploying import post_deployment as create
from tests.support.people import Person
from tests.support.versions import make_ready_version


def test_alice_deploys_with_defaults_fitted_to_the_model(alice: Person, digits: ModelVersion) -> None:
    response = create(alice)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "pending"
    assert body["endpoint"] == "/serve/digits-prod"
    assert body["revision"] == 1
    [model] = body["models"]
    assert model["version"] == 1
    assert model["max_batch_size"] == digits.max_batch_size
    assert model["dynamic_batching"] == {"max_queue_delay_microseconds": 0, "preferred_batch_size": [],
                                         "preserve_ordering": False}
    assert model["instance_group"] == {"count": 1, "kind": "cpu", "gpus": []}
    deployment = Deployment.objects.get()
    assert deployment.team == alice.team
    assert list(deployment.revision.versions.all()) == [digits]
    assert Event.objects.filter(deployment=deployment, message__contains="Created by alice").exists()


def test_the_serving_settings_are_kept_as_given(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits", "version": 1, "max_batch_size": 16,
                                      "dynamic_batching": {"max_queue_delay_microseconds": 2000,
                                                           "preferred_batch_size": [4, 8]},
                                      "instance_group": {"count": 2, "kind": "cpu"}}])
    assert response.status_code == 201, response.json()
    model = response.json()["models"][0]
    assert model["max_batch_size"] == 16
    assert model["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert model["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert model["instance_group"]["count"] == 2


def test_batching_can_be_switched_off(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits", "dynamic_batching": None}])
    assert response.json()["models"][0]["dynamic_batching"] is None


def test_it_rejects_preferred_sizes_over_the_max_batch_size(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits", "max_batch_size": 8,
                                      "dynamic_batching": {"preferred_batch_size": [4, 16]}}])
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert fields["models[0].dynamic_batching.preferred_batch_size"] == ["preferred batch size 16 is larger than "
                                                                         "max_batch_size 8"]
    assert not Deployment.objects.exists()


def test_it_rejects_out_of_bounds_queue_delays_and_instance_counts(alice: Person, digits: ModelVersion) -> None:
    response = create(alice,
                      models=[{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 20_000_000},
                                      "instance_group": {"count": 99}}])
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert "10000000" in fields["models[0].dynamic_batching.max_queue_delay_microseconds"][0]
    assert "16" in fields["models[0].instance_group.count"][0]


def test_a_warmup_is_kept_typed_with_its_defaults_filled_in(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits", "warmup": {"batch_size": 2, "data": "random"}}])
    assert response.status_code == 201, response.json()
    assert response.json()["models"][0]["warmup"] == {"batch_size": 2, "count": 1, "data": "random"}


@pytest.mark.parametrize(("warmup", "field", "words"), [
    ({"batch_size": 2, "x": 1}, "models[0].warmup.x", "Unknown field 'x'"),
    ({"count": 0}, "models[0].warmup.count", "greater than or equal to 1"),
    ({"count": 101}, "models[0].warmup.count", "less than or equal to 100"),
    ({"batch_size": "2"}, "models[0].warmup.batch_size", "integer"),
    ({"batch_size": 10**30}, "models[0].warmup.batch_size", "less than or equal to"),
    ({"data": "noise"}, "models[0].warmup.data", "not a valid choice"),
    ({"batch_size": 65}, "models[0].warmup.batch_size", "must not exceed max_batch_size 64"),
    ([1, 2], "models[0].warmup", "dictionary"),
    ("zero", "models[0].warmup", "dictionary"),
])
def test_a_bad_warmup_is_a_400_naming_its_field(alice: Person, digits: ModelVersion, warmup: Any, field: str,
                                                words: str) -> None:
    response = create(alice, models=[{"model": "digits", "max_batch_size": 64, "warmup": warmup}])
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert words in " ".join(m for key in fields if key.startswith(field) for m in fields[key]), fields
    assert not Deployment.objects.exists()


def test_it_refuses_gpus_on_the_local_runtime(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits", "instance_group": {"kind": "gpu"}}], resources={"gpu": 1})
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert fields["models[0].instance_group.kind"] == ["the local runtime has no GPU: use kind 'cpu'"]
    assert "no GPU" in fields["resources.gpu"][0]


def test_it_refuses_replicas_on_the_local_runtime(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, replicas=3)
    assert response.status_code == 400
    assert "one Triton server per deployment" in response.json()["error"]["fields"]["replicas"][0]


def test_it_refuses_batching_for_a_model_without_a_batch_dimension(alice: Person) -> None:
    from tests.artifacts import tiny_onnx
    from tests.support.versions import make_ready_version

    make_ready_version(alice, "fixed", tiny_onnx(batch=False))
    response = create(alice, models=[{"model": "fixed", "max_batch_size": 4}])
    assert response.status_code == 400
    assert "dynamic first dimension" in response.json()["error"]["fields"]["models[0].max_batch_size"][0]


def test_it_names_a_missing_model_or_version(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "nope"}, {"model": "digits", "version": 7}])
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert fields["models[0].model"] == ["no model named 'nope' in your team"]
    assert fields["models[1].version"] == ["model 'digits' has no version 7"]


def test_it_rejects_bad_deployment_names(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, name="Digits_Prod")
    assert response.status_code == 400
    assert "lowercase letters" in response.json()["error"]["fields"]["name"][0]


def test_a_duplicate_name_is_a_conflict(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    response = create(alice)
    assert response.status_code == 409
    assert Deployment.objects.count() == 1


def test_patch_makes_a_new_revision_and_keeps_unchanged_settings(alice: Person, digits: ModelVersion) -> None:
    create(alice, models=[{"model": "digits", "instance_group": {"count": 2}}])
    response = alice.client().patch("/api/v1/deployments/digits-prod/",
                                    {"models": [{"model": "digits",
                                                 "dynamic_batching": {"max_queue_delay_microseconds": 500}}]},
                                    format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["revision"] == 2
    assert response.json()["status"] == "pending"
    assert response.json()["models"][0]["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    response = alice.client().patch("/api/v1/deployments/digits-prod/", {"resources": {"cpu": "2"}}, format="json")
    assert response.json()["revision"] == 3
    assert response.json()["models"][0]["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    first = Revision.objects.get(number=1)
    assert first.spec.to_json()["models"][0]["instance_group"]["count"] == 2  # revisions are immutable


def test_patch_with_a_body_that_is_not_a_json_object_is_a_400(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    response = alice.client().patch("/api/v1/deployments/digits-prod/", [{"replicas": 1}], format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The request body must be a JSON object."
    assert Revision.objects.count() == 1


def test_stop_and_start_change_the_desired_state(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    response = alice.client().post("/api/v1/deployments/digits-prod/stop")
    assert response.status_code == 202
    assert Deployment.objects.get().desired_state == "stopped"
    assert alice.client().post("/api/v1/deployments/digits-prod/stop").status_code == 409
    assert alice.client().post("/api/v1/deployments/digits-prod/start").status_code == 202
    assert Deployment.objects.get().desired_state == "running"


def test_a_version_in_use_cannot_be_deleted(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    response = alice.client().delete("/api/v1/models/digits/versions/1/")
    assert response.status_code == 409
    assert "digits-prod" in response.json()["error"]["message"]
    assert ModelVersion.objects.filter(pk=digits.pk).exists()


def test_charlie_cannot_see_or_touch_alices_deployment(alice: Person, charlie: Person, digits: ModelVersion) -> None:
    create(alice)
    client = charlie.client()
    assert client.get("/api/v1/deployments/").json() == []
    for method, path in [("get", ""), ("patch", ""), ("delete", ""), ("post", "stop"), ("post", "start"),
                         ("get", "events/"), ("get", "logs/")]:
        response = getattr(client, method)(f"/api/v1/deployments/digits-prod/{path}", {}, format="json")
        assert response.status_code == 404, (method, path)
    assert Deployment.objects.get().desired_state == "running"


def test_charlie_cannot_deploy_alices_model(alice: Person, charlie: Person, digits: ModelVersion) -> None:
    response = create(charlie)
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["models[0].model"] == ["no model named 'digits' in your team"]


def test_the_events_are_listed_newest_first(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    alice.client().post("/api/v1/deployments/digits-prod/stop")
    events = alice.client().get("/api/v1/deployments/digits-prod/events/").json()
    assert "Stop requested by alice" in events[0]["message"]
    assert "Created by alice" in events[-1]["message"]


def test_a_savedmodel_deploys_locally_only_when_the_runtime_env_has_tensorflow(
    alice: Person, settings: Any, tmp_path: Path
) -> None:
    import io
    import zipfile

    from models_registry.tests.savedmodels import saved_model
    from tests.support.deploying import fake_runtime_env

    pb = saved_model({"serving_default": {"inputs": {"x": {"dtype": 1, "dims": [-1, 4]}},
                                          "outputs": {"y": {"dtype": 1, "dims": [-1, 3]}}}})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("export/saved_model.pb", pb)
    make_ready_version(alice, "tiny-tf", buffer.getvalue())

    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path / "plain", "torch-2.13.0")
    refused = create(alice, name="tiny-tf", models=[{"model": "tiny-tf"}])
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["models[0].format"] == [
        "TensorFlow SavedModels cannot be served locally: the local runtime env has no TensorFlow, which serves this "
        "format: an operator adds it with `make runtime-env RUNTIME_EXTRAS=tensorflow` (a 310 MB download, 1.3 GB "
        "installed); or deploy to Kubernetes"]
    assert not Deployment.objects.exists()

    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path / "with-tf", "tensorflow-2.21.0")
    accepted = create(alice, name="tiny-tf", models=[{"model": "tiny-tf"}])
    assert accepted.status_code == 201, accepted.json()
    (entry,) = Deployment.objects.get().revision.spec.to_json()["models"]
    assert entry["definition"] == {"signature_def": "serving_default", "signature_defs": ["serving_default"]}


def test_a_version_a_deployment_serves_cannot_be_deleted(alice: Person, digits: ModelVersion) -> None:
    """The registry asks through its version_users signal (it sits below deployments), and deployments answer."""
    client = alice.client()
    assert client.post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]},
                       format="json").status_code == 201
    refused = client.delete("/api/v1/models/digits/versions/1/")
    assert refused.status_code == 409
    assert "digits-prod" in str(refused.json())
    assert ModelVersion.objects.filter(pk=digits.pk).exists()
    assert client.delete("/api/v1/deployments/digits-prod/").status_code == 202
    Deployment.objects.filter(name="digits-prod").delete()  # what the worker does once it has torn it down
    assert client.delete("/api/v1/models/digits/versions/1/").status_code == 204
