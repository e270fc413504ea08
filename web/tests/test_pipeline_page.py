"""A pipeline created from the upload page: the definition (pasted, or a .json file) is drawn before anything is
saved, its problems sit under the step and tensor they concern, and saving makes a version as the API does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.models import Model, ModelVersion
from models_registry.pipelines import pipeline_graph
from models_registry.samples import digits_pipeline_definition
from tests.support.people import Person, signed_in

URL = "/models/upload/pipeline/"
IO = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
      "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}


def post(person: Person, definition: Any, name: str = "digits-pipeline", **extra: str) -> Any:
    text = definition if isinstance(definition, str) else json.dumps(definition)
    return signed_in(person).post(URL, {"name": name, "definition": text, **extra})


def test_the_upload_page_offers_pipelines_and_says_what_the_local_runtime_serves(alice: Person,
                                                                                bare_runtime_env: Any) -> None:
    content = signed_in(alice).get("/models/upload/").content.decode()
    assert 'id="pipeline-paste"' in content and 'id="pipeline-mode"' in content
    assert 'data-pipeline-url="/models/upload/pipeline/"' in content
    assert "local runtime serves ONNX, Python models and pipelines" in content
    assert 'data-not-local="torchscript,tensorflow_savedmodel,tensorrt_plan,tnn"' in content
    assert 'id="signature-import"' in content and "import a <code>.signature.json</code> file" in content


def test_a_valid_definition_is_drawn_and_nothing_is_saved(alice: Person, pipeline_steps: Any) -> None:
    response = post(alice, digits_pipeline_definition())
    assert response.status_code == 200
    content = response.content.decode()
    assert 'data-ok="yes"' in content and 'id="pipeline-valid"' in content
    assert content.count("<svg") == 2  # across, and top to bottom for phones
    for text in ("preprocess", "digits", "postprocess", ">features<", "in: image", "out: labels"):
        assert text in content, text
    assert not Model.objects.filter(name="digits-pipeline").exists()


def test_saving_creates_the_model_and_its_pipeline_version(alice: Person, pipeline_steps: Any) -> None:
    response = post(alice, digits_pipeline_definition(), save="1")
    assert response.status_code == 201
    version = ModelVersion.objects.get(model__name="digits-pipeline")
    assert version.format == "ensemble" and version.status == "ready" and version.number == 1
    assert version.definition == digits_pipeline_definition() and version.created_by == alice.user
    content = response.content.decode()
    assert 'data-created-version="1"' in content
    assert 'data-deploy-url="/deployments/new/?model=digits-pipeline&amp;version=1"' in content
    assert post(alice, digits_pipeline_definition(), save="1").status_code == 201  # the next version of it
    assert ModelVersion.objects.filter(model__name="digits-pipeline").count() == 2


def test_problems_sit_under_the_step_and_tensor_they_concern(alice: Person, pipeline_steps: Any) -> None:
    definition = digits_pipeline_definition()
    definition["steps"][1]["input_map"] = {"input": "no-such-tensor"}
    definition["steps"][2]["model"] = "missing"
    response = post(alice, definition, save="1")
    assert response.status_code == 400
    assert not Model.objects.filter(name="digits-pipeline").exists()  # nothing saved
    content = response.content.decode()
    assert 'data-ok="no"' in content
    problems = content[content.index('id="pipeline-problems"'):]
    step2 = problems[problems.index('data-where="Step 3 · missing"'):]
    assert "no model named &#x27;missing&#x27; in your team" in step2
    # The first problem stops validation at the steps' lookup; fix it and the tensor problem shows, drawn in red.
    definition["steps"][2]["model"] = "postprocess"
    content = post(alice, definition).content.decode()
    problems = content[content.index('id="pipeline-problems"'):]
    assert 'data-where="Step 2 · digits"' in problems
    assert "<strong>input input</strong>: step 2 (digits): input &#x27;input&#x27; is mapped to tensor " \
           "&#x27;no-such-tensor&#x27;" in problems
    assert 'class="pipeline-node pipeline-step has-error" data-step="1"' in content
    assert 'class="pipeline-node pipeline-step" data-step="0"' in content


@pytest.mark.parametrize(("definition", "message"), [
    ("{not json", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("x" * 300_000, "a pipeline definition is at most 262,144"),
    (json.dumps({**IO, "steps": "all of them"}), "a pipeline needs a non-empty list of steps"),
    (json.dumps({**IO, "steps": [{"model": {"$gt": ""}, "input_map": {"x": "x"}, "output_map": {"y": "y"}}]}),
     "the model&#x27;s name is required"),
    (json.dumps({**IO, "steps": [{"model": "m", "input_map": {"x": "x"}, "output_map": {"y": "y"}}] * 33}),
     "a pipeline has at most 32 steps"),
])
def test_hostile_or_broken_definitions_are_a_400_with_the_reason(alice: Person, definition: str, message: str) -> None:
    response = post(alice, definition, save="1")
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Model.objects.exists()


def test_a_bad_name_and_another_teams_steps_are_refused(alice: Person, charlie: Person, pipeline_steps: Any) -> None:
    response = post(alice, digits_pipeline_definition(), name="Digits Pipeline", save="1")
    assert response.status_code == 400 and "is not a valid name" in response.content.decode()
    # charlie's team has no "preprocess": alice's models do not exist for him.
    content = post(charlie, digits_pipeline_definition(), save="1").content.decode()
    assert "no model named &#x27;preprocess&#x27; in your team" in content
    assert not Model.objects.filter(team=charlie.team).exists()


def test_the_upload_form_without_javascript_recognises_a_definition(alice: Person, pipeline_steps: Any) -> None:
    client = signed_in(alice)
    upload = SimpleUploadedFile("digits-pipeline.json", json.dumps(digits_pipeline_definition()).encode())
    response = client.post("/models/upload/", {"name": "digits-pipeline", "file": upload})
    assert response.status_code == 302
    assert ModelVersion.objects.get(model__name="digits-pipeline").format == "ensemble"
    broken = digits_pipeline_definition()
    broken["steps"][0]["version"] = 9
    upload = SimpleUploadedFile("p.json", json.dumps(broken).encode())
    content = client.post("/models/upload/", {"name": "other-pipeline", "file": upload}).content.decode()
    assert ("Step 1 · preprocess · version: step 1 (preprocess): model &#x27;preprocess&#x27; has no version 9"
            in content)
    assert "Could not detect the model format" not in content


def test_the_diagram_fits_a_phone_column_when_drawn_top_to_bottom() -> None:
    across = pipeline_graph(digits_pipeline_definition())
    down = pipeline_graph(digits_pipeline_definition(), "down")
    assert across["width"] > 1000  # five columns side by side
    assert down["width"] <= 366  # a 390 px phone's column: one node wide, two for the outputs
    assert all(n["x"] + n["width"] <= down["width"] and n["y"] + n["height"] <= down["height"] for n in down["nodes"])
    assert all(e["y1"] < e["y2"] for e in down["edges"])  # every arrow points down
