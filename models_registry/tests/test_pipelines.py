"""Pipelines (ensemble versions) are created by JSON and validated against their step versions: each invalid
definition is refused with a message naming the step and the tensor. Fast: real step versions through the upload
path (inspected in-process), no Triton."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.template.loader import render_to_string

from models_registry.models import Model, ModelVersion
from models_registry.pipelines import pipeline_graph
from models_registry.samples import (
    build_preprocess_zip,
    digits_pipeline_definition,
)
from models_registry.tests.pipeline_versions import (
    create_pipeline,
    digits_bytes,
    digits_steps,
    ready_version,
)
from tests.artifacts import python_model_zip
from tests.support.people import Person


@pytest.fixture
def definition() -> dict[str, Any]:
    return digits_pipeline_definition()


def refused(response: Any, field: str) -> str:
    """The message of a 400 for `field`, checked to be in the shared error shape."""
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert len(error["fields"][field]) >= 1
    assert error["fields"][field][0] in error["message"]
    return str(error["fields"][field][0])


# --- valid pipelines --------------------------------------------------------------------------------------------


def test_a_valid_pipeline_is_a_ready_version_at_once_with_its_signature_and_steps(
    alice: Person, pipeline_steps: dict[str, ModelVersion], definition: dict[str, Any]
) -> None:
    response = create_pipeline(alice, definition)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "ready" and body["format"] == "ensemble" and body["number"] == 1
    assert body["signature"] == {"inputs": definition["inputs"], "outputs": definition["outputs"]}
    assert body["definition"] == definition
    version = ModelVersion.objects.get(format="ensemble")
    assert version.max_batch_size == 64  # the smallest of the steps'
    assert version.blob_id is None and version.size == 0 and version.validated_at is not None
    assert set(version.step_versions.all()) == set(pipeline_steps.values())
    assert body["signature"]["inputs"] == [{"name": "image", "datatype": "BYTES", "dims": [-1, 1]}]


def test_a_step_without_a_version_gets_the_latest_ready_one_written_down(
    alice: Person, pipeline_steps: dict[str, ModelVersion], definition: dict[str, Any]
) -> None:
    ready_version(alice, "digits", digits_bytes(), "digits.onnx")  # version 2
    del definition["steps"][1]["version"]
    response = create_pipeline(alice, definition)
    assert response.status_code == 201, response.json()
    assert response.json()["definition"]["steps"][1]["version"] == 2


def test_the_pipeline_batches_no_more_than_its_smallest_step(alice: Person, definition: dict[str, Any]) -> None:
    digits_steps(alice, max_batch_size=16)
    assert create_pipeline(alice, definition).json()["max_batch_size"] == 16
    message = refused(create_pipeline(alice, definition, max_batch_size=32), "max_batch_size")
    assert message == "max_batch_size 32 is larger than that of step 2 (digits) (16)"
    assert create_pipeline(alice, definition, max_batch_size=8).json()["max_batch_size"] == 8


# --- invalid pipelines, one rule each ---------------------------------------------------------------------------


def test_it_refuses_a_step_input_fed_by_no_tensor(alice: Person, pipeline_steps: Any,
                                                  definition: dict[str, Any]) -> None:
    definition["steps"][1]["input_map"] = {"input": "pixels"}
    message = refused(create_pipeline(alice, definition), "definition.steps[1].input_map.input")
    assert message == ("step 2 (digits): input 'input' is mapped to tensor 'pixels', which is neither a pipeline "
                       "input nor an earlier step's output")
    assert not ModelVersion.objects.filter(format="ensemble").exists()


def test_it_refuses_a_step_input_left_unmapped(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    definition["steps"][1]["input_map"] = {}
    message = refused(create_pipeline(alice, definition), "definition.steps[1].input_map")
    assert "step 2 (digits): input_map must be a non-empty object" in message
    definition["steps"][0]["input_map"] = {"picture": "image"}
    definition["steps"][1]["input_map"] = {"input": "features"}
    message = refused(create_pipeline(alice, definition), "definition.steps[0].input_map")
    assert message == "step 1 (preprocess): 'preprocess' version 1 has no input 'picture' (its inputs: 'image')"
    response = create_pipeline(alice, definition)
    assert "step 1 (preprocess): input 'image' of 'preprocess' is not fed" in response.json()["error"]["message"]


def test_it_refuses_a_data_type_mismatch(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    # The classifier fed the encoded image directly.
    definition["steps"][1]["input_map"] = {"input": "image"}
    message = refused(create_pipeline(alice, definition), "definition.steps[1].input_map.input")
    assert message == "step 2 (digits): input 'input' is FP32 but pipeline input 'image' is BYTES"


def test_it_refuses_an_incompatible_shape(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    definition["inputs"] = [{"name": "features", "datatype": "FP32", "dims": [-1, 32]}]
    definition["steps"] = definition["steps"][1:]
    message = refused(create_pipeline(alice, definition), "definition.steps[0].input_map.input")
    assert message == ("step 1 (digits): input 'input' has shape [-1, 64] "
                       "but pipeline input 'features' has shape [-1, 32]")


def test_it_refuses_a_pipeline_output_no_step_produces(alice: Person, pipeline_steps: Any,
                                                       definition: dict[str, Any]) -> None:
    definition["outputs"].append({"name": "top", "datatype": "FP32", "dims": [-1, 1]})
    message = refused(create_pipeline(alice, definition), "definition.outputs[2]")
    assert message == "pipeline output 'top' is not produced by any step: map a step output to it"


def test_it_refuses_a_pipeline_output_declared_unlike_its_producer(alice: Person, pipeline_steps: Any,
                                                                   definition: dict[str, Any]) -> None:
    definition["outputs"][0]["datatype"] = "INT64"
    message = refused(create_pipeline(alice, definition), "definition.outputs[0]")
    assert message == ("pipeline output 'labels' is declared INT64 [-1, 3] but output 'labels' of step 3 "
                       "(postprocess) is BYTES [-1, 3]")


def test_it_refuses_cycles(alice: Person, pipeline_steps: Any) -> None:
    widen = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 10]}],
             "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 64]}]}
    ready_version(alice, "widen", python_model_zip(), "widen.zip", widen)
    definition = {
        "inputs": [{"name": "start", "datatype": "FP32", "dims": [-1, 64]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "dims": [-1, 10]}],
        "steps": [
            {"model": "digits", "version": 1, "input_map": {"input": "wide"},
             "output_map": {"probabilities": "probabilities"}},
            {"model": "widen", "version": 1, "input_map": {"x": "probabilities"}, "output_map": {"y": "wide"}},
        ],
    }
    message = refused(create_pipeline(alice, definition, name="loop"), "definition.steps")
    assert message == ("the steps form a cycle: step 1 (digits) -> step 2 (widen) -> step 1 (digits) "
                       "(each feeds the next through its outputs)")


def test_it_refuses_steps_listed_before_the_step_that_feeds_them(alice: Person, pipeline_steps: Any,
                                                                 definition: dict[str, Any]) -> None:
    definition["steps"] = [definition["steps"][1], definition["steps"][0], definition["steps"][2]]
    message = refused(create_pipeline(alice, definition), "definition.steps[0].input_map.input")
    assert message == ("step 1 (digits): input 'input' is fed by tensor 'features' (from step 2 (preprocess)), "
                       "which comes later: list the steps in the order they run")


def test_it_refuses_a_tensor_written_twice_or_over_a_pipeline_input(alice: Person, pipeline_steps: Any,
                                                                    definition: dict[str, Any]) -> None:
    definition["steps"][1]["output_map"] = {"probabilities": "features"}
    message = refused(create_pipeline(alice, definition), "definition.steps[1].output_map")
    assert message == ("step 2 (digits): output 'probabilities' writes tensor 'features', which step 1 (preprocess) "
                       "writes already")
    definition["steps"][1]["output_map"] = {"probabilities": "image"}
    message = refused(create_pipeline(alice, definition), "definition.steps[1].output_map")
    assert message == "step 2 (digits): output 'probabilities' is mapped to 'image', which is a pipeline input"


def test_it_refuses_versions_that_do_not_exist(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    definition["steps"][1]["version"] = 7
    assert refused(create_pipeline(alice, definition), "definition.steps[1].version") == (
        "step 2 (digits): model 'digits' has no version 7")
    definition["steps"][1] = {**definition["steps"][1], "model": "ghost"}
    assert refused(create_pipeline(alice, definition), "definition.steps[1].version") == (
        "step 2 (ghost): no model named 'ghost' in your team")


def test_it_refuses_versions_that_are_not_ready(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    digits = pipeline_steps["digits"]
    ModelVersion.objects.create(model=digits.model, number=2, format="onnx", status="invalid", error="bad bytes")
    definition["steps"][1]["version"] = 2
    message = refused(create_pipeline(alice, definition), "definition.steps[1].version")
    assert message == "step 2 (digits): version 2 of 'digits' is invalid, not ready: bad bytes"


def test_it_refuses_another_teams_versions(alice: Person, charlie: Person, definition: dict[str, Any]) -> None:
    digits_steps(charlie)
    message = refused(create_pipeline(alice, definition), "definition.steps[0].version")
    assert message == "step 1 (preprocess): no model named 'preprocess' in your team"


def test_it_refuses_mixed_batching(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    unbatched = {"inputs": [{"name": "image", "datatype": "BYTES", "dims": [1]}],
                 "outputs": [{"name": "input", "datatype": "FP32", "dims": [1, 64]}]}
    ready_version(alice, "preprocess", build_preprocess_zip(), "preprocess.zip", unbatched)  # version 2, no batching
    definition["steps"][0]["version"] = 2
    definition["inputs"][0]["dims"] = [1]
    message = refused(create_pipeline(alice, definition), "definition.steps")
    assert message == ("step 1 (preprocess) cannot batch (max_batch_size 0) while step 2 (digits), "
                       "step 3 (postprocess) can: all steps must batch, or none")


def test_it_refuses_a_pipeline_without_the_batch_dimension_when_its_steps_batch(
    alice: Person, pipeline_steps: Any, definition: dict[str, Any]
) -> None:
    definition["outputs"][1]["dims"] = [1, 3]
    # [1, 3] is compatible with the step's [-1, 3] but the pipeline would not batch.
    message = refused(create_pipeline(alice, definition), "definition")
    assert message == ("the steps batch, so every pipeline input and output needs the batch dimension -1 first; "
                       "'scores' has not")


def test_it_refuses_a_badly_formed_definition(alice: Person, pipeline_steps: Any, definition: dict[str, Any]) -> None:
    assert refused(create_pipeline(alice, {**definition, "steps": []}), "definition.steps") == (
        "a pipeline needs a non-empty list of steps")
    assert "unknown keys ['extra']" in refused(create_pipeline(alice, {**definition, "extra": 1}), "definition")
    bad = copy.deepcopy(definition)
    bad["inputs"][0]["datatype"] = "STRING"
    assert refused(create_pipeline(alice, bad),
                   "definition").startswith("definition.inputs[0] (image): unknown datatype")
    response = alice.client().post("/api/v1/models/digits-pipeline/versions/",
                                   {"format": "ensemble", "definition": definition,
                                    "signature": definition}, format="json")
    assert "no artifact, no signature" in response.json()["error"]["message"]


def test_a_pipeline_cannot_call_itself_or_another_pipeline(alice: Person, pipeline_steps: Any,
                                                           definition: dict[str, Any]) -> None:
    assert create_pipeline(alice, definition).status_code == 201
    nested = copy.deepcopy(definition)
    nested["steps"] = [{"model": "digits-pipeline", "version": 1, "input_map": {"image": "image"},
                        "output_map": {"labels": "labels", "scores": "scores"}}]
    message = refused(create_pipeline(alice, nested, name="outer"), "definition.steps[0].model")
    assert message.startswith("step 1 (digits-pipeline): version 1 of 'digits-pipeline' is itself a pipeline")
    message = refused(create_pipeline(alice, nested), "definition.steps[0].model")
    assert message == "step 1 (digits-pipeline): a pipeline cannot call its own model 'digits-pipeline'"


def test_charlie_cannot_create_a_pipeline_in_alices_model(alice: Person, charlie: Person, pipeline_steps: Any,
                                                          definition: dict[str, Any]) -> None:
    Model.objects.create(team=alice.team, name="digits-pipeline")
    response = charlie.client().post("/api/v1/models/digits-pipeline/versions/",
                                     {"format": "ensemble", "definition": definition}, format="json")
    assert response.status_code == 404


# --- step versions are kept ------------------------------------------------------------------------------------


def test_a_step_version_cannot_be_deleted_while_a_pipeline_uses_it(
    alice: Person, pipeline_steps: dict[str, ModelVersion], definition: dict[str, Any]
) -> None:
    assert create_pipeline(alice, definition).status_code == 201
    client = alice.client()
    response = client.delete("/api/v1/models/digits/versions/1/")
    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        "Version 1 of 'digits' is a step of pipeline version(s) digits-pipeline:1: delete those first.")
    assert client.delete("/api/v1/models/postprocess/").status_code == 409
    assert ModelVersion.objects.filter(pk=pipeline_steps["digits"].pk).exists()
    assert client.delete("/api/v1/models/digits-pipeline/versions/1/").status_code == 204
    assert client.delete("/api/v1/models/digits/versions/1/").status_code == 204
    assert client.delete("/api/v1/models/postprocess/").status_code == 204


# --- the diagram -----------------------------------------------------------------------------------------------


def test_pipeline_graph_has_the_inputs_steps_outputs_and_tensors_between_them() -> None:
    graph = pipeline_graph(digits_pipeline_definition())
    assert [(n["id"], n["label"], n["column"]) for n in graph["nodes"]] == [
        ("input:image", "image", 0), ("step:0", "preprocess", 1), ("step:1", "digits", 2),
        ("step:2", "postprocess", 3), ("output:labels", "labels", 4), ("output:scores", "scores", 4)]
    assert [(e["source"], e["target"], e["tensor"], e["from"], e["to"]) for e in graph["edges"]] == [
        ("input:image", "step:0", "image", "image", "image"),
        ("step:0", "step:1", "features", "input", "input"),
        ("step:1", "step:2", "probabilities", "probabilities", "probabilities"),
        ("step:2", "output:labels", "labels", "labels", "labels"),
        ("step:2", "output:scores", "scores", "scores", "scores"),
    ]
    assert all(0 < e["x1"] < e["x2"] <= graph["width"] for e in graph["edges"])
    assert all(n["y"] + n["height"] <= graph["height"] for n in graph["nodes"])


def test_the_diagram_partial_draws_every_step_and_tensor_as_svg() -> None:
    html = render_to_string("web/_pipeline_diagram.html", {"graph": pipeline_graph(digits_pipeline_definition())})
    assert html.count("<svg") == 1 and "<script" not in html
    for text in ("preprocess", "digits", "postprocess", "in: image", "out: labels", ">features<", ">probabilities<"):
        assert text in html, text
    assert json.dumps(digits_pipeline_definition())  # the definition itself stays JSON


def test_a_pipeline_can_create_its_model_and_a_refused_one_leaves_none(
    alice: Person, pipeline_steps: dict[str, ModelVersion], definition: dict[str, Any]
) -> None:
    client = alice.client()
    broken = {**definition, "outputs": [{"name": "nowhere", "datatype": "FP32", "dims": [-1, 1]}]}
    response = client.post("/api/v1/models/digits-pipeline/versions/",
                           {"format": "ensemble", "definition": broken, "create_model": True}, format="json")
    assert response.status_code == 400
    assert not Model.objects.filter(name="digits-pipeline").exists()
    response = client.post("/api/v1/models/digits-pipeline/versions/",
                           {"format": "ensemble", "definition": definition, "create_model": True}, format="json")
    assert response.status_code == 201, response.json()
    assert Model.objects.get(name="digits-pipeline").versions.get().format == "ensemble"
