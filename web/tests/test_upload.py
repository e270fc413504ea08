"""The upload page. In a browser its script uploads through tus and the API (driven by the browser tests); these
tests cover the page itself and its fallback without JavaScript: one multipart POST for small files."""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.models import Model, ModelVersion
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip, tiny_onnx
from tests.support.deploying import fake_runtime_env
from tests.support.people import Person, signed_in


def post(person: Person, name: str = "digits", data: bytes | None = None, filename: str = "model.onnx",
         **fields: Any) -> Any:
    file = SimpleUploadedFile(filename, tiny_onnx() if data is None else data)
    return signed_in(person).post("/models/upload/", {"name": name, "file": file, **fields})


def test_the_page_has_the_parts_the_script_drives(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="digits")
    content = signed_in(alice).get("/models/upload/?model=digits").content.decode()
    for element_id in ["upload-form", "id_name", "id_file", "drop-zone", "id_format", "id_max_batch_size",
                       "signature-editor", "signature-add-input", "signature-add-output", "id_signature",
                       "upload-submit", "upload-progress", "upload-progress-text", "upload-cancel", "upload-result",
                       "upload-deploy"]:
        assert f'id="{element_id}"' in content, element_id
    assert 'value="digits"' in content  # the name prefilled from ?model=, and offered in the datalist
    assert 'data-needs-signature="python,tensorrt_plan,tnn,torchscript"' in content
    assert "js/upload.js" in content
    assert "<option>BYTES</option>" in content


def test_a_small_file_uploads_without_javascript(alice: Person) -> None:
    response = post(alice)
    assert response.status_code == 302
    assert response["Location"] == "/models/digits/"
    version = ModelVersion.objects.get(model__team=alice.team, model__name="digits")
    assert version.number == 1
    assert version.format == "onnx"
    assert version.created_by == alice.user


def test_a_bad_model_name_is_shown_beside_the_name_field(alice: Person) -> None:
    response = post(alice, name="My Model")
    assert response.status_code == 200
    assert "lowercase letters" in response.context["form"].errors["name"][0]
    assert 'id="id_name_error"' in response.content.decode()
    assert not Model.objects.exists()


def test_a_file_that_is_no_model_is_shown_beside_the_file_field(alice: Person) -> None:
    response = post(alice, data=b"hello, not a model", filename="notes.txt")
    assert response.status_code == 200
    assert "but it is text, not a model" in response.context["form"].errors["file"][0]
    assert not Model.objects.exists()  # the model is created only with its first version


def test_a_format_without_a_signature_asks_for_one_beside_the_signature_field(alice: Person) -> None:
    response = post(alice, name="doubler", data=python_model_zip(), filename="model.zip")
    assert response.status_code == 200
    assert "signature" in response.context["form"].errors["signature"][0]
    response = post(alice, name="doubler", data=python_model_zip(), filename="model.zip",
                    signature=json.dumps(PYTHON_SIGNATURE))
    assert response.status_code == 302
    assert ModelVersion.objects.get(model__name="doubler").format == "python"


def test_a_signature_that_is_not_json_is_shown_beside_its_field(alice: Person) -> None:
    response = post(alice, signature="{inputs: nope")
    assert response.status_code == 200
    assert "not valid JSON" in response.context["form"].errors["signature"][0]


def test_a_file_too_large_for_one_request_asks_for_javascript(alice: Person, settings: Any) -> None:
    settings.MAX_MULTIPART_UPLOAD_SIZE = 10
    response = post(alice)
    assert response.status_code == 200
    assert "turn JavaScript on" in response.context["form"].errors["file"][0]


def test_a_missing_file_is_asked_for(alice: Person) -> None:
    response = signed_in(alice).post("/models/upload/", {"name": "digits"})
    assert response.status_code == 200
    assert "This field is required." in response.context["form"].errors["file"][0]


def test_the_page_says_what_the_local_runtime_serves(alice: Person, settings: Any, tmp_path: Any) -> None:
    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path, "torch-2.13.0", "tensorflow_cpu-2.21.0")
    (tmp_path / "lib/python3.11/site-packages/tensorflow").mkdir()
    (tmp_path / "lib/python3.11/site-packages/tensorflow/__init__.py").write_text("")
    content = signed_in(alice).get("/models/upload/").content.decode()
    # One sentence, #serving-note (the frameworks and their versions are the deploy form's, where one is chosen).
    assert ("This portal&#x27;s local runtime serves ONNX, TorchScript, TensorFlow SavedModels, Python models and "
            "pipelines.") in content



def test_the_upload_page_takes_its_format_hints_from_the_registry(alice: Person) -> None:
    """upload.js guesses a format from the extension and names refused formats from the registry, not its own lists."""
    content = signed_in(alice).get("/models/upload/").content.decode()
    found = re.search(r'<script id="format-hints" type="application/json">(.*?)</script>', content)
    assert found is not None
    hints = json.loads(found.group(1))
    assert hints["extensions"] == {"onnx": "onnx", "pt": "torchscript", "pth": "torchscript",
                                   "torchscript": "torchscript", "plan": "tensorrt_plan", "engine": "tensorrt_plan"}
    assert hints["names"]["tensorrt_plan"] == "A TensorRT plan"
    assert content.index('<option>FP32</option>') < content.index('<option>FP16</option>')  # FP32 first, the default


def test_the_page_says_once_where_torchscript_is_served(alice: Person, bare_runtime_env: Any) -> None:
    import re

    from web.serving import serving

    content = signed_in(alice).get("/models/upload/").content.decode()
    from django.utils.html import escape

    note = escape(serving().note())
    assert note in content and "TorchScript" in note
    # No second sentence about where it runs (the frameworks' line said "need PyTorch" beside "need Kubernetes").
    text = re.sub(r"<[^>]+>", " ", content)
    assert 'id="runtime-frameworks"' not in content
    assert not re.search(r"TorchScript[^.]*need", text.replace(note, ""))


EXAMPLE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_an_example_request_uploads_without_javascript_and_shows_on_the_version_page(alice: Person) -> None:
    """Item 1 of issue 31: the API and the CLI took an example request and the page had no field for it."""
    response = post(alice, name="doubler", data=python_model_zip(), filename="model.zip",
                    signature=json.dumps(PYTHON_SIGNATURE), example_request=json.dumps(EXAMPLE))
    assert response.status_code == 302
    version = ModelVersion.objects.get(model__name="doubler")
    assert version.example_request == EXAMPLE
    content = signed_in(alice).get("/models/doubler/").content.decode()
    assert 'id="version-1-example"' in content
    assert "Uploaded with an example request (x FP32 1 × 4)" in content


def test_the_upload_page_offers_the_example_request_folded_with_a_file_import(alice: Person) -> None:
    content = signed_in(alice).get("/models/upload/").content.decode()
    for element_id in ["example-request", "example-request-import", "id_example_request"]:
        assert f'id="{element_id}"' in content, element_id
    assert '<details id="example-request" class="example-request">' in content  # folded: most models need none
    assert 'data-example-max-bytes="1048576"' in content


def test_a_bad_example_request_is_shown_beside_its_field_in_the_apis_words(alice: Person) -> None:
    wrong = {"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = post(alice, name="doubler", data=python_model_zip(), filename="model.zip",
                    signature=json.dumps(PYTHON_SIGNATURE), example_request=json.dumps(wrong))
    assert response.status_code == 200
    [shown] = response.context["form"].errors["example_request"]
    assert shown == "inputs[0].name: 'nope' is not an input of the signature (its inputs: 'x')."
    assert 'id="id_example_request_error"' in response.content.decode()
    assert '<details id="example-request" class="example-request" open>' in response.content.decode()
    assert not Model.objects.exists()
    # The API's answer to the same request says the same.
    api = alice.client().post("/api/v1/models/doubler/versions/", {
        "file": SimpleUploadedFile("model.zip", python_model_zip()), "signature": json.dumps(PYTHON_SIGNATURE),
        "create_model": "true", "example_request": json.dumps(wrong)}, format="multipart")
    assert api.status_code == 400
    assert api.json()["error"]["fields"]["example_request"] == [shown]
    # Text that is no JSON at all, beside the field too, and nothing uploaded.
    response = post(alice, example_request="{inputs: nope")
    assert response.status_code == 200
    assert response.context["form"].errors["example_request"][0].startswith("The example request is not JSON (")
    assert not Model.objects.exists()


def test_the_model_page_names_an_unchecked_example_request_in_a_bounded_line(alice: Person) -> None:
    """Hostile: an ONNX upload's example is kept as sent until inspection checks it (the file carries the
    signature), so its input names may be anything the uploader sent: the page shows at most 64 characters of each,
    escaped, and at most eight inputs."""
    name = "<b>" + "n" * 10_000
    example = {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}] * 12}
    response = alice.client().post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "create_model": "true",
        "example_request": json.dumps(example)}, format="multipart")
    assert response.status_code == 201, response.json()
    content = signed_in(alice).get("/models/digits/").content.decode()
    line = re.search(r'<p class="muted small" id="version-1-example">(.*?)</p>', content).group(1)  # type: ignore[union-attr]
    assert "<b>" not in line and "&lt;b&gt;" + "n" * 61 + " FP32 1 × 4" in line
    assert len(line) < 1_000 and line.count("FP32") == 8 and "and 4 more" in line


def test_the_short_upload_address_leads_to_the_upload_page(alice: Person) -> None:
    response = signed_in(alice).get("/upload/?model=digits")
    assert response.status_code == 302
    assert response["Location"] == "/models/upload/?model=digits"
    assert signed_in(alice).get(response["Location"]).status_code == 200


def test_the_upload_pages_decoupled_checkbox_declares_a_streaming_python_model_and_refuses_it_on_onnx(
    alice: Person
) -> None:
    """Issue 33: the API's decoupled=true and the CLI's --decoupled, on the page (its script sends the checkbox as the
    API's field; without JavaScript the form does)."""
    content = signed_in(alice).get("/models/upload/").content.decode()
    assert 'id="id_decoupled"' in content and 'type="checkbox"' in content

    response = post(alice, name="doubler", data=python_model_zip(), filename="model.zip",
                    signature=json.dumps(PYTHON_SIGNATURE), decoupled="on")
    assert response.status_code == 302
    assert ModelVersion.objects.get(model__name="doubler").decoupled is True
    assert 'id="version-1-streams"' in signed_in(alice).get("/models/doubler/").content.decode()

    refused = post(alice, name="digits", decoupled="on")
    assert refused.status_code == 200
    [shown] = refused.context["form"].errors["decoupled"]
    assert shown.startswith("decoupled=true is for python models only") and "ONNX" in shown
    assert not Model.objects.filter(name="digits").exists()
