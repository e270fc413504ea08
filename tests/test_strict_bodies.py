"""Every API body is what the schema says, exactly (issue 30): a field no serializer declares is a 400 naming it by
its path, at every level, in multipart forms too, rather than dropped while the request succeeds ("replicaz": 2 was a
201 with one replica). The one check is infra/api_schema.py's ExactJSONTypes; the schema says
`additionalProperties: false` on every object a request body holds (the postprocessing hook beside it), and the fuzz
run (tests/test_schema_fuzz.py) holds the two to each other. docs/security.md, "Strict request bodies"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from drf_spectacular.generators import SchemaGenerator

from deployments.models import Deployment
from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx
from tests.support.deploying import post_deployment as create
from tests.support.people import Person


def refused(response: Any, field: str) -> str:
    """The message of a 400 for `field` (the path the error's "fields" names), which the top message repeats."""
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert field in error["message"]
    return " ".join(error["fields"][field])


def test_a_misspelt_deployment_field_is_a_400_naming_it_and_nothing_is_deployed(alice: Person,
                                                                                 digits: ModelVersion) -> None:
    message = refused(create(alice, replicaz=2), "replicaz")
    assert "Unknown field 'replicaz'" in message
    assert "Did you mean 'replicas'?" in message
    assert not Deployment.objects.exists()


@pytest.mark.parametrize(("model", "body", "field"), [
    ({"batchng": True}, {}, "models[0].batchng"),
    ({"dynamic_batching": {"max_queue_delay_us": 100}}, {}, "models[0].dynamic_batching.max_queue_delay_us"),
    ({"instance_group": {"count": 1, "gpu": [0]}}, {}, "models[0].instance_group.gpu"),
    ({"warmup": {"batch_size": 2, "x": 1}}, {}, "models[0].warmup.x"),
    ({}, {"placement": {"mode": "shared", "poool": "shared"}}, "placement.poool"),
    ({}, {"resources": {"cpus": "2"}}, "resources.cpus"),
    ({}, {"autoscaling": {"min_replicas": 1, "max_replicas": 2, "target": 50, "metrc": "cpu"}}, "autoscaling.metrc"),
])
def test_an_unknown_field_of_a_nested_entry_is_a_400_naming_its_path(alice: Person, digits: ModelVersion,
                                                                     model: dict[str, Any], body: dict[str, Any],
                                                                     field: str) -> None:
    response = create(alice, models=[{"model": "digits", **model}], **body)
    assert "Unknown field" in refused(response, field)
    assert not Deployment.objects.exists()


def test_the_second_models_unknown_field_is_named_by_its_index(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, models=[{"model": "digits"}, {"model": "digits", "max_batch_sise": 4}])
    assert "Did you mean 'max_batch_size'?" in refused(response, "models[1].max_batch_sise")


def test_allow_egress_is_refused_as_the_operators_not_as_unknown(alice: Person, digits: ModelVersion) -> None:
    assert "only an operator" in refused(create(alice, allow_egress=True), "allow_egress")


def test_a_patch_refuses_unknown_fields_at_the_top_in_models_and_in_the_rollout(alice: Person,
                                                                                digits: ModelVersion) -> None:
    assert create(alice).status_code == 201
    client = alice.client()
    path = "/api/v1/deployments/digits-prod/"
    for body, field in [({"replicaz": 2}, "replicaz"),
                        ({"models": [{"model": "digits", "batchng": True}]}, "models[0].batchng"),
                        ({"placement": {"idle_unload_secs": 5}}, "placement.idle_unload_secs"),
                        ({"rollout": {"strategy": "canary", "percent": 10, "auto_promot": True}},
                         "rollout.auto_promot")]:
        assert "Unknown field" in refused(client.patch(path, body, format="json"), field)
    assert Deployment.objects.get().revision.number == 1  # nothing was changed
    # What a client read back or created with, the same values, is not a change: the CLI sends its --runtime.
    response = client.patch(path, {"name": "digits-prod", "runtime": "local",
                                   "models": [{"model": "digits", "max_batch_size": 4}]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["models"][0]["max_batch_size"] == 4
    response = client.patch(path, {"runtime": "kubernetes"}, format="json")
    assert response.status_code == 400
    assert "cannot change" in response.json()["error"]["message"]


def test_a_model_field_that_is_unknown_or_the_portals_is_refused(alice: Person) -> None:
    client = alice.client()
    assert "Did you mean 'description'?" in refused(
        client.post("/api/v1/models/", {"name": "digits", "descripton": "x"}, format="json"), "descripton")
    assert "set by the portal" in refused(
        client.post("/api/v1/models/", {"name": "digits", "created_by": "mallory"}, format="json"), "created_by")
    assert not Model.objects.exists()
    assert client.post("/api/v1/models/", {"name": "digits"}, format="json").status_code == 201
    assert "Unknown field 'name'" in refused(
        client.patch("/api/v1/models/digits/", {"name": "other"}, format="json"), "name")


def test_an_unknown_form_field_of_a_multipart_upload_is_a_400_and_no_version_is_made(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="digits")
    response = alice.client().post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "formt": "onnx"}, format="multipart")
    assert "Did you mean 'format'?" in refused(response, "formt")
    assert not ModelVersion.objects.exists()


def test_an_unknown_field_of_a_version_from_an_upload_is_a_400(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="digits")
    response = alice.client().post("/api/v1/models/digits/versions/", {
        "upload_id": "00000000-0000-0000-0000-000000000000", "max_batch": 4}, format="json")
    assert "Unknown field 'max_batch'" in refused(response, "max_batch")


def test_a_pipeline_refuses_an_artifacts_fields_saying_why(alice: Person, digits: ModelVersion) -> None:
    response = alice.client().post("/api/v1/models/chain/versions/", {
        "format": "ensemble", "create_model": True, "signature": {}, "definition": {}}, format="json")
    assert "'definition' alone" in refused(response, "signature")


def test_a_tensor_of_a_signature_with_an_unknown_key_is_refused(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="digits")
    signature = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4], "dimz": [4]}],
                 "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}
    response = alice.client().post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "signature": json.dumps(signature)},
        format="multipart")
    assert "dimz" in refused(response, "signature")
    assert not ModelVersion.objects.exists()


def test_a_token_with_a_misspelt_field_is_not_made(alice: Person) -> None:
    from rest_framework.test import APIClient

    from accounts.models import ApiToken

    before = ApiToken.objects.count()
    client = APIClient()
    client.force_login(alice.user)  # a signed-in user may make tokens (a token needs the 'tokens' scope)
    response = client.post("/api/v1/tokens/", {"name": "ci", "scope": ["tokens"]}, format="json")
    assert "Did you mean 'scopes'?" in refused(response, "scope")
    assert ApiToken.objects.count() == before
    assert client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["tokens"]}, format="json").status_code == 201


def test_a_tune_with_an_unknown_field_is_refused(alice: Person, digits: ModelVersion) -> None:
    assert create(alice).status_code == 201
    response = alice.client().post("/api/v1/deployments/digits-prod/tune", {
        "p99_ms": 20, "budget_seconds": 60, "concurrency": 4}, format="json")
    assert "Unknown field 'concurrency'" in refused(response, "concurrency")


def test_thousands_of_unknown_fields_are_answered_with_the_first_few(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, **{f"x{i}": 1 for i in range(10_000)})
    assert response.status_code == 400
    assert len(response.json()["error"]["fields"]) <= 20


def test_the_schema_says_every_request_objects_fields_are_all_it_takes() -> None:
    from infra.api_schema import request_body_objects

    schema = SchemaGenerator().get_schema(request=None, public=True)
    objects = list(request_body_objects(schema))
    assert len(objects) > 20  # the deployment's and its nested entries, models, versions, tokens, tunes, ...
    open_ = [sorted(o["properties"]) for o in objects if o.get("additionalProperties") is not False]
    assert not open_, open_
    components = schema["components"]["schemas"]
    for name in ("DeploymentInputRequest", "ServedModelRequest", "DynamicBatchingRequest", "PlacementRequest",
                 "PatchedDeploymentUpdateRequest", "RolloutRequest", "TokenCreateRequest", "VersionFromFileRequest"):
        assert components[name]["additionalProperties"] is False, name
    # Responses stay open: a client must accept fields added later.
    assert "additionalProperties" not in components["Deployment"]


UNPRINTABLE = ["\x00", "\n", "\x1b[2K", "\u2028", "\x7f"]


@pytest.mark.parametrize("char", UNPRINTABLE, ids=["nul", "newline", "escape", "line-separator", "delete"])
def test_a_name_with_a_nul_or_control_character_is_a_400_naming_its_field(alice: Person, digits: ModelVersion,
                                                                          char: str) -> None:
    from rest_framework.test import APIClient

    client = alice.client()
    for body, field in [
        ({"name": f"digits{char}prod"}, "name"),
        ({"models": [{"model": f"digits{char}"}]}, "models[0].model"),
        ({"placement": {"mode": "shared", "pool": f"shared{char}"}}, "placement.pool"),
        ({"resources": {"gpu_type": f"a100{char}"}}, "resources.gpu_type"),
        ({"resources": {"cpu": f"1{char}"}}, "resources.cpu"),
    ]:
        response = client.post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}],
                                                         **body}, format="json")
        assert response.status_code == 400, (field, response.content)
        assert field in response.json()["error"]["fields"], (field, response.json())
    assert not Deployment.objects.exists()
    assert field_of(client.post("/api/v1/models/", {"name": f"m{char}"}, format="json")) == ["name"]
    session = APIClient()
    session.force_login(alice.user)
    assert field_of(session.post("/api/v1/tokens/", {"name": f"ci{char}deploy"}, format="json")) == ["name"]
    signature = {"inputs": [{"name": f"x{char}", "datatype": "FP32", "dims": [-1, 4]}],
                 "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}
    response = client.post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "signature": json.dumps(signature)},
        format="multipart")
    assert field_of(response) == ["signature"]
    assert ModelVersion.objects.count() == 1  # digits' own


def field_of(response: Any) -> list[str]:
    assert response.status_code == 400, response.content
    return list(response.json()["error"]["fields"])


def test_a_description_keeps_its_lines(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/", {"name": "digits", "description": "8x8 digits\n\tsklearn"},
                                   format="json")
    assert response.status_code == 201, response.json()
    assert Model.objects.get().description == "8x8 digits\n\tsklearn"


def test_an_action_that_takes_no_body_refuses_one_with_fields_and_does_nothing(alice: Person,
                                                                              digits: ModelVersion) -> None:
    assert create(alice).status_code == 201
    client = alice.client()
    response = client.post("/api/v1/deployments/digits-prod/stop", {"force": True}, format="json")
    assert "this request takes no body" in refused(response, "force")
    assert client.post("/api/v1/deployments/digits-prod/stop", "force=1",
                       content_type="application/x-www-form-urlencoded").status_code == 400
    assert client.post("/api/v1/deployments/digits-prod/stop", "force", content_type="text/plain").status_code == 400
    assert Deployment.objects.get().desired_state == Deployment.Desired.RUNNING
    # No body, an empty one or {}: the action as usual.
    assert client.post("/api/v1/deployments/digits-prod/stop", {}, format="json").status_code == 202
    assert client.post("/api/v1/deployments/digits-prod/start").status_code == 202
