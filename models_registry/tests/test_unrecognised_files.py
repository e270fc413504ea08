"""A file that is no model says what it is instead ("named .onnx but it is text", "an ONNX file cut off after N
bytes", "a zip with no model.py; it holds README.md, data.csv"), and its bytes are deleted at once, through either
door (a multipart POST, or a tus upload turned into a version)."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from modelport.core.formats.unrecognised import describe_unrecognised
from models_registry.models import Model, ModelVersion, Upload
from models_registry.tests.storage_checks import assert_nothing_stored
from tests.artifacts import tiny_onnx
from tests.support.people import Person


def zipped(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


TEXT = b"I am the model, trust me\nlayer 1: ...\n"
CUT_ONNX = tiny_onnx()[:60]
README_AND_CSV = zipped({"README.md": "# digits\n", "data.csv": "x,y\n1,2\n"})

# (what is sent, its name, what the message must say)
BAD_FILES = [
    pytest.param(TEXT, "model.onnx", "named 'model.onnx' but it is text, not a model (it starts with 'I am the "
                                     "model, trust me')", id="text-named-onnx"),
    pytest.param(CUT_ONNX, "model.onnx", "an ONNX file cut off after 60 bytes (its last field needs", id="cut-onnx"),
    pytest.param(os.urandom(256 * 1024), "model.bin", "named 'model.bin' but it is 256.0 KB with no header "
                                                      "of a format the portal reads", id="random"),
    pytest.param(README_AND_CSV, "model.zip", "a zip archive with no model in it: no model.py (a Triton python "
                                              "model), saved_model.pb (a TensorFlow SavedModel), data.pkl (a "
                                              "TorchScript archive) or a .tnnproto with its .tnnmodel (a TNN model); "
                                              "it holds README.md, data.csv", id="readme-csv"),
]


# What an uploader is told to send: the formats by name, with their files (never the stored names, issue 31).
UPLOAD_ONE_OF = (
    "Upload one of: an ONNX model (the .onnx file); a TorchScript archive (the .pt file that torch.jit.save writes, "
    "not torch.save's); a TensorFlow SavedModel (its folder, saved_model.pb and variables/, in a .zip or .tar.gz); "
    "a TensorRT plan (the .plan or .engine file); a Triton python model (model.py defining TritonPythonModel, with "
    "an optional requirements.txt, in a .zip or .tar.gz); a TNN model (its .tnnproto and .tnnmodel files in a .zip "
    "or .tar.gz).")


def tus_upload(person: Person, data: bytes) -> str:
    tus = {"HTTP_TUS_RESUMABLE": "1.0.0"}
    created = person.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=str(len(data)), **tus)
    url = created["Location"].split("testserver", 1)[-1]
    done = person.client().generic("PATCH", url, data, content_type="application/offset+octet-stream",
                                   HTTP_UPLOAD_OFFSET="0", **tus)
    assert done.status_code == 204, done.content
    return url.rstrip("/").rsplit("/", 1)[-1]


def refusal(response: Any) -> str:
    assert response.status_code == 400, response.content
    return str(response.json()["error"]["message"])


@pytest.mark.parametrize(("data", "filename", "said"), BAD_FILES)
def test_a_bad_file_sent_in_the_request_says_what_it_is_and_nothing_is_stored(
        alice: Person, digits_model: Model, data: bytes, filename: str, said: str) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/",
                                   {"file": SimpleUploadedFile(filename, data)}, format="multipart")

    message = refusal(response)
    assert said in message
    assert message.endswith(f". {UPLOAD_ONE_OF}")
    assert_nothing_stored()


@pytest.mark.parametrize(("data", "filename", "said"), BAD_FILES)
def test_a_bad_tus_upload_says_what_it_is_and_its_bytes_are_deleted(
        alice: Person, digits_model: Model, data: bytes, filename: str, said: str) -> None:
    upload_id = tus_upload(alice, data)
    Upload.objects.filter(pk=upload_id).update(metadata={"filename": filename})

    response = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id}, format="json")

    assert said in refusal(response)
    assert not Upload.objects.exists()
    assert_nothing_stored()
    again = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id}, format="json")
    assert again.status_code in (400, 404) and not ModelVersion.objects.exists()


def test_a_declared_onnx_that_is_cut_off_says_so_without_the_name(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/",
                                   {"file": SimpleUploadedFile("model.onnx", CUT_ONNX), "format": "onnx"},
                                   format="multipart")

    assert refusal(response).startswith("file: The file is not a valid ONNX model: it is an ONNX file cut off after 60 "
                                        "bytes")
    assert refusal(response).endswith(". Upload an ONNX model: the .onnx file.")


def test_a_declared_format_the_file_is_not_says_which_files_to_upload(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/",
                                   {"file": SimpleUploadedFile("model.zip", README_AND_CSV), "format": "python"},
                                   format="multipart")

    assert refusal(response).endswith(
        "Upload a Triton python model: model.py defining TritonPythonModel, with an optional requirements.txt, in a "
        ".zip or .tar.gz.")


def test_a_declared_format_the_file_contradicts_names_the_one_to_declare(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/",
                                   {"file": SimpleUploadedFile("model.onnx", tiny_onnx()), "format": "torchscript"},
                                   format="multipart")

    assert refusal(response) == ("file: declared format 'torchscript' but the file looks like an ONNX model: declare "
                                 "'onnx' for it, or leave the format out (it is detected from the file)")


def test_a_format_name_that_is_none_lists_each_name_with_what_it_means(alice: Person, digits_model: Model) -> None:
    response = alice.client().post("/api/v1/models/digits/versions/",
                                   {"file": SimpleUploadedFile("model.pt", b"x"), "format": "pytorch"},
                                   format="multipart")

    assert response.json()["error"]["fields"] == {"format": [
        '"pytorch" is not a format name: send one of onnx for an ONNX model, torchscript for a TorchScript archive, '
        "tensorflow_savedmodel for a TensorFlow SavedModel, tensorrt_plan for a TensorRT plan, python for a Triton "
        "python model, tnn for a TNN model, or leave 'format' out to have it detected from the file."]}
    assert_nothing_stored()


def test_fifty_megabytes_of_random_bytes_are_read_only_at_the_start(tmp_path: Path) -> None:
    path = tmp_path / "weights.onnx"
    with open(path, "wb") as out:
        out.write(os.urandom(64 * 1024))
        out.truncate(50 * 1024 * 1024)  # sparse: the rest is never read

    assert describe_unrecognised(path, "weights.onnx") == (
        "named 'weights.onnx' but it is 50.0 MB with no header of a format the portal reads (not an ONNX "
        "ModelProto, a TensorRT plan, a zip or a tar archive)")


@pytest.mark.parametrize(("data", "said"), [
    (zipped({"m/model.py": "print('no class')\n"}), "a zip archive whose m/model.py defines no class "
                                                    "TritonPythonModel"),
    (b"\x89HDF\r\n\x1a\n" + bytes(64), "an HDF5 file (a Keras .h5 model?): export it as a SavedModel or to ONNX"),
    (b"\x80\x04" + bytes(64), "a Python pickle (torch.save of a module?)"),
    (zipped({f"f{n}.txt": "x" for n in range(20)}), "it holds f0.txt, f1.txt, f2.txt, f3.txt, f4.txt, f5.txt, "
                                                     "f6.txt, f7.txt and 12 more"),
    (b"\x1b[31mred\x07\n", "text, not a model (it starts with '?[31mred?')"),
])
def test_other_files_that_are_not_models_are_named_too(tmp_path: Path, data: bytes, said: str) -> None:
    path = tmp_path / "upload"
    path.write_bytes(data)

    assert said in describe_unrecognised(path)
