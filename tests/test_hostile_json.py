"""JSON nested 10,000 deep (or just deeper than any Modelport document) is a 400 that says so, in every JSON
endpoint and in the JSON carried by form fields (a signature, a pipeline definition), never a RecursionError (500).
A fuzzing run found this in all of them: Python's json raises RecursionError, which DRF and our validators let
through."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from deployments.models import Deployment, Revision
from modelport.core.json_input import MAX_DEPTH, TooDeep, check_depth, loads
from modelport.core.signature import SignatureError, parse_signature
from models_registry.models import Model, ModelVersion
from tests.artifacts import python_model_zip
from tests.support.deploying import deploy
from tests.support.people import Person, signed_in
from tests.support.versions import make_ready_version

TEN_THOUSAND_OPEN = "[" * 10_000
TEN_THOUSAND_CLOSED = "[" * 10_000 + "]" * 10_000  # valid JSON, too deep for Python's parser
FORTY_OBJECTS = '{"a": ' * 40 + "1" + "}" * 40  # valid, parses fine, deeper than any document of ours


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return [value] if depth else value


@pytest.mark.parametrize("body", [TEN_THOUSAND_OPEN, TEN_THOUSAND_CLOSED, FORTY_OBJECTS])
@pytest.mark.parametrize(("method", "path"), [
    ("post", "/api/v1/models/"),
    ("patch", "/api/v1/models/digits/"),
    ("post", "/api/v1/models/digits/versions/"),
    ("post", "/api/v1/deployments/"),
    ("patch", "/api/v1/deployments/digits-prod/"),
    ("post", "/api/v1/tokens/"),
])
def test_every_json_endpoint_answers_400_to_json_nested_too_deep(alice: Person, method: str, path: str,
                                                                 body: str) -> None:
    digits = make_ready_version(alice, "digits")
    deploy(alice, model=digits.model.name)
    client = alice.client()
    if path == "/api/v1/tokens/":  # people manage tokens, not tokens: a signed-in session
        client = APIClient()
        client.force_login(alice.user)
    response = getattr(client, method)(path, body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "parse_error"
    assert f"nested deeper than {MAX_DEPTH} levels" in error["message"]
    assert Revision.objects.count() == 1 and Deployment.objects.count() == 1 and Model.objects.count() == 1


def test_documents_as_deep_as_the_limit_still_parse(alice: Person) -> None:
    assert loads(json.dumps(nested(MAX_DEPTH))) == nested(MAX_DEPTH)
    with pytest.raises(TooDeep):
        loads(json.dumps(nested(MAX_DEPTH + 1)))
    with pytest.raises(TooDeep):
        check_depth({"models": [{"warmup": nested(MAX_DEPTH)}]})


def test_a_signature_nested_too_deep_is_a_signature_error_not_a_recursion_error() -> None:
    for text in [TEN_THOUSAND_OPEN, TEN_THOUSAND_CLOSED, '{"inputs": ' + "[" * 5000]:
        with pytest.raises(SignatureError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse_signature(text)


def test_a_signature_form_field_nested_too_deep_is_a_400_on_that_field(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="doubler")
    for signature in [TEN_THOUSAND_CLOSED, json.dumps({"inputs": nested(40), "outputs": []})]:
        response = alice.client().post("/api/v1/models/doubler/versions/", {
            "file": SimpleUploadedFile("model.zip", python_model_zip()), "signature": signature}, format="multipart")
        assert response.status_code == 400, response.content[:300]
        assert response.json()["error"]["fields"]["signature"] == [f"Nested deeper than {MAX_DEPTH} levels."]
    assert not ModelVersion.objects.exists()


def test_a_signature_sent_as_a_json_string_too_deep_is_a_400(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="doubler")
    response = alice.client().post("/api/v1/models/doubler/versions/", {"signature": TEN_THOUSAND_OPEN,
                                                                         "upload_id": "0" * 32}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert "nested deeper than" in response.json()["error"]["fields"]["signature"][0]


def test_a_pipeline_definition_nested_too_deep_is_a_400(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="chain")
    response = alice.client().post("/api/v1/models/chain/versions/", {
        "format": "ensemble", "definition": TEN_THOUSAND_CLOSED}, format="multipart")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["fields"]["definition"] == [f"Nested deeper than {MAX_DEPTH} levels."]


def test_the_upload_page_shows_a_signature_too_deep_beside_its_field(alice: Person) -> None:
    response = signed_in(alice).post("/models/upload/", {
        "name": "doubler", "file": SimpleUploadedFile("model.zip", python_model_zip()),
        "signature": TEN_THOUSAND_CLOSED})
    assert response.status_code == 200
    assert f"nested deeper than {MAX_DEPTH} levels" in response.context["form"].errors["signature"][0]
