from __future__ import annotations

import io
import json
import tarfile
import threading
import zipfile
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.test import Client

from models_registry.models import Blob, Model, ModelVersion
from models_registry.tests.storage_checks import assert_nothing_stored, stored_files
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip, tiny_onnx
from tests.support.people import Person


def upload(person: Person, data: bytes, filename: str = "model.onnx", **fields: Any) -> Any:
    payload = {"file": SimpleUploadedFile(filename, data), **fields}
    return person.client().post("/api/v1/models/digits/versions/", payload, format="multipart")


def test_an_onnx_upload_becomes_a_ready_version_with_its_signature(alice: Person, digits_model: Model,
                                                                   eager_tasks: Any) -> None:
    response = upload(alice, tiny_onnx())
    assert response.status_code == 201
    body = response.json()
    assert body["number"] == 1
    assert body["status"] == "validating"
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert version.format == "onnx"
    assert version.signature == {
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}],
    }
    assert version.max_batch_size > 0
    assert len(version.sha256) == 64
    detail = alice.client().get("/api/v1/models/digits/versions/1/").json()
    assert detail["status"] == "ready"
    assert detail["sha256"] == version.sha256
    assert detail["size"] == len(tiny_onnx())


def test_version_numbers_increase(alice: Person, digits_model: Model, eager_tasks: Any) -> None:
    numbers = [upload(alice, tiny_onnx(out_features=n)).json()["number"] for n in (1, 2, 3)]
    assert numbers == [1, 2, 3]
    listed = alice.client().get("/api/v1/models/digits/versions/").json()
    assert [v["number"] for v in listed] == [3, 2, 1]


def test_identical_content_is_stored_once(alice: Person, digits_model: Model, eager_tasks: Any) -> None:
    upload(alice, tiny_onnx())
    upload(alice, tiny_onnx())
    assert ModelVersion.objects.filter(status="ready").count() == 2
    assert Blob.objects.count() == 1
    assert len(stored_files()) == 1


def test_the_format_is_detected_when_not_declared_and_checked_when_declared(alice: Person, digits_model: Model) -> None:
    response = upload(alice, tiny_onnx(), format="torchscript")
    assert response.status_code == 400
    assert "declared format 'torchscript'" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_it_rejects_a_corrupt_onnx_file(alice: Person, digits_model: Model) -> None:
    response = upload(alice, b"\x08\x07garbage" * 100, format="onnx")
    assert response.status_code == 400
    assert "not a valid ONNX model" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_it_rejects_a_file_of_unknown_format(alice: Person, digits_model: Model) -> None:
    response = upload(alice, b"hello world", filename="notes.txt")
    assert response.status_code == 400
    assert "The file is named 'notes.txt' but it is text, not a model" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_it_rejects_zip_slip(alice: Person, digits_model: Model) -> None:
    data = python_model_zip({"../../evil.py": b"print('owned')"})
    response = upload(alice, data, filename="model.zip", format="python", signature=json.dumps(PYTHON_SIGNATURE))
    assert response.status_code == 400
    assert "Unsafe archive" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_it_rejects_symlinks_in_archives(alice: Person, digits_model: Model) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("model.py")
        body = b"class TritonPythonModel: pass\n"
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
        link = tarfile.TarInfo("secrets")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        archive.addfile(link)
    response = upload(alice, buffer.getvalue(), filename="model.tar", signature=json.dumps(PYTHON_SIGNATURE))
    assert response.status_code == 400
    assert "link" in response.json()["error"]["message"].lower()
    assert_nothing_stored()


def test_it_rejects_zip_bombs(alice: Person, digits_model: Model, settings: Any) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model.py", "class TritonPythonModel: pass\n")
        archive.writestr("weights.bin", b"\0" * (20 * 1024 * 1024))
    response = upload(alice, buffer.getvalue(), filename="model.zip", signature=json.dumps(PYTHON_SIGNATURE))
    assert response.status_code == 400
    assert "Unsafe archive" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_a_python_model_needs_a_signature(alice: Person, digits_model: Model) -> None:
    response = upload(alice, python_model_zip(), filename="model.zip")
    assert response.status_code == 400
    assert "carries no readable signature" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_a_python_model_with_a_signature_is_accepted(alice: Person, digits_model: Model, eager_tasks: Any) -> None:
    response = upload(alice, python_model_zip(), filename="model.zip", signature=json.dumps(PYTHON_SIGNATURE))
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert version.format == "python"
    assert version.signature["outputs"][0]["datatype"] == "FP32"  # TYPE_FP32 accepted, KServe name stored


def test_it_rejects_a_bad_signature_with_a_field_message(alice: Person, digits_model: Model) -> None:
    bad = {"inputs": [{"name": "x", "datatype": "FLOAT99", "dims": [-1, 4]}],
           "outputs": [{"name": "y", "datatype": "FP32", "dims": [4]}]}
    response = upload(alice, python_model_zip(), filename="model.zip", signature=json.dumps(bad))
    assert response.status_code == 400
    assert "unknown datatype 'FLOAT99'" in response.json()["error"]["fields"]["signature"][0]
    assert_nothing_stored()


def test_a_max_batch_size_without_a_batch_dimension_makes_the_version_invalid(alice: Person, digits_model: Model,
                                                                              eager_tasks: Any) -> None:
    response = upload(alice, tiny_onnx(batch=False), max_batch_size="8")
    assert response.status_code == 201
    version = ModelVersion.objects.get()
    assert version.status == "invalid"
    assert "needs a batch dimension" in version.error
    assert stored_files() == []


def test_it_answers_413_over_the_size_limit(alice: Person, digits_model: Model, settings: Any) -> None:
    settings.MAX_MULTIPART_UPLOAD_SIZE = 100
    response = upload(alice, tiny_onnx())
    assert response.status_code == 413
    assert "limited to 100 bytes" in response.json()["error"]["message"]
    assert_nothing_stored()


def test_it_needs_a_file_or_an_upload_id(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/", {}, format="multipart")
    assert response.status_code == 400
    assert "exactly one of 'file'" in response.json()["error"]["message"]


def test_a_json_body_that_is_not_an_object_is_a_400(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/", [{"upload_id": "x"}], format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The request body must be a JSON object."


def test_charlie_cannot_upload_to_or_read_another_teams_model(alice: Person, charlie: Person, digits_model: Model,
                                                              eager_tasks: Any) -> None:
    upload(alice, tiny_onnx())
    assert upload(charlie, tiny_onnx()).status_code == 404
    assert charlie.client().get("/api/v1/models/digits/versions/1/").status_code == 404
    assert charlie.client().delete("/api/v1/models/digits/versions/1/").status_code == 404
    assert ModelVersion.objects.count() == 1


def test_deleting_a_version_removes_its_bytes_when_no_other_version_shares_them(alice: Person, digits_model: Model,
                                                                                eager_tasks: Any) -> None:
    upload(alice, tiny_onnx())
    upload(alice, tiny_onnx())
    assert alice.client().delete("/api/v1/models/digits/versions/1/").status_code == 204
    assert len(stored_files()) == 1
    assert alice.client().delete("/api/v1/models/digits/versions/2/").status_code == 204
    assert stored_files() == []
    assert not Blob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_never_get_the_same_number(alice: Person, digits_model: Model) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs a database with row locks and real concurrency (CI runs this on PostgreSQL)")
    numbers: list[int] = []
    errors: list[BaseException] = []

    def reserve() -> None:
        try:
            with transaction.atomic():
                numbers.append(Model.objects.get(pk=digits_model.pk).next_version_number())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=reserve) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(numbers) == list(range(1, 21))


# --- create_model: a model is created with its first version, never without it -----------------------------------


def test_create_model_makes_the_model_with_its_first_version(alice: Person) -> None:
    payload = {"file": SimpleUploadedFile("model.onnx", tiny_onnx()), "create_model": "true"}
    response = alice.client().post("/api/v1/models/notes/versions/", payload, format="multipart")
    assert response.status_code == 201, response.json()
    model = Model.objects.get(team=alice.team, name="notes")
    assert model.created_by == alice.user
    assert model.versions.get().number == 1
    from audit.models import AuditEntry

    assert AuditEntry.objects.filter(action="model.create", target="notes").exists()


def test_a_refused_first_version_leaves_no_empty_model(alice: Person) -> None:
    """The upload page created the model first: a refused file left "notes · 0 · no version" behind."""
    payload = {"file": SimpleUploadedFile("notes.txt", b"hello, not a model"), "create_model": "true"}
    response = alice.client().post("/api/v1/models/notes/versions/", payload, format="multipart")
    assert response.status_code == 400
    assert "but it is text, not a model" in response.json()["error"]["message"]
    assert not Model.objects.exists()
    assert_nothing_stored()


def test_a_refused_first_version_from_a_tus_upload_leaves_no_empty_model(alice: Person) -> None:
    tus = {"HTTP_TUS_RESUMABLE": "1.0.0"}
    created = alice.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="5", **tus)
    url = created["Location"].split("testserver", 1)[-1]
    alice.client().generic("PATCH", url, b"hello", content_type="application/offset+octet-stream",
                           HTTP_UPLOAD_OFFSET="0", **tus)
    body = {"upload_id": url.rstrip("/").rsplit("/", 1)[-1], "create_model": True}
    response = alice.client().post("/api/v1/models/notes/versions/", body, format="json")
    assert response.status_code == 400
    assert not Model.objects.exists()


def test_without_create_model_an_unknown_model_is_404(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/notes/versions/",
                                   {"file": SimpleUploadedFile("m.onnx", tiny_onnx())},
                                   format="multipart")
    assert response.status_code == 404
    assert not Model.objects.exists()


@pytest.mark.parametrize(("name", "value", "field", "message"), [
    ("Notes", True, "name", "is not a valid name"),
    ("upload", True, "name", "reserved"),
    ("notes", "perhaps", "create_model", "Must be a valid boolean"),
])
def test_create_model_checks_the_name_and_the_flag(alice: Person, name: str, value: Any, field: str,
                                                   message: str) -> None:
    response = alice.client().post(f"/api/v1/models/{name}/versions/", {"upload_id": "x", "create_model": value},
                                   format="json")
    assert response.status_code == 400
    assert message in " ".join(response.json()["error"]["fields"][field])
    assert not Model.objects.exists()


def test_create_model_uses_a_model_that_exists_already(alice: Person, digits_model: Model) -> None:
    payload = {"file": SimpleUploadedFile("model.onnx", tiny_onnx()), "create_model": "true"}
    assert alice.client().post("/api/v1/models/digits/versions/", payload, format="multipart").status_code == 201
    assert Model.objects.get().versions.count() == 1


def test_create_model_makes_a_model_in_the_callers_team_only(alice: Person, charlie: Person,
                                                             digits_model: Model) -> None:
    payload = {"file": SimpleUploadedFile("model.onnx", tiny_onnx()), "create_model": "true"}
    assert charlie.client().post("/api/v1/models/digits/versions/", payload, format="multipart").status_code == 201
    assert Model.objects.get(team=charlie.team, name="digits").versions.count() == 1
    assert digits_model.versions.count() == 0


def test_pushing_the_same_bytes_again_says_which_version_they_are_identical_to(
        alice: Person, digits_model: Model, eager_tasks: Any) -> None:
    upload(alice, tiny_onnx())
    upload(alice, tiny_onnx(out_features=5))
    upload(alice, tiny_onnx())

    third = alice.client().get("/api/v1/models/digits/versions/3/").json()
    assert third["identical_to"] == 1
    assert alice.client().get("/api/v1/models/digits/versions/2/").json()["identical_to"] is None
    listed = {v["number"]: v["identical_to"] for v in alice.client().get("/api/v1/models/digits/versions/").json()}
    assert listed == {3: 1, 2: None, 1: None}
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get("/models/digits/").content.decode()
    assert 'id="version-3-identical">Identical to version 1' in page
    assert 'id="version-1-identical"' not in page


def test_the_same_bytes_in_another_teams_model_are_not_identical_to_anything(
        alice: Person, charlie: Person, digits_model: Model, eager_tasks: Any) -> None:
    upload(alice, tiny_onnx())
    theirs = Model.objects.create(team=charlie.team, name="digits", created_by=charlie.user)
    payload = {"file": SimpleUploadedFile("model.onnx", tiny_onnx())}
    assert charlie.client().post("/api/v1/models/digits/versions/", payload, format="multipart").status_code == 201

    assert charlie.client().get("/api/v1/models/digits/versions/1/").json()["identical_to"] is None
    assert theirs.versions.get().sha256 == ModelVersion.objects.filter(model=digits_model).get().sha256
