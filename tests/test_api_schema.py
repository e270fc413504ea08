"""The OpenAPI schema is exact (issue 12): one test per mismatch the schemathesis run found between the schema and
what the API does, so that each stays fixed without the fuzzer (tests/test_schema_fuzz.py)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator

from deployments.models import Deployment
from models_registry.models import Model, Upload
from tests.artifacts import tiny_onnx
from tests.support.people import Person


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in schema["paths"].items() for method, op in item.items()]


def test_the_schema_validates_without_a_warning() -> None:
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=StringIO())


def test_every_operation_documents_the_errors_every_call_can_get(schema: dict[str, Any]) -> None:
    for method, path, op in operations(schema):
        responses = op["responses"]
        assert {"400", "401", "403", "503"} <= set(responses), (method, path)
        if "{" in path:
            assert "404" in responses, (method, path)
        if "requestBody" in op:
            assert {"400", "413", "415"} <= set(responses), (method, path)
        for code, response in responses.items():
            if code >= "400":
                [content] = {media: c for media, c in response["content"].items()
                             if media == "application/json"}.values()
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (method, path, code)


@pytest.mark.parametrize(("method", "path", "statuses"), [
    ("POST", "/api/v1/models/", {"201", "409", "422"}),
    ("DELETE", "/api/v1/models/{name}/", {"204", "409"}),
    ("POST", "/api/v1/models/{name}/versions/", {"201", "409", "413", "422"}),
    ("POST", "/api/v1/deployments/", {"201", "409", "422"}),
    ("DELETE", "/api/v1/deployments/{name}/", {"202"}),
    ("POST", "/api/v1/deployments/{name}/stop", {"202", "409"}),
    ("POST", "/api/v1/deployments/{name}/start", {"202", "409"}),
    ("GET", "/api/v1/deployments/{name}/manifests", {"200", "409"}),
    ("POST", "/api/v1/tokens/", {"201", "409", "422"}),
])
def test_the_statuses_particular_to_an_operation_are_documented(schema: dict[str, Any], method: str, path: str,
                                                                 statuses: set[str]) -> None:
    assert statuses <= set(schema["paths"][path][method.lower()]["responses"])


def test_deleting_a_deployment_documents_only_the_202_it_always_answers(schema: dict[str, Any]) -> None:
    """A worker tears a deployment down (deployments/reconcile.py), so the request never sees it gone: no 204."""
    responses = schema["paths"]["/api/v1/deployments/{name}/"]["delete"]["responses"]
    assert {code for code in responses if code < "300"} == {"202"}


def test_what_the_api_enforces_is_in_the_schema(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    deployment = components["DeploymentInputRequest"]["properties"]
    assert deployment["models"]["minItems"] == 1
    assert deployment["name"]["pattern"] == "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
    assert deployment["name"]["maxLength"] == 63
    metrics = schema["paths"]["/api/v1/deployments/{name}/metrics/"]["get"]["parameters"]
    [minutes] = [p for p in metrics if p["name"] == "minutes"]
    assert (minutes["schema"]["minimum"], minutes["schema"]["maximum"]) == (1, 1440)
    [number] = [p for p in schema["paths"]["/api/v1/models/{name}/versions/{number}/"]["get"]["parameters"]
                if p["name"] == "number"]
    assert number["schema"]["minimum"] == 1
    assert components["PatchedModelUpdateRequest"]["additionalProperties"] is False
    assert components["PipelineCreateRequest"]["additionalProperties"] is False


def test_fields_that_come_back_null_are_nullable(schema: dict[str, Any], alice: Person) -> None:
    """A deployment that never served has no serving revision; a model whose creator was deleted has none."""
    components = schema["components"]["schemas"]
    for component, field in [("Deployment", "serving_revision"), ("Deployment", "revision"),
                             ("Deployment", "created_by"), ("Model", "created_by"), ("Model", "latest_version"),
                             ("Version", "created_by"), ("Version", "validated_at"), ("Version", "definition")]:
        assert components[component]["properties"][field].get("nullable") is True, (component, field)
        assert field in components[component]["required"], (component, field)
    version_format = components["Version"]["properties"]["format"]
    assert {"$ref": "#/components/schemas/BlankEnum"} in version_format["oneOf"]  # empty until inspected
    model = alice.client().post("/api/v1/models/", {"name": "digits"}, format="json").json()
    assert model["latest_version"] is None


def test_a_path_under_the_api_that_matches_no_url_is_a_json_404(alice: Person) -> None:
    client = alice.client()
    for path in ("/api/v1/models/digits/versions/null,null/", "/api/v1/tokens/abc/", "/api/v1/nothing-here/"):
        response = client.get(path)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "not_found"
        assert path in response.json()["error"]["message"]
    page = client.get("/models/no/such/page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"name": "digits", "description": 0}, "description", "Not a valid string."),
    ({"name": 7}, "name", "Not a valid string."),
    ({"name": ["digits"]}, "name", "Not a valid string."),
])
def test_a_json_value_of_the_wrong_type_is_refused_not_coerced(alice: Person, body: dict[str, Any], field: str,
                                                               message: str) -> None:
    """DRF turned 0 into "0" and "8" into 8; the schema says a string (or a number) and so does the API now."""
    response = alice.client().post("/api/v1/models/", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["fields"][field] == [message]
    assert not Model.objects.exists()


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"replicas": "1"}, "replicas", "A valid integer is required."),
    ({"replicas": 1.0}, "replicas", "A valid integer is required."),
    ({"replicas": True}, "replicas", "A valid integer is required."),
    ({"models": [{"model": "digits", "max_batch_size": "8"}]}, "models[0].max_batch_size",
     "A valid integer is required."),
    ({"models": [{"model": "digits", "response_cache": "yes"}]}, "models[0].response_cache",
     "Must be a valid boolean."),
    ({"models": [{"model": "digits", "dynamic_batching": {"preferred_batch_size": ["4"]}}]},
     "models[0].dynamic_batching.preferred_batch_size[0]", "A valid integer is required."),
    ({"models": [{"model": 5}]}, "models[0].model", "Not a valid string."),
    ({"runtime": 1}, "runtime", '"1" is not a valid choice.'),
])
@pytest.mark.usefixtures("digits")
def test_nested_values_of_the_wrong_type_are_refused_naming_the_field(alice: Person, change: dict[str, Any], field: str,
                                                                      message: str) -> None:
    body = {"name": "digits-prod", "models": [{"model": "digits"}], **change}
    response = alice.client().post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["fields"] == {field: [message]}
    assert not Deployment.objects.exists()


@pytest.mark.usefixtures("digits")
def test_the_right_types_still_pass_and_form_data_is_still_text(alice: Person) -> None:
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits-prod", "replicas": 1,
        "models": [{"model": "digits", "max_batch_size": 8, "response_cache": True,
                                                          "dynamic_batching": {"preferred_batch_size": [4]}}]},
        format="json")
    assert response.status_code == 201, response.json()
    # A multipart upload sends every field as text: "4" is still a max_batch_size there.
    upload = alice.client().post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "max_batch_size": "4", "create_model": "true"},
        format="multipart")
    assert upload.status_code == 201, upload.json()


def test_a_json_signature_may_be_null_as_the_schema_says(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/", {
        "upload_id": "00000000-0000-0000-0000-000000000000", "signature": None, "create_model": True},
        format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["upload_id"]  # the signature was fine
    assert not Upload.objects.exists() and not Model.objects.exists()


def test_creations_link_to_what_uses_what_they_created(schema: dict[str, Any]) -> None:
    links = schema["paths"]["/api/v1/deployments/"]["post"]["responses"]["201"]["links"]
    assert links["deployments_stop_create"] == {"operationId": "deployments_stop_create",
                                                "parameters": {"name": "$response.body#/name"}}
    operation_ids = {op["operationId"] for _, _, op in operations(schema)}
    for _, _, op in operations(schema):
        for response in op["responses"].values():
            for link in response.get("links", {}).values():
                assert link["operationId"] in operation_ids
    assert json.dumps(schema)  # plain JSON: what /api/v1/schema/?format=json serves


@pytest.mark.parametrize("path", ["/api/v1/models/a%00b/", "/api/v1/audit/?action=deployment%00.stop",
                                  "/api/v1/deployments/x%00/events/"])
def test_a_nul_in_the_path_or_query_is_a_400_not_a_database_error(alice: Person, path: str) -> None:
    """Found by the fuzzing run on PostgreSQL, which cannot hold NUL: psycopg2 raised ValueError, answered 500."""
    response = alice.client().get(path)
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]["message"]
    assert alice.client().get("/models/a%00b/").status_code == 400  # pages too


@pytest.mark.parametrize("body", [
    {"name": "digits", "upload_id": "00000000-0000-0000-0000-000000000000", "create_model": True,
     "signature": {"inputs": [{"name": "in\u0000put", "datatype": "FP32", "dims": [-1]}], "outputs": []}},
])
def test_a_nul_inside_a_json_value_is_refused_before_postgresql_sees_it(alice: Person, body: dict[str, Any]) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["signature"] == ["Null characters are not allowed."]


@pytest.mark.parametrize("key", ["k\u0000ey", "clé", "a key", "x" * 256])
def test_an_idempotency_key_is_visible_ascii(alice: Person, key: str) -> None:
    response = alice.client().post("/api/v1/models/", {"name": "digits"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]["message"]
    assert not Model.objects.exists()
