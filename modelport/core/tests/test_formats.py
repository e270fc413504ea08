"""Formats are recognised from content, and a declaration the content contradicts is refused."""

from __future__ import annotations

import io
import json
import random
import struct
import tarfile
from pathlib import Path

import onnx
import pytest

from modelport.core import formats
from modelport.core.archives import ArchiveError
from modelport.core.formats import FormatError, check_declared_format, detect_format
from models_registry.samples import build_resnet_onnx
from models_registry.tests.format_artifacts import TRITON_MODEL_PY, torchscript_entries, zip_of
from models_registry.tests.savedmodels import varint


def _noise(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def tar_gz_of(path: Path, entries: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_an_onnx_model_is_recognised(tmp_path: Path) -> None:
    model, _ = build_resnet_onnx()
    path = write(tmp_path / "upload.bin", model.SerializeToString())
    assert detect_format(path) == "onnx"


def test_an_onnx_model_with_its_fields_in_another_order_is_recognised(tmp_path: Path) -> None:
    model, _ = build_resnet_onnx()
    # Protobuf allows fields in any order: graph (7) first, then ir_version (1), then opset_import (8).
    graph = model.graph.SerializeToString()
    opset_17 = b"\x0a\x00\x10\x11"  # {domain: "", version: 17}
    data = b"\x3a" + varint(len(graph)) + graph + b"\x08\x08" + b"\x42" + varint(len(opset_17)) + opset_17
    path = write(tmp_path / "upload.bin", data)
    assert onnx.load_from_string(data).graph.name == "resnet"  # what onnx itself makes of it
    assert detect_format(path) == "onnx"




@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world, this is just text\n",
        _noise(4096),
        b"\x08\x08",  # an ir_version and nothing else: no graph
        b"\x08\x08\x3a\xff\xff\xff\x7f",  # a graph longer than the file
    ],
    ids=["empty", "text", "random", "no-graph", "truncated"],
)
def test_other_bytes_are_not_onnx(tmp_path: Path, data: bytes) -> None:
    assert detect_format(write(tmp_path / "model.onnx", data)) is None


def test_the_file_name_does_not_decide_the_format(tmp_path: Path) -> None:
    model, _ = build_resnet_onnx()
    path = write(tmp_path / "upload", model.SerializeToString())
    assert detect_format(path, "model.plan") == "onnx"
    assert detect_format(write(tmp_path / "x", b"hello"), "model.onnx") is None


def test_a_torchscript_archive_is_recognised(tmp_path: Path) -> None:
    assert detect_format(zip_of(tmp_path / "model.pt", torchscript_entries())) == "torchscript"
    only_code = {k: v for k, v in torchscript_entries("traced").items() if "constants" not in k}
    assert detect_format(zip_of(tmp_path / "traced.pt", only_code)) == "torchscript"


def test_a_torch_save_checkpoint_is_not_torchscript(tmp_path: Path) -> None:
    checkpoint = {"archive/data.pkl": b"\x80\x02}q\x00.", "archive/data/0": bytes(64), "archive/version": b"3\n"}
    detected = detect_format(zip_of(tmp_path / "weights.pt", checkpoint))
    assert detected is None
    with pytest.raises(
        FormatError, match="declared format 'torchscript' but the file does not look like a TorchScript"
    ):
        check_declared_format("torchscript", detected)


def test_a_savedmodel_is_recognised_at_the_top_or_in_one_folder(tmp_path: Path) -> None:
    top = {"saved_model.pb": b"pb", "variables/variables.index": b"i", "variables/variables.data-00000-of-00001": b"d"}
    assert detect_format(zip_of(tmp_path / "a.zip", top)) == "tensorflow_savedmodel"
    folder = {f"my_model/{name}": data for name, data in top.items()}
    assert detect_format(tar_gz_of(tmp_path / "b.tar.gz", folder)) == "tensorflow_savedmodel"
    assert detect_format(zip_of(tmp_path / "c.zip", {"m/saved_model.pbtxt": b"", "__MACOSX/._m": b""})) == (
        "tensorflow_savedmodel"
    )
    deep = {f"a/b/{name}": data for name, data in top.items()}
    assert detect_format(zip_of(tmp_path / "d.zip", deep)) is None


@pytest.mark.parametrize("tag", [b"ptrt", b"ftrt"])
def test_a_tensorrt_plan_is_recognised_by_its_engine_tag(tmp_path: Path, tag: bytes) -> None:
    engine = tag + struct.pack("<IIQ", 0xEF, 0, 4096) + _noise(4096)
    assert detect_format(write(tmp_path / "model.plan", engine)) == "tensorrt_plan"


def test_a_tensorrt_plan_behind_a_metadata_header_is_recognised(tmp_path: Path) -> None:
    """Ultralytics writes a uint32 length and JSON metadata before the engine."""
    metadata = json.dumps({"imgsz": [640, 640], "batch": 1}).encode()
    engine = b"ftrt" + struct.pack("<IIQ", 0xEF, 0, 4096) + _noise(4096)
    path = write(tmp_path / "yolo.engine", struct.pack("<I", len(metadata)) + metadata + engine)
    assert detect_format(path) == "tensorrt_plan"


def test_a_python_model_is_recognised(tmp_path: Path) -> None:
    assert detect_format(zip_of(tmp_path / "a.zip", {"model.py": TRITON_MODEL_PY, "utils.py": b""})) == "python"
    nested = {"my_model/model.py": TRITON_MODEL_PY, "my_model/requirements.txt": b"numpy\n"}
    assert detect_format(tar_gz_of(tmp_path / "b.tar.gz", nested)) == "python"


def test_a_model_py_without_triton_python_model_is_not_a_python_model(tmp_path: Path) -> None:
    assert detect_format(zip_of(tmp_path / "a.zip", {"model.py": b"class Model:\n    pass\n"})) is None


def test_a_tnn_pair_is_recognised(tmp_path: Path) -> None:
    pair = {"net.tnnproto": b"proto", "net.tnnmodel": b"weights"}
    assert detect_format(zip_of(tmp_path / "a.zip", pair)) == "tnn"
    two_protos = {**pair, "other.tnnproto": b"proto"}
    assert detect_format(zip_of(tmp_path / "b.zip", two_protos)) is None


def test_an_unsafe_archive_is_refused_while_detecting(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="outside the archive"):
        detect_format(zip_of(tmp_path / "a.zip", {"model.py": TRITON_MODEL_PY, "../evil.py": b""}))


def test_a_declared_format_the_content_contradicts_is_refused() -> None:
    with pytest.raises(FormatError) as raised:
        check_declared_format("onnx", "torchscript")
    assert str(raised.value) == ("declared format 'onnx' but the file looks like a TorchScript archive: declare "
                                 "'torchscript' for it, or leave the format out (it is detected from the file)")
    with pytest.raises(FormatError, match="declared format 'tensorrt_plan' but the file looks like an ONNX model"):
        check_declared_format("tensorrt_plan", "onnx")


def test_a_matching_or_absent_declaration_is_accepted() -> None:
    check_declared_format("onnx", "onnx")
    check_declared_format("", "python")
    with pytest.raises(FormatError, match="could not be recognised: upload one of: an ONNX model .the .onnx file.; "):
        check_declared_format("", None)
    with pytest.raises(FormatError, match="unknown format"):
        check_declared_format("pickle", None)
    with pytest.raises(FormatError, match="pipeline"):
        check_declared_format("ensemble", "onnx")


def test_formats_needing_a_declared_signature() -> None:
    assert formats.formats_needing_signature() == {"torchscript", "tensorrt_plan", "python", "tnn"}


def test_format_names_match_the_model_choices() -> None:
    """models.Format is the registry as Django field choices: the same values, labels and order."""
    from models_registry.models import Format

    assert [(f.value, f.label) for f in Format] == [(f.name, f.label) for f in formats.REGISTRY.values()]
    assert set(formats.DESCRIPTIONS) == set(formats.REGISTRY)
