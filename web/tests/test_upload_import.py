"""The upload page's "From a registry" tab (issue 35): the import form makes the API's source, creates the version
through the same action as the API, and the model's page shows the import's progress and its Cancel button.

The source kinds' fetchers are other parts of issue 35 (each needs its operator's allowances and a server): where a
test needs an import to be accepted, a stub fetcher stands in for the kind's (it accepts the source as given); the
refusal of a kind this server cannot fetch from is the real fetcher_for's."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from models_registry import imports
from models_registry.models import Model, ModelVersion
from tests.support.people import Person, signed_in


class StubFetcher:
    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        if source.get("uri", "").startswith("s3://forbidden/"):
            from models_registry.sources.base import SourceForbidden
            raise SourceForbidden("Bucket 'forbidden' is not in your team's allowed buckets (IMPORT_S3_BUCKETS).")
        return {k: v for k, v in source.items() if k != "kind"}

    def identity(self, source: dict[str, Any]) -> str:
        return f"{source.get('uri') or source.get('repo')}@{source.get('revision', '')}"


@pytest.fixture
def stub_fetchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "fetcher_for", lambda kind: StubFetcher())


def post(person: Person | Client, **fields: Any) -> Any:
    client = signed_in(person) if isinstance(person, Person) else person
    return client.post("/models/upload/import/", {"name": "fraud", "kind": "mlflow", **fields})


def test_the_upload_page_offers_the_registry_tab_and_the_tab_shows_only_the_import_form(alice: Person) -> None:
    upload = signed_in(alice).get("/models/upload/").content.decode()
    assert 'id="tab-import"' in upload and 'href="/models/upload/import/"' in upload
    page = signed_in(alice).get("/models/upload/import/?model=fraud").content.decode()
    for element_id in ["import-form", "id_name", "id_kind_0", "id_mlflow_uri", "id_hf_repo", "id_hf_revision",
                       "id_hf_files", "id_uri", "import-submit"]:
        assert f'id="{element_id}"' in page, element_id
    assert 'id="upload-form"' not in page and "js/upload.js" not in page, "the other form is not on the page"
    assert 'value="fraud"' in page


@pytest.mark.parametrize(("fields", "source"), [
    ({"kind": "mlflow", "mlflow_uri": " models:/fraud/3 "}, {"kind": "mlflow", "uri": "models:/fraud/3"}),
    ({"kind": "huggingface", "hf_repo": "org/name", "hf_revision": "", "hf_files": "model.onnx,\nconfig.json"},
     {"kind": "huggingface", "repo": "org/name", "revision": "main", "files": ["model.onnx", "config.json"]}),
    ({"kind": "uri", "uri": "s3://models/fraud.onnx"}, {"kind": "uri", "uri": "s3://models/fraud.onnx"}),
])
def test_an_import_creates_the_model_and_an_importing_version_and_redirects_to_it(
    alice: Person, stub_fetchers: None, fields: dict[str, Any], source: dict[str, Any]
) -> None:
    browser = signed_in(alice)
    response = post(browser, **fields)

    assert response.status_code == 302 and response["Location"] == "/models/fraud/"
    version = ModelVersion.objects.get(model__team=alice.team, model__name="fraud")
    assert (version.number, version.status, version.source) == (1, "importing", source)
    page = browser.get("/models/fraud/").content.decode()
    assert "Importing fraud version 1." in page
    assert 'id="version-1-import"' in page and 'id="version-1-cancel"' in page
    assert 'hx-trigger="every 2s"' in page, "the versions refresh while importing"


def test_the_same_source_again_is_the_version_imported_before(alice: Person, stub_fetchers: None) -> None:
    browser = signed_in(alice)
    post(browser, mlflow_uri="models:/fraud/3")
    browser.get("/models/fraud/")  # the first message shown
    response = post(browser, mlflow_uri="models:/fraud/3")

    assert response.status_code == 302
    assert ModelVersion.objects.filter(model__name="fraud").count() == 1
    assert "fraud version 1 was imported from this source already." in browser.get("/models/fraud/").content.decode()


def test_the_progress_shows_the_bytes_of_the_total_and_cancel_stops_the_import(alice: Person,
                                                                                stub_fetchers: None) -> None:
    browser = signed_in(alice)
    post(browser, mlflow_uri="models:/fraud/3")
    browser.get("/models/fraud/")
    ModelVersion.objects.filter(model__name="fraud").update(import_done_bytes=512 * 1024,
                                                           import_total_bytes=2 * 1024 * 1024)
    page = browser.get("/models/fraud/versions/").content.decode()
    assert "Fetching: 512.0\xa0KB of 2.0\xa0MB" in page

    response = browser.post("/models/fraud/versions/1/cancel/")

    assert response.status_code == 302
    version = ModelVersion.objects.get(model__name="fraud")
    assert (version.status, version.error) == ("invalid", "Import cancelled by alice.")
    page = browser.get("/models/fraud/").content.decode()
    assert "Cancelled the import of fraud version 1." in page and 'id="version-1-cancel"' not in page
    browser.post("/models/fraud/versions/1/cancel/")
    assert "Version 1 is invalid, not importing" in browser.get("/models/fraud/").content.decode()


def test_another_team_cannot_cancel_the_import(alice: Person, charlie: Person, stub_fetchers: None) -> None:
    post(alice, mlflow_uri="models:/fraud/3")

    assert signed_in(charlie).post("/models/fraud/versions/1/cancel/").status_code == 404
    assert ModelVersion.objects.get(model__name="fraud").status == "importing"


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"kind": "mlflow"}, "mlflow_uri", "Required for this source."),
    ({"kind": "huggingface"}, "hf_repo", "Required for this source."),
    ({"kind": "uri", "uri": "s3://forbidden/x.onnx"}, "uri", "not in your team&#x27;s allowed buckets"),
    ({"name": "Fraud Model", "mlflow_uri": "models:/fraud/3"}, "name", "is not a valid name"),
])
def test_a_bad_or_forbidden_source_is_shown_on_its_field_and_nothing_is_created(
    alice: Person, stub_fetchers: None, fields: dict[str, Any], field: str, message: str
) -> None:
    response = post(alice, **fields)

    assert response.status_code == 200
    content = response.content.decode()
    assert f'id="field-{field}"' in content and message in content
    assert 'class="field has-error" id="field-' + field in content
    assert not Model.objects.exists()


def test_the_real_uri_fetcher_refuses_a_bucket_the_operator_did_not_allow_on_the_uri_field(alice: Person) -> None:
    # No stub: main's uri fetcher and the team's allowances (none here), shown on the form, nothing created.
    response = post(alice, kind="uri", uri="s3://models/fraud.onnx")

    assert response.status_code == 200
    content = response.content.decode()
    assert 'class="field has-error" id="field-uri"' in content and "Team sources" in content
    assert not Model.objects.exists()
