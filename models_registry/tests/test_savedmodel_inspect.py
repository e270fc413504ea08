"""Reading a TensorFlow SavedModel's signature from saved_model.pb, without TensorFlow.

data/tiny_saved_model.pb is real: written by tf.saved_model.save (TensorFlow 2.21) for a module with one variable
and a serving_default signature (x FP32 [-1, 4], tag BYTES [-1] -> y FP32 [-1, 3], label BYTES [-1]). The hostile
variants are built with the reader's own schema subset, which writes the same wire format as TensorFlow's.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest

from modelport.core.definitions import SavedModelDefinition
from modelport.core.formats.onnx_inspect import InspectionError
from modelport.core.formats.savedmodel_inspect import (
    inspect_savedmodel_archive,
    parse_saved_model,
    read_signature,
)
from modelport.core.signature import Tensor
from models_registry.models import Model, ModelVersion
from models_registry.tests.savedmodels import saved_model, varint
from tests.support.people import Person

TINY_PB = (Path(__file__).parent / "data" / "tiny_saved_model.pb").read_bytes()


def archive(tmp_path: Path, files: dict[str, bytes], name: str = "model.zip") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as zf:
        for entry, data in files.items():
            zf.writestr(entry, data)
    return path


FP32 = {"dtype": 1, "dims": [-1, 3]}


def test_it_reads_the_serving_signature_of_a_real_savedmodel() -> None:
    found = read_signature(parse_saved_model(TINY_PB))
    assert found.signature_def == "serving_default"
    assert found.signature_defs == ["serving_default"]  # TensorFlow's own "__saved_model_init_op" is left out
    assert found.tensorflow_version == "2.21.0"
    assert found.signature.inputs == (Tensor("tag", "BYTES", (-1,)), Tensor("x", "FP32", (-1, 4)))
    assert found.signature.outputs == (Tensor("label", "BYTES", (-1,)), Tensor("y", "FP32", (-1, 3)))
    assert found.definition == SavedModelDefinition(signature_def="serving_default",
                                                    signature_defs=("serving_default",))


def test_an_input_and_an_output_of_the_same_name_is_refused_with_the_reason() -> None:
    # TensorFlow allows it; Triton needs distinct tensor names.
    with pytest.raises(InspectionError, match="tensor names must be unique across inputs and outputs: \\['tag'\\]"):
        inspect_signature_of({"serving_default": {"inputs": {"tag": FP32}, "outputs": {"tag": FP32}}})


def inspect_signature_of(signatures: dict[str, Any], **kwargs: Any) -> Any:
    return read_signature(parse_saved_model(saved_model(signatures, **kwargs)))


def test_it_serves_the_only_signature_when_there_is_no_serving_default() -> None:
    found = inspect_signature_of({"predict": {"inputs": {"x": FP32}, "outputs": {"y": {"dtype": 9, "dims": [-1]}}},
                                  "__saved_model_init_op": {"outputs": {"__saved_model_init_op": FP32}}})
    assert found.signature_def == "predict"
    assert found.signature.outputs == (Tensor("y", "INT64", (-1,)),)


def test_several_signatures_without_serving_default_are_refused_with_their_names() -> None:
    with pytest.raises(InspectionError, match="several signatures \\('a', 'b'\\) and none is 'serving_default'"):
        inspect_signature_of({"a": {"inputs": {"x": FP32}, "outputs": {"y": FP32}},
                              "b": {"inputs": {"x": FP32}, "outputs": {"y": FP32}}})


def test_a_savedmodel_without_a_serve_metagraph_is_refused() -> None:
    with pytest.raises(InspectionError, match="no MetaGraph tagged only 'serve' \\(it has \\[\\['train'\\]\\]\\)"):
        inspect_signature_of({"serving_default": {"inputs": {"x": FP32}, "outputs": {"y": FP32}}}, tags=("train",))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"dtype": 8, "dims": [-1]}, "input 'x' is DT_COMPLEX64, which Triton cannot serve"),
        ({"dtype": 20, "dims": [-1]}, "input 'x' is DT_RESOURCE, which Triton cannot serve"),
        ({"dtype": 250, "dims": [-1]}, "input 'x' has a datatype this portal does not know"),
        ({"dtype": 1, "unknown_rank": True}, "input 'x' has an unknown rank"),
        ({"dtype": 1, "sparse": True}, "input 'x' is a sparse or composite tensor"),
        ({"dtype": 1, "dims": [-1, 0]}, "input 'x' has a dimension of size 0"),
        ({"dtype": 1, "dims": [-1, -7]}, "input 'x' has a dimension of size -7"),
        ({"dtype": 1, "dims": [1] * 40}, "input 'x' has 40 dimensions, more than 32"),
    ],
)
def test_tensors_triton_cannot_serve_are_refused_with_the_reason(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InspectionError, match=message.replace("(", "\\(").replace(")", "\\)")):
        inspect_signature_of({"serving_default": {"inputs": {"x": spec}, "outputs": {"y": FP32}}})


def test_a_signature_without_tensors_is_refused() -> None:
    with pytest.raises(InspectionError, match="signature.inputs must be a non-empty list"):
        inspect_signature_of({"serving_default": {"outputs": {"y": FP32}}})


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x12\x80\x80\x80\x80\x10", b"not a protobuf at all"])
def test_bytes_that_are_not_a_savedmodel_are_refused(garbage: bytes) -> None:
    with pytest.raises(InspectionError, match="saved_model.pb is not a SavedModel"):
        read_signature(parse_saved_model(garbage))


def test_deeply_nested_garbage_does_not_crash_the_reader() -> None:
    # Field 2 (meta_graphs) nested inside itself thousands of times: the parser's recursion limit refuses it.
    data = b""
    for _ in range(5000):
        data = b"\x12" + varint(len(data)) + data
    with pytest.raises(InspectionError):
        read_signature(parse_saved_model(data))


def test_it_reads_a_text_format_savedmodel() -> None:
    text = b"""
    saved_model_schema_version: 1
    meta_graphs {
      meta_info_def { tags: "serve" tensorflow_version: "2.15.0" stripped_op_list { op { name: "MatMul" } } }
      graph_def { node { name: "x" op: "Placeholder" } }
      signature_def {
        key: "serving_default"
        value {
          inputs { key: "x" value { name: "x:0" dtype: DT_FLOAT tensor_shape { dim { size: -1 } dim { size: 4 } } } }
          outputs { key: "y" value { name: "y:0" dtype: DT_FLOAT tensor_shape { dim { size: -1 } } } }
          method_name: "tensorflow/serving/predict"
        }
      }
    }
    """
    found = read_signature(parse_saved_model(text, text=True))
    assert found.signature.inputs == (Tensor("x", "FP32", (-1, 4)),)
    assert found.tensorflow_version == "2.15.0"


def test_it_reads_the_savedmodel_of_a_zip_of_its_folder_and_of_a_tar_gz(tmp_path: Path) -> None:
    import tarfile

    zipped = archive(tmp_path, {"export/saved_model.pb": TINY_PB, "export/variables/variables.index": b"i"})
    assert inspect_savedmodel_archive(zipped).signature_def == "serving_default"
    tarred = tmp_path / "model.tar.gz"
    with tarfile.open(tarred, "w:gz") as tf:
        info = tarfile.TarInfo("saved_model.pb")
        info.size = len(TINY_PB)
        tf.addfile(info, io.BytesIO(TINY_PB))
    assert inspect_savedmodel_archive(tarred).signature.inputs[1].name == "x"


def test_a_saved_model_pb_above_the_limit_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("modelport.core.formats.savedmodel_inspect.SAVED_MODEL_PB_MAX_BYTES", 1000)
    with pytest.raises(InspectionError, match="larger than 1000 bytes"):
        inspect_savedmodel_archive(archive(tmp_path, {"saved_model.pb": TINY_PB}))


def test_an_archive_with_the_savedmodel_two_folders_deep_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InspectionError, match="no saved_model.pb at its top level or inside its single top folder"):
        inspect_savedmodel_archive(archive(tmp_path, {"a/b/saved_model.pb": TINY_PB}))


# --- Through the API: the worker reads the signature -------------------------------------------------------------


@pytest.fixture
def tiny(alice: Person) -> Model:
    return Model.objects.create(team=alice.team, name="tiny", created_by=alice.user)


def upload(person: Person, data: bytes, **fields: Any) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    payload = {"file": SimpleUploadedFile("tiny.zip", data), **fields}
    return person.client().post("/api/v1/models/tiny/versions/", payload, format="multipart")


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def test_a_savedmodel_upload_becomes_ready_with_the_signature_read_from_it(
    alice: Person, tiny: Model, eager_tasks: Any
) -> None:
    pb = saved_model({"serving_default": {"inputs": {"x": {"dtype": 1, "dims": [-1, 4]}},
                                          "outputs": {"y": {"dtype": 1, "dims": [-1, 3]}}}})
    archive = zip_bytes({"tiny/saved_model.pb": pb, "tiny/variables/variables.index": b""})
    assert upload(alice, archive).status_code == 201
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert version.format == "tensorflow_savedmodel"
    assert version.signature == {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                                 "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}
    assert version.max_batch_size == 64
    assert version.definition == {"signature_def": "serving_default", "signature_defs": ["serving_default"]}


def test_a_savedmodel_whose_declared_signature_contradicts_the_file_is_invalid(
    alice: Person, tiny: Model, eager_tasks: Any
) -> None:
    pb = saved_model({"serving_default": {"inputs": {"x": {"dtype": 1, "dims": [-1, 4]}},
                                          "outputs": {"y": {"dtype": 1, "dims": [-1, 3]}}}})
    declared = ('{"inputs": [{"name": "x", "datatype": "INT64", "dims": [-1, 4]}], '
                '"outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}')
    upload(alice, zip_bytes({"saved_model.pb": pb}), signature=declared)
    version = ModelVersion.objects.get()
    assert version.status == "invalid"
    assert version.error == ("The declared signature does not match the model: input 'x' is declared INT64 but the "
                             "model has FP32")


def test_a_hostile_saved_model_pb_makes_the_version_invalid_with_a_message(
    alice: Person, tiny: Model, eager_tasks: Any
) -> None:
    upload(alice, zip_bytes({"saved_model.pb": b"\x12\xff\xff\xff\xff\x0f garbage"}))
    version = ModelVersion.objects.get()
    assert version.status == "invalid"
    assert version.error.startswith("saved_model.pb is not a SavedModel")


# --- Inspection runs none of the model ------------------------------------------------------------------------------

# A real SavedModel whose serving function reads a file of the portal's and writes it into var/ (tf.io ops), and
# whose initializer (run when TensorFlow loads it) plants a second file: inspection must do neither.
PROBE_SAVEDMODEL = """
import sys

import tensorflow as tf

secret, plant, out = sys.argv[1:4]

class Probe(tf.Module):
    def __init__(self):
        super().__init__()
        self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            secret, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), -1)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        tf.io.write_file(plant, tf.io.read_file(secret))
        return {"y": x * tf.cast(self.table.size(), tf.float32)}

probe = Probe()
tf.saved_model.save(probe, out, signatures={"serving_default": probe.serve})
"""


@pytest.mark.frameworks("tensorflow")
def test_a_savedmodel_that_reads_and_writes_the_portals_files_is_only_parsed(
    alice: Person, tiny: Model, eager_tasks: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    secret = Path(settings.VAR_DIR) / "secret_key_of_this_test"
    secret.write_text("the secret\n")
    planted = Path(settings.VAR_DIR) / "planted_by_a_savedmodel"
    python = Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"
    (tmp_path / "build.py").write_text(PROBE_SAVEDMODEL)
    try:
        done = subprocess.run([str(python), str(tmp_path / "build.py"), str(secret), str(planted), str(tmp_path / "m")],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert done.returncode == 0, done.stderr[-3000:]
        assert not planted.exists()  # saving traced the function, it did not run it
        files = {f"m/{p.relative_to(tmp_path / 'm')}": p.read_bytes() for p in (tmp_path / "m").rglob("*")
                 if p.is_file()}

        def no_process(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"inspection started a process: {args}")

        monkeypatch.setattr(subprocess, "Popen", no_process)
        assert upload(alice, zip_bytes(files)).status_code == 201
        version = ModelVersion.objects.get()
        assert version.status == "ready", version.error
        assert version.signature == {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                                     "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}]}
        # Parsed, never loaded: no TensorFlow in this process, no process started, nothing run.
        assert "tensorflow" not in sys.modules
        assert not planted.exists()
    finally:
        secret.unlink()
        planted.unlink(missing_ok=True)
