"""Rendering a Triton model repository: golden config.pbtxt files, layout per format, determinism.

Golden files live in tests/golden/ and are compared byte for byte. After an intended change of the rendered
configs, regenerate them with `MODELPORT_UPDATE_GOLDEN=1 pytest deployments/tests/test_render.py` and review the
diff like code.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deployments.render import (
    RenderError,
    render_config,
    render_repository,
    repository_digest,
)
from deployments.spec import DynamicBatching, EnsembleStep, InstanceGroup, RepositorySpec, ServedModel, Warmup
from deployments.tests.values import steps
from modelport.core.definitions import SavedModelDefinition
from modelport.core.formats.base import BACKENDS_DIR, BATCHING_MODULE
from modelport.core.signature import Signature, Tensor

# The files the local target must copy, named here rather than read from the format registry that renders them.
ONNX_WRAPPER = BACKENDS_DIR / "onnx_python_model.py"
TORCHSCRIPT_WRAPPER = BACKENDS_DIR / "torchscript_python_model.py"
SAVEDMODEL_WRAPPER = BACKENDS_DIR / "savedmodel_python_model.py"
TORCHSCRIPT_IO_MODULE = BACKENDS_DIR / "torchscript_io.py"

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("MODELPORT_UPDATE_GOLDEN") == "1"

BATCHED = Signature(
    inputs=(Tensor("pixels", "FP32", (-1, 3, 224, 224)), Tensor("scale", "FP32", (-1, 1))),
    outputs=(Tensor("logits", "FP32", (-1, 1000)),),
)
TEXT = Signature(inputs=(Tensor("text", "BYTES", (1,)),), outputs=(Tensor("label", "BYTES", (1,)),))
VECTOR = Signature(inputs=(Tensor("ids", "INT64", (-1,)),), outputs=(Tensor("scores", "FP32", (-1, 2)),))


def served(name: str, fmt: str, artifact: Path | None, **changes: object) -> ServedModel:
    base = ServedModel(
        name=name,
        version=3,
        format=fmt,
        signature=BATCHED,
        max_batch_size=16,
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=2000),
        instance_group=InstanceGroup(count=1),
        artifact_path=artifact,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def golden_models(artifacts_dir: Path) -> dict[str, tuple[ServedModel, str]]:
    """Each golden file's model and target."""
    onnx = artifacts_dir / "model.onnx"
    return {
        "onnx_local_batched": (
            served(
                "resnet",
                "onnx",
                onnx,
                dynamic_batching=DynamicBatching(
                    max_queue_delay_microseconds=5000, preferred_batch_size=(4, 8), preserve_ordering=True
                ),
                instance_group=InstanceGroup(count=2),
                response_cache=True,
                warmup=Warmup(batch_size=4, count=2, data="random"),
            ),
            "local",
        ),
        "onnx_kubernetes": (served("resnet", "onnx", onnx), "kubernetes"),
        "torchscript_kubernetes_gpu": (
            served("resnet_pt", "torchscript", onnx, instance_group=InstanceGroup(count=2, kind="gpu", gpus=(0, 1))),
            "kubernetes",
        ),
        "savedmodel_kubernetes": (
            served("resnet_tf", "tensorflow_savedmodel", onnx,
                   definition=SavedModelDefinition(signature_def="serving_default")),
            "kubernetes",
        ),
        "torchscript_local": (served("resnet_pt", "torchscript", onnx, instance_group=InstanceGroup(count=2)), "local"),
        "savedmodel_local": (served("resnet_tf", "tensorflow_savedmodel", onnx,
                                    definition=SavedModelDefinition(signature_def="predict")), "local"),
        "tensorrt_plan_kubernetes": (
            served("resnet_trt", "tensorrt_plan", onnx, instance_group=InstanceGroup(kind="gpu")),
            "kubernetes",
        ),
        "tnn_kubernetes": (served("resnet_tnn", "tnn", onnx), "kubernetes"),
        "python_unbatched_local": (
            served(
                "tokenizer",
                "python",
                onnx,
                signature=TEXT,
                max_batch_size=0,
                dynamic_batching=None,
                warmup=Warmup(data="random"),
            ),
            "local",
        ),
        "vector_input_local": (served("ranker", "onnx", onnx, signature=VECTOR), "local"),
        "ensemble": (
            served(
                "pipeline",
                "ensemble",
                None,
                dynamic_batching=None,
                definition=steps((
                    EnsembleStep("preprocess", 1, {"raw": "pixels", "factor": "scale"}, {"out": "normalized"}),
                    EnsembleStep("resnet", -1, {"pixels": "normalized", "scale": "scale"}, {"logits": "logits"}),
                )),
            ),
            "local",
        ),
    }


@pytest.fixture
def artifacts_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"onnx bytes: the renderer copies, it does not parse")
    return folder


@pytest.mark.parametrize("golden_name", sorted(golden_models(Path("unused"))))
def test_rendered_configs_match_the_golden_files_byte_for_byte(golden_name: str, artifacts_dir: Path) -> None:
    m, target = golden_models(artifacts_dir)[golden_name]
    rendered = render_config(m, target, tnn_backend_name="tnn")  # type: ignore[arg-type]
    golden = GOLDEN / f"{golden_name}.pbtxt"
    if UPDATE_GOLDEN:
        golden.write_text(rendered, encoding="utf-8")
    assert rendered == golden.read_text(encoding="utf-8")


def test_batched_configs_drop_the_batch_dimension() -> None:
    config = text_format.Parse((GOLDEN / "onnx_kubernetes.pbtxt").read_text(), mc.ModelConfig())
    assert config.max_batch_size == 16
    assert [list(i.dims) for i in config.input] == [[3, 224, 224], [1]]
    assert list(config.output[0].dims) == [1000]


def test_a_batched_vector_input_gets_dims_one_and_an_empty_reshape() -> None:
    config = text_format.Parse((GOLDEN / "vector_input_local.pbtxt").read_text(), mc.ModelConfig())
    assert list(config.input[0].dims) == [1]
    assert config.input[0].HasField("reshape") and list(config.input[0].reshape.shape) == []


def test_unbatched_configs_keep_every_dimension() -> None:
    config = text_format.Parse((GOLDEN / "python_unbatched_local.pbtxt").read_text(), mc.ModelConfig())
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1]
    assert not config.HasField("dynamic_batching")


def test_the_local_target_serves_onnx_through_the_python_backend_and_kubernetes_natively() -> None:
    local = text_format.Parse((GOLDEN / "onnx_local_batched.pbtxt").read_text(), mc.ModelConfig())
    native = text_format.Parse((GOLDEN / "onnx_kubernetes.pbtxt").read_text(), mc.ModelConfig())
    assert (local.backend, local.platform) == ("python", "")
    assert (native.backend, native.platform) == ("onnxruntime", "")


def test_kubernetes_platforms_and_backends_per_format() -> None:
    def parsed(name: str) -> mc.ModelConfig:
        return text_format.Parse((GOLDEN / f"{name}.pbtxt").read_text(), mc.ModelConfig())

    assert parsed("torchscript_kubernetes_gpu").platform == "pytorch_libtorch"
    assert parsed("savedmodel_kubernetes").platform == "tensorflow_savedmodel"
    assert parsed("tensorrt_plan_kubernetes").platform == "tensorrt_plan"
    assert parsed("tnn_kubernetes").backend == "tnn"
    gpu_group = parsed("torchscript_kubernetes_gpu").instance_group[0]
    assert (gpu_group.kind, list(gpu_group.gpus)) == (mc.ModelInstanceGroup.KIND_GPU, [0, 1])


def test_the_tnn_backend_name_is_configurable(artifacts_dir: Path) -> None:
    m, _ = golden_models(artifacts_dir)["tnn_kubernetes"]
    assert 'backend: "tnn_custom"' in render_config(m, "kubernetes", tnn_backend_name="tnn_custom")


def test_a_shared_tritons_onnx_models_are_built_with_no_graph_optimization_so_no_constant_folding_at_load(
        artifacts_dir: Path) -> None:
    """onnxruntime_backend: level 2 is ORT_DISABLE_ALL, -1 only ORT_ENABLE_BASIC (constant folding included)."""
    m, _ = golden_models(artifacts_dir)["onnx_kubernetes"]
    shared = text_format.Parse(render_config(m, "kubernetes", fold_constants=False), mc.ModelConfig())
    assert shared.optimization.graph.level == 2
    own = text_format.Parse(render_config(m, "kubernetes"), mc.ModelConfig())
    assert not own.HasField("optimization")  # a dedicated Triton keeps onnxruntime's default optimizations
    torch, _ = golden_models(artifacts_dir)["torchscript_kubernetes_gpu"]
    assert "optimization" not in render_config(torch, "kubernetes", fold_constants=False)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _tar_gz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def full_spec(artifacts_dir: Path) -> RepositorySpec:
    """One model of every format, with real archives for the formats that arrive as archives."""
    savedmodel = _zip(
        artifacts_dir / "savedmodel.zip",
        {"export/saved_model.pb": b"pb", "export/variables/variables.index": b"idx", "export/fingerprint.pb": b"fp"},
    )
    python = _zip(
        artifacts_dir / "python.zip",
        {"model.py": b"class TritonPythonModel: ...\n", "helpers/text.py": b"X = 1\n", "requirements.txt": b"regex\n"},
    )
    tnn = _tar_gz(artifacts_dir / "tnn.tar.gz",
                  {"net/mobilenet.tnnproto": b"proto", "net/mobilenet.tnnmodel": b"weights"})
    plan = artifacts_dir / "model.plan"
    plan.write_bytes(b"plan")
    return RepositorySpec(
        models=(
            served("resnet", "onnx", artifacts_dir / "model.onnx"),
            served("resnet_pt", "torchscript", artifacts_dir / "model.onnx"),
            served("resnet_tf", "tensorflow_savedmodel", savedmodel),
            served("resnet_trt", "tensorrt_plan", plan),
            served("resnet_tnn", "tnn", tnn),
            served("tokenizer", "python", python, signature=TEXT, max_batch_size=0, dynamic_batching=None),
            served(
                "pipeline",
                "ensemble",
                None,
                dynamic_batching=None,
                definition=steps((
                    EnsembleStep("resnet", 3, {"pixels": "pixels", "scale": "scale"}, {"logits": "logits"}),
                )),
            ),
        )
    )


def test_the_kubernetes_repository_has_one_directory_per_model_with_its_version_and_files(
    full_spec: RepositorySpec, tmp_path: Path
) -> None:
    out = tmp_path / "repo"
    render_repository(full_spec, "kubernetes", out)
    files = {path for path, content in _tree(out).items() if content is not None}
    assert files == {
        "pipeline/config.pbtxt",
        "resnet/config.pbtxt",
        "resnet/3/model.onnx",
        "resnet_pt/config.pbtxt",
        "resnet_pt/3/model.pt",
        "resnet_tf/config.pbtxt",
        "resnet_tf/3/model.savedmodel/saved_model.pb",
        "resnet_tf/3/model.savedmodel/fingerprint.pb",
        "resnet_tf/3/model.savedmodel/variables/variables.index",
        "resnet_trt/config.pbtxt",
        "resnet_trt/3/model.plan",
        "resnet_tnn/config.pbtxt",
        "resnet_tnn/3/model.tnnproto",
        "resnet_tnn/3/model.tnnmodel",
        "tokenizer/config.pbtxt",
        "tokenizer/3/model.py",
        "tokenizer/3/helpers/text.py",
        "tokenizer/3/requirements.txt",
    }
    assert (out / "pipeline" / "3").is_dir() and not any((out / "pipeline" / "3").iterdir())
    # Only the repository itself: no staging or extraction leftovers beside or inside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "repo"]
    assert not any(p.name.startswith(".") for p in out.rglob("*"))


def test_the_local_repository_serves_onnx_with_the_generated_python_model(artifacts_dir: Path, tmp_path: Path) -> None:
    spec = RepositorySpec(models=(served("resnet", "onnx", artifacts_dir / "model.onnx"),))
    render_repository(spec, "local", tmp_path / "local")
    render_repository(spec, "kubernetes", tmp_path / "k8s")
    assert (tmp_path / "local/resnet/3/model.py").read_bytes() == ONNX_WRAPPER.read_bytes()
    assert (tmp_path / "local/resnet/3/triton_batching.py").read_bytes() == BATCHING_MODULE.read_bytes()
    assert (tmp_path / "local/resnet/3/model.onnx").read_bytes() == (artifacts_dir / "model.onnx").read_bytes()
    assert sorted(p.name for p in (tmp_path / "k8s/resnet/3").iterdir()) == ["model.onnx"]


def test_a_cluster_pools_repository_serves_cpu_models_through_the_generated_python_model(
        artifacts_dir: Path, tmp_path: Path) -> None:
    """In a pool's Triton each model runs in processes of its own (deployments/runtimes/kubernetes/pool_stub.py
    limits them): the local runtime's generated model, on the CPU; a GPU model keeps its native backend."""
    from deployments.spec import InstanceGroup

    cpu = served("resnet", "onnx", artifacts_dir / "model.onnx")
    gpu = served("resnet_gpu", "onnx", artifacts_dir / "model.onnx", instance_group=InstanceGroup(kind="gpu"))
    render_repository(RepositorySpec(models=(cpu, gpu)), "kubernetes", tmp_path / "pool", python_models=True,
                      fold_constants=False)
    assert (tmp_path / "pool/resnet/3/model.py").read_bytes() == ONNX_WRAPPER.read_bytes()
    assert (tmp_path / "pool/resnet/3/triton_batching.py").read_bytes() == BATCHING_MODULE.read_bytes()
    assert 'backend: "python"' in (tmp_path / "pool/resnet/config.pbtxt").read_text()
    assert sorted(p.name for p in (tmp_path / "pool/resnet_gpu/3").iterdir()) == ["model.onnx"]
    assert 'backend: "onnxruntime"' in (tmp_path / "pool/resnet_gpu/config.pbtxt").read_text()


def test_rendering_twice_gives_identical_trees(full_spec: RepositorySpec, tmp_path: Path) -> None:
    render_repository(full_spec, "kubernetes", tmp_path / "first")
    render_repository(full_spec, "kubernetes", tmp_path / "second")
    assert _tree(tmp_path / "first") == _tree(tmp_path / "second")
    assert repository_digest(tmp_path / "first") == repository_digest(tmp_path / "second")


def test_rendering_again_replaces_the_previous_repository(artifacts_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    render_repository(RepositorySpec(models=(served("old", "onnx", artifacts_dir / "model.onnx"),)), "local", out)
    render_repository(RepositorySpec(models=(served("new", "onnx", artifacts_dir / "model.onnx"),)), "local", out)
    assert sorted(p.name for p in out.iterdir()) == ["new"]


def test_a_changed_spec_changes_the_digest(artifacts_dir: Path, tmp_path: Path) -> None:
    m = served("resnet", "onnx", artifacts_dir / "model.onnx")
    render_repository(RepositorySpec(models=(m,)), "local", tmp_path / "a")
    render_repository(RepositorySpec(models=(dataclasses.replace(m, max_batch_size=8),)), "local", tmp_path / "b")
    assert repository_digest(tmp_path / "a") != repository_digest(tmp_path / "b")


def test_it_refuses_to_render_an_invalid_spec_with_field_errors(artifacts_dir: Path, tmp_path: Path) -> None:
    spec = RepositorySpec(models=(served("resnet_trt", "tensorrt_plan", artifacts_dir / "model.onnx"),))
    with pytest.raises(RenderError) as excinfo:
        render_repository(spec, "local", tmp_path / "repo")
    assert list(excinfo.value.errors) == ["resnet_trt.format"]
    assert not (tmp_path / "repo").exists()


def test_it_refuses_framework_formats_locally_without_the_framework(full_spec: RepositorySpec, tmp_path: Path) -> None:
    with pytest.raises(RenderError) as excinfo:
        render_repository(full_spec, "local", tmp_path / "repo", local_frameworks={"tensorflow"})
    assert "resnet_pt.format" in excinfo.value.errors and "resnet_tf.format" not in excinfo.value.errors
    assert "no PyTorch" in excinfo.value.errors["resnet_pt.format"][0]
    assert not (tmp_path / "repo").exists()


def test_the_local_repository_serves_each_framework_through_its_wrapper_and_the_shared_batching_module(
    full_spec: RepositorySpec, tmp_path: Path
) -> None:
    local = [m for m in full_spec.models if m.format in ("onnx", "torchscript", "tensorflow_savedmodel")]
    out = tmp_path / "repo"
    render_repository(RepositorySpec(models=tuple(local)), "local", out, local_frameworks={"torch", "tensorflow"})
    tree = _tree(out)
    assert {path for path, content in tree.items() if content is not None} == {
        "resnet/config.pbtxt",
        "resnet/3/model.onnx",
        "resnet/3/model.py",
        "resnet/3/triton_batching.py",
        "resnet_pt/config.pbtxt",
        "resnet_pt/3/model.pt",
        "resnet_pt/3/model.py",
        "resnet_pt/3/triton_batching.py",
        "resnet_pt/3/torchscript_io.py",
        "resnet_tf/config.pbtxt",
        "resnet_tf/3/model.savedmodel/saved_model.pb",
        "resnet_tf/3/model.savedmodel/fingerprint.pb",
        "resnet_tf/3/model.savedmodel/variables/variables.index",
        "resnet_tf/3/model.py",
        "resnet_tf/3/triton_batching.py",
    }
    wrappers = {"resnet": ONNX_WRAPPER, "resnet_pt": TORCHSCRIPT_WRAPPER, "resnet_tf": SAVEDMODEL_WRAPPER}
    for name, wrapper in wrappers.items():
        assert tree[f"{name}/3/model.py"] == wrapper.read_bytes()
        assert tree[f"{name}/3/triton_batching.py"] == BATCHING_MODULE.read_bytes()
        assert b'backend: "python"' in (tree[f"{name}/config.pbtxt"] or b"")
    assert tree["resnet_pt/3/torchscript_io.py"] == TORCHSCRIPT_IO_MODULE.read_bytes()


@pytest.mark.parametrize("wrapper", sorted(p.name for p in BACKENDS_DIR.glob("*.py")))
def test_the_generated_models_import_nothing_from_the_portal(wrapper: str) -> None:
    """They run in the runtime env (numpy<2, the frameworks), where the portal's packages are not installed."""
    import ast

    allowed = {"__future__", "argparse", "json", "os", "sys", "time", "pathlib", "typing", "numpy", "onnxruntime",
               "torch",
               "tensorflow", "triton_python_backend_utils", "triton_batching", "torchscript_io"}
    tree = ast.parse((BACKENDS_DIR / wrapper).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= allowed, imported - allowed


def test_it_rejects_an_archive_that_climbs_out_of_its_directory(artifacts_dir: Path, tmp_path: Path) -> None:
    evil = _zip(artifacts_dir / "evil.zip", {"model.py": b"", "../../escaped.py": b"boom"})
    spec = RepositorySpec(
        models=(served("tok", "python", evil, signature=TEXT, max_batch_size=0, dynamic_batching=None),)
    )
    with pytest.raises(RenderError) as excinfo:
        render_repository(spec, "kubernetes", tmp_path / "out" / "repo")
    assert "tok.artifact_path" in excinfo.value.errors
    assert not (tmp_path / "escaped.py").exists() and not (tmp_path / "out" / "escaped.py").exists()
    assert list((tmp_path / "out").iterdir()) == []  # the staging directory was cleaned up


def test_a_python_archive_without_model_py_is_refused(artifacts_dir: Path, tmp_path: Path) -> None:
    archive = _zip(artifacts_dir / "nomodel.zip", {"a/model.py": b"", "b/other.py": b""})
    spec = RepositorySpec(
        models=(served("tok", "python", archive, signature=TEXT, max_batch_size=0, dynamic_batching=None),)
    )
    with pytest.raises(RenderError, match="model.py"):
        render_repository(spec, "local", tmp_path / "repo")


def test_a_python_archive_of_a_single_folder_is_flattened(artifacts_dir: Path, tmp_path: Path) -> None:
    archive = _zip(artifacts_dir / "folder.zip", {"mymodel/model.py": b"code", "mymodel/util.py": b"util"})
    spec = RepositorySpec(
        models=(served("tok", "python", archive, signature=TEXT, max_batch_size=0, dynamic_batching=None),)
    )
    render_repository(spec, "local", tmp_path / "repo")
    assert sorted(p.name for p in (tmp_path / "repo/tok/3").iterdir()) == ["model.py", "util.py"]


def test_a_tnn_archive_needs_exactly_one_proto_and_one_model(artifacts_dir: Path, tmp_path: Path) -> None:
    archive = _tar_gz(artifacts_dir / "two.tar.gz", {"a.tnnproto": b"", "b.tnnproto": b"", "a.tnnmodel": b""})
    with pytest.raises(RenderError, match="one .tnnproto and one .tnnmodel, found 2 and 1"):
        render_repository(RepositorySpec(models=(served("t", "tnn", archive),)), "kubernetes", tmp_path / "repo")
