"""What the portal reads from artifacts without running them: ONNX signatures, python model archives, TorchScript."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelport.core.formats.onnx_inspect import (
    InspectionError,
    inspect_onnx,
    validate_declared_signature,
)
from modelport.core.formats.python import inspect_python_archive
from modelport.core.formats.torchscript import inspect_torchscript_archive
from modelport.core.signature import Signature, Tensor, parse_signature
from models_registry.samples import DIGITS_SIGNATURE, build_digits_onnx


def matmul_model(
    x_dims: list[int | str | None], y_dims: list[int | str | None], elem_type: int = TensorProto.FLOAT
) -> onnx.ModelProto:
    """y = x @ W with W 4x3 (x's last dimension must be 4)."""
    weights = numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", elem_type, x_dims)],
        [helper.make_tensor_value_info("y", elem_type, y_dims)],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def saved(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_it_reads_the_digits_sample_signature(tmp_path: Path) -> None:
    result = inspect_onnx(saved(build_digits_onnx(), tmp_path / "digits.onnx"))
    assert result.signature == DIGITS_SIGNATURE
    assert result.has_batch_dim
    assert result.max_batch_size_hint == 0  # the model states no limit: the caller picks its default
    assert result.problems == []


def test_named_missing_and_zero_dimensions_are_dynamic(tmp_path: Path) -> None:
    result = inspect_onnx(saved(matmul_model(["batch", 4], [None, 3]), tmp_path / "m.onnx"))
    assert result.signature.inputs == (Tensor("x", "FP32", (-1, 4)),)
    assert result.signature.outputs == (Tensor("y", "FP32", (-1, 3)),)
    assert result.has_batch_dim

    model = matmul_model(["batch", "seq", 4], ["batch", "seq", 3])
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 0  # some exporters write 0 for "unknown"
    assert inspect_onnx(saved(model, tmp_path / "m2.onnx")).signature.inputs[0].dims == (-1, -1, 4)


def test_a_fixed_first_dimension_is_not_a_batch_dimension(tmp_path: Path) -> None:
    result = inspect_onnx(saved(matmul_model([1, 4], [1, 3]), tmp_path / "m.onnx"))
    assert result.signature.inputs[0].dims == (1, 4)
    assert not result.has_batch_dim
    assert result.max_batch_size_hint == 0


def test_a_batch_limit_stated_in_the_metadata_is_the_hint(tmp_path: Path) -> None:
    model = matmul_model(["batch", 4], ["batch", 3])
    helper.set_model_props(model, {"max_batch_size": "16"})
    assert inspect_onnx(saved(model, tmp_path / "m.onnx")).max_batch_size_hint == 16


def test_initializers_listed_as_inputs_are_not_inputs(tmp_path: Path) -> None:
    model = matmul_model(["batch", 4], ["batch", 3])
    # IR < 4 exporters list every weight as a graph input too.
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]))
    result = inspect_onnx(saved(model, tmp_path / "m.onnx"))
    assert [t.name for t in result.signature.inputs] == ["x"]


def test_string_tensors_are_bytes(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = inspect_onnx(saved(model, tmp_path / "m.onnx"))
    assert result.signature.inputs == (Tensor("text", "BYTES", (-1,)),)
    assert result.problems == []


def test_tensors_triton_cannot_serve_are_problems(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("SequenceConstruct", ["x"], ["seq"])],
        "odd",
        [helper.make_tensor_value_info("x", TensorProto.COMPLEX64, ["batch", 2])],
        [
            helper.make_tensor_value_info("y", TensorProto.COMPLEX64, ["batch", 2]),
            helper.make_value_info("seq", helper.make_sequence_type_proto(helper.make_tensor_type_proto(14, None))),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = inspect_onnx(saved(model, tmp_path / "m.onnx"))
    assert "tensor 'x' has element type COMPLEX64, which Triton cannot serve" in result.problems
    assert any("'seq' is a sequence, not a tensor" in p for p in result.problems)


def test_checker_errors_are_reported_as_problems(tmp_path: Path) -> None:
    model = matmul_model(["batch", 4], ["batch", 3])
    model.graph.node[0].op_type = "NoSuchOperator"
    result = inspect_onnx(saved(model, tmp_path / "m.onnx"))
    assert len(result.problems) == 1
    assert result.problems[0].startswith("ONNX checker: ")
    assert "NoSuchOperator" in result.problems[0]


def with_custom_op(domain: str, in_subgraph: bool = False, op: str = "FancyMatMul") -> onnx.ModelProto:
    """matmul_model with its MatMul replaced by an operator of `domain` (optionally inside an If's branch)."""
    model = matmul_model(["batch", 4], ["batch", 3])
    custom = helper.make_node(op, ["x", "W"], ["y"], domain=domain)
    if in_subgraph:
        branch = helper.make_graph([custom], "branch", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                        ["batch", 3])])
        model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
        model.graph.node[0].CopyFrom(helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch))
    else:
        model.graph.node[0].CopyFrom(custom)
    model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


@pytest.mark.parametrize("in_subgraph", [False, True])
def test_a_custom_operator_domain_is_a_problem_that_names_the_domain(tmp_path: Path, in_subgraph: bool) -> None:
    result = inspect_onnx(saved(with_custom_op("com.example.secret_ops", in_subgraph), tmp_path / "m.onnx"))
    assert result.problems == [
        "the model uses custom operators of the domain(s) 'com.example.secret_ops' (operator 'FancyMatMul'), which "
        "onnxruntime does not implement and Triton would fail to load: export it with standard ONNX operators (or "
        "onnxruntime's com.microsoft ones)"]


def test_onnxruntime_contrib_operators_and_the_models_own_functions_are_not_custom(tmp_path: Path) -> None:
    contrib = inspect_onnx(saved(with_custom_op("com.microsoft", op="FusedMatMul"), tmp_path / "contrib.onnx"))
    assert contrib.problems == []
    model = with_custom_op("local.functions")
    model.functions.append(helper.make_function("local.functions", "FancyMatMul", ["a", "b"], ["c"],
                                                [helper.make_node("MatMul", ["a", "b"], ["c"])],
                                                [helper.make_opsetid("", 17)]))
    assert inspect_onnx(saved(model, tmp_path / "function.onnx")).problems == []


@pytest.mark.parametrize("in_subgraph", [False, True])
def test_a_com_microsoft_operator_onnxruntime_does_not_define_is_a_problem_naming_it_and_the_domain(
        tmp_path: Path, in_subgraph: bool) -> None:
    """onnx.checker knows no com.microsoft schema and passes any operator name there; onnxruntime refuses the model
    when Triton loads it (checked here: it cannot make a session of it)."""
    import onnxruntime as ort

    path = saved(with_custom_op("com.microsoft", in_subgraph), tmp_path / "m.onnx")
    assert inspect_onnx(path).problems == [
        "the model uses operator(s) 'FancyMatMul' of the domain 'com.microsoft', which onnxruntime does not define and "
        "Triton would fail to load: export it with standard ONNX operators or com.microsoft operators onnxruntime "
        "implements"]
    with pytest.raises(Exception, match="FancyMatMul"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_a_com_microsoft_operator_onnxruntime_implements_passes_and_runs(tmp_path: Path) -> None:
    import onnxruntime as ort

    path = saved(with_custom_op("com.microsoft", op="FusedMatMul"), tmp_path / "m.onnx")
    assert inspect_onnx(path).problems == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [y] = session.run(None, {"x": np.ones((2, 4), dtype=np.float32)})
    assert y.tolist() == [[4.0] * 3] * 2


def test_every_unknown_contrib_operator_is_counted_and_five_are_named(tmp_path: Path) -> None:
    model = matmul_model(["batch", 4], ["batch", 4])
    ops = [f"Made{i}" for i in range(7)]
    model.graph.node[0].CopyFrom(helper.make_node(ops[0], ["x", "W"], ["t0"], domain="com.microsoft"))
    model.graph.node.extend(helper.make_node(op, [f"t{i}"], [f"t{i + 1}" if i < 6 else "y"], domain="com.microsoft")
                            for i, op in enumerate(ops[1:]))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    [problem] = [p for p in inspect_onnx(saved(model, tmp_path / "m.onnx")).problems if "com.microsoft" in p]
    assert "'Made0', 'Made1', 'Made2', 'Made3', 'Made4' and 2 more of the domain 'com.microsoft'" in problem


@pytest.mark.parametrize("separator", ["\n", "\u2028", "\u0085"], ids=["newline", "line-separator", "next-line"])
@pytest.mark.parametrize("where", ["initializer", "node", "subgraph"])
def test_a_name_with_a_control_character_is_a_problem(tmp_path: Path, where: str, separator: str) -> None:
    # Each separator is one str.splitlines() breaks at: the name would start a line of the server's in the log.
    forged = f'w{separator}I1201 14:45:15.484194 1 model_lifecycle.cc:839] "successfully loaded \'d1-r1-digits\'"'
    model = matmul_model(["batch", 4], ["batch", 3])
    if where == "initializer":
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), forged))
    elif where == "node":
        model.graph.node[0].name = forged
    else:
        model = with_custom_op("", in_subgraph=True)  # standard operators, the MatMul inside an If's branch
        model.graph.node[0].attribute[0].g.node[0].name = forged
    problems = inspect_onnx(saved(model, tmp_path / "m.onnx")).problems
    assert [p for p in problems if "not printable" in p] == [
        f"the name {forged[:100]!r} holds a character that is not printable (a newline, a tab, an escape, a line "
        "separator): rename the model's "
        "tensors and nodes with printable characters"], problems


def test_printable_names_of_any_script_are_no_problem(tmp_path: Path) -> None:
    model = matmul_model(["batch", 4], ["batch", 3])
    model.graph.node[0].name = "Gewichte/Ähnlichkeit:0 (層)"
    assert not [p for p in inspect_onnx(saved(model, tmp_path / "m.onnx")).problems if "not printable" in p]


@pytest.mark.parametrize(
    "data",
    [b"", b"this is not a protobuf at all \xff\xff\xff", b"\x08\x08"],
    ids=["empty", "garbage", "no-graph"],
)
def test_a_file_that_is_not_onnx_raises_a_clear_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(InspectionError, match="the file is not a valid ONNX model"):
        inspect_onnx(path)


def test_a_truncated_onnx_file_raises_a_clear_error(tmp_path: Path) -> None:
    data = build_digits_onnx().SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InspectionError, match="the file is not a valid ONNX model"):
        inspect_onnx(path)


def _with_external_data(tmp_path: Path) -> Path:
    model = matmul_model(["batch", 4], ["batch", 3])
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    return path


def test_external_data_is_never_read(tmp_path: Path) -> None:
    path = _with_external_data(tmp_path)
    # 64 GiB (sparse, takes no disk): reading it would take minutes and all the memory there is.
    with open(tmp_path / "weights.bin", "r+b") as fh:
        fh.truncate(64 * 1024**3)
    result = inspect_onnx(path)
    assert result.signature.inputs == (Tensor("x", "FP32", (-1, 4)),)
    assert result.problems == []


def test_missing_external_data_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = _with_external_data(tmp_path)
    (tmp_path / "weights.bin").unlink()
    result = inspect_onnx(path)
    assert result.signature.outputs == (Tensor("y", "FP32", (-1, 3)),)
    assert len(result.problems) == 1
    assert "external data file 'weights.bin' (needed by 1 tensor(s)) is missing" in result.problems[0]


def test_external_data_outside_the_model_folder_is_a_problem(tmp_path: Path) -> None:
    model = onnx.load(str(_with_external_data(tmp_path)), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../etc/passwd"
    result = inspect_onnx(saved(model, tmp_path / "evil.onnx"))
    assert result.problems == [
        "external data location '../../etc/passwd' (needed by 1 tensor(s)) is not a file next to the model"
    ]


# --- declared signatures ---------------------------------------------------------------------------------------


def sig(inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]]) -> Signature:
    return parse_signature(
        {
            "inputs": [{"name": n, "datatype": t, "dims": d} for n, t, d in inputs],
            "outputs": [{"name": n, "datatype": t, "dims": d} for n, t, d in outputs],
        }
    )


def test_a_declared_signature_that_fits_the_model_has_no_problems() -> None:
    assert validate_declared_signature(DIGITS_SIGNATURE, DIGITS_SIGNATURE) == []
    # A subset of the outputs, and a dynamic dimension pinned to a size, both fit.
    declared = sig([("input", "FP32", [-1, 64])], [("probabilities", "TYPE_FP32", [8, 10])])
    assert validate_declared_signature(declared, DIGITS_SIGNATURE) == []


def test_a_declared_signature_that_contradicts_the_model_is_explained() -> None:
    declared = sig(
        [("input", "FP64", [-1, 32])],
        [("label", "INT64", [-1, 1]), ("scores", "FP32", [-1, 10])],
    )
    assert validate_declared_signature(declared, DIGITS_SIGNATURE) == [
        "input 'input' is declared FP64 but the model has FP32",
        "input 'input' is declared with dims [-1, 32] but the model has [-1, 64]",
        "output 'label' is declared with dims [-1, 1] but the model has [-1]",
        "declared output 'scores' is not in the model (its outputs: 'label', 'probabilities')",
    ]


def test_every_model_input_must_be_declared() -> None:
    artifact = sig([("a", "FP32", [-1]), ("b", "FP32", [-1])], [("y", "FP32", [-1])])
    declared = sig([("a", "FP32", [-1])], [("y", "FP32", [-1])])
    assert validate_declared_signature(declared, artifact) == ["model input 'b' is missing from the declared signature"]


# --- python models ---------------------------------------------------------------------------------------------

MODEL_PY = b"""
import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.scale = 2.0

    def execute(self, requests):
        return []
"""


def zip_of(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def test_a_python_model_archive_is_described(tmp_path: Path) -> None:
    archive = zip_of(
        tmp_path / "m.zip",
        {
            "my_model/model.py": MODEL_PY,
            "my_model/labels.txt": b"cat\ndog\n",
            "my_model/requirements.txt": b"# pinned\nnumpy>=1.26\nscikit-learn==1.9.1  # for the scaler\n\n",
        },
    )
    info = inspect_python_archive(archive)
    assert info.root == "my_model"
    assert info.files == ["labels.txt", "model.py", "requirements.txt"]
    assert info.has_requirements
    assert info.requirements == ["numpy>=1.26", "scikit-learn==1.9.1"]


def test_model_py_is_parsed_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = MODEL_PY + f"\nopen({str(marker)!r}, 'w').write('ran')\n".encode()
    info = inspect_python_archive(zip_of(tmp_path / "m.zip", {"model.py": source}))
    assert info.files == ["model.py"]
    assert not info.has_requirements
    assert not marker.exists()


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"main.py": MODEL_PY}, "no model.py"),
        ({"a/model.py": MODEL_PY, "b/other.py": b""}, "no model.py"),
        ({"model.py": b"class TritonPythonModel(:\n"}, "syntax error at line 1"),
        ({"model.py": b"class Model:\n    def execute(self, r):\n        return []\n"}, "does not define class"),
        ({"model.py": b"def f():\n    class TritonPythonModel:\n        pass\n"}, "does not define class"),
        ({"model.py": b"class TritonPythonModel:\n    pass\n"}, "has no execute"),
        ({"model.py": MODEL_PY, "requirements.txt": b"--index-url http://evil/\nnumpy\n"}, "line 1"),
        ({"model.py": MODEL_PY, "requirements.txt": b"numpy\ngit+https://evil/x.git\n"}, "line 2"),
        ({"model.py": MODEL_PY, "requirements.txt": b"numpy\nsetuptools>=99\n"},
         r"line 2 \('setuptools>=99'\) is refused: 'setuptools' is a packaging tool"),
    ],
    ids=["no-model-py", "two-folders", "syntax", "no-class", "nested-class", "no-execute", "option", "url",
         "packaging-tool"],
)
def test_an_unusable_python_model_is_explained(tmp_path: Path, entries: dict[str, bytes], message: str) -> None:
    with pytest.raises(InspectionError, match=message):
        inspect_python_archive(zip_of(tmp_path / "m.zip", entries))


def test_execute_may_come_from_a_base_class(tmp_path: Path) -> None:
    source = b"from base import Base\n\n\nclass TritonPythonModel(Base):\n    pass\n"
    info = inspect_python_archive(zip_of(tmp_path / "m.zip", {"model.py": source, "base.py": b""}))
    assert info.files == ["base.py", "model.py"]


def test_an_unsafe_python_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InspectionError, match="outside the archive"):
        inspect_python_archive(zip_of(tmp_path / "m.zip", {"model.py": MODEL_PY, "../x.py": b""}))


# --- TorchScript -----------------------------------------------------------------------------------------------


def test_a_torchscript_archive_passes_the_structural_check(tmp_path: Path) -> None:
    archive = zip_of(
        tmp_path / "model.pt",
        {
            "model/data.pkl": b"\x80\x02}q\x00.",
            "model/constants.pkl": b"\x80\x02).",
            "model/code/__torch__/model.py": b"",
            "model/version": b"3\n",
        },
    )
    info = inspect_torchscript_archive(archive)
    assert info.root == "model"
    assert info.version == 3
    assert "data.pkl" in info.files


def test_a_torch_save_checkpoint_is_explained(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "w.pt", {"archive/data.pkl": b"\x80\x02}.", "archive/data/0": bytes(8)})
    with pytest.raises(InspectionError, match="torch.jit.script or torch.jit.trace"):
        inspect_torchscript_archive(archive)


def test_a_damaged_torchscript_archive_is_refused(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "m.pt", {"m/data.pkl": b"not a pickle", "m/constants.pkl": b"\x80\x02)."})
    with pytest.raises(InspectionError, match="not a pickle"):
        inspect_torchscript_archive(archive)
    not_zip = tmp_path / "m2.pt"
    not_zip.write_bytes(b"\x80\x02}.")
    with pytest.raises(InspectionError, match="not a zip"):
        inspect_torchscript_archive(not_zip)


def test_an_onnx_upload_with_a_custom_operator_domain_is_invalid_and_names_it(
    alice: Any, eager_tasks: Any, tmp_path: Path
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry.models import Model, ModelVersion

    Model.objects.create(team=alice.team, name="fancy", created_by=alice.user)
    data = saved(with_custom_op("com.example.secret_ops"), tmp_path / "fancy.onnx").read_bytes()
    response = alice.client().post("/api/v1/models/fancy/versions/",
                                   {"file": SimpleUploadedFile("fancy.onnx", data)}, format="multipart")
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get(model__name="fancy")
    assert version.status == "invalid"
    assert "'com.example.secret_ops' (operator 'FancyMatMul')" in version.error
    # The model is what was refused: the error does not name a field the upload did not send (example_request).
    assert version.error.startswith("onnx.checker found problems: "), version.error


def test_an_onnx_upload_with_an_unknown_com_microsoft_operator_is_invalid_and_names_it(
    alice: Any, eager_tasks: Any, tmp_path: Path
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry.models import Model, ModelVersion

    Model.objects.create(team=alice.team, name="fancy", created_by=alice.user)
    data = saved(with_custom_op("com.microsoft"), tmp_path / "fancy.onnx").read_bytes()
    response = alice.client().post("/api/v1/models/fancy/versions/",
                                   {"file": SimpleUploadedFile("fancy.onnx", data)}, format="multipart")
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get(model__name="fancy")
    assert version.status == "invalid"
    assert "'FancyMatMul' of the domain 'com.microsoft'" in version.error
