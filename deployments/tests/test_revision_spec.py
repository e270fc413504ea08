"""A revision's spec is one typed value: every shape of spec JSON that Modelport ever stored loads, and what it writes
reads back the same. The shapes below are what deployments/snapshot.py and deployments/api.py wrote at each commit
that changed them (git log -p on those files): 80faee8 (the first: quantities stored as "" when empty), 9156945
(pipelines, Kubernetes autoscaling), bbd05d7 (SavedModels' signature_def), and the revisions tests write by hand."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.models import Deployment, Revision
from deployments.revision_spec import SPEC_VERSION, Autoscaling, ModelEntry, Resources, RevisionSpec, SpecError
from deployments.spec import DynamicBatching, EnsembleStep, InstanceGroup, ServedModel, Warmup
from modelport.core.definitions import PipelineDefinition
from tests.support.people import Person

SIGNATURE = {"inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 64]}],
             "outputs": [{"name": "label", "datatype": "INT64", "dims": [-1]}]}
SHA = "ab" * 32


def entry(name: str = "digits", fmt: str = "onnx", **extra: Any) -> dict[str, Any]:
    """An entry as served_model_json() wrote it from the first commit on."""
    return {"name": name, "model": name, "version": 1, "version_id": 7, "format": fmt, "sha256": SHA,
            "signature": SIGNATURE, "max_batch_size": 64,
            "dynamic_batching": {"max_queue_delay_microseconds": 0, "preferred_batch_size": [],
                                 "preserve_ordering": False},
            "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False, "warmup": None,
            "definition": None, **extra}


FIRST_LOCAL = {  # 80faee8: empty quantities were stored as ""
    "runtime": "local", "replicas": 1, "resources": {"cpu": "", "memory": "", "gpu": 0, "gpu_type": ""},
    "models": [entry(warmup={"batch_size": 1, "count": 2, "data": "zero"}, response_cache=True)],
}
PIPELINE_ON_KUBERNETES = {  # 9156945: a pipeline brings its steps; autoscaling; a python step's requirements
    "runtime": "kubernetes", "replicas": 2, "resources": {"gpu": 1, "gpu_type": "a100", "mig_profile": "1g.10gb"},
    "autoscaling": {"min_replicas": 2, "max_replicas": 6, "metric": "queue_time", "target": 5000},
    "models": [
        entry("digits-pipeline", "ensemble", sha256="", max_batch_size=8, dynamic_batching=None, definition={
            "steps": [{"model": "preprocess", "version": 1, "input_map": {"image": "image"},
                       "output_map": {"features": "features"}},
                      {"model": "digits", "version": 1, "input_map": {"input": "features"},
                       "output_map": {"label": "label"}}]}),
        entry("preprocess", "python", dynamic_batching=None, definition={"requirements": ["pillow>=10"]}),
        entry("digits", instance_group={"count": 2, "kind": "gpu", "gpus": [0]}),
    ],
}
SAVEDMODEL = {  # bbd05d7: the SignatureDef inspection chose
    "runtime": "local", "replicas": 1, "resources": {"gpu": 0},
    "models": [entry("cnn", "tensorflow_savedmodel", definition={"signature_def": "predict"})],
}
HAND_MADE = {  # what tests and fixtures write: keys left out mean the defaults
    "models": [{"name": "m", "version": 2, "format": "python", "max_batch_size": 0,
                "dynamic_batching": {"max_queue_delay_microseconds": 500}, "instance_group": {"kind": "cpu"}}],
}
EVERY_SHAPE = {"first local": FIRST_LOCAL, "pipeline on kubernetes": PIPELINE_ON_KUBERNETES,
               "savedmodel": SAVEDMODEL, "hand made": HAND_MADE}


@pytest.mark.parametrize("data", EVERY_SHAPE.values(), ids=EVERY_SHAPE.keys())
def test_every_stored_shape_loads_and_writes_back_what_it_read(data: dict[str, Any]) -> None:
    spec = RevisionSpec.from_json(data)
    written = spec.to_json()
    assert written["spec_version"] == SPEC_VERSION
    assert RevisionSpec.from_json(written) == spec
    assert RevisionSpec.from_json(written).to_json() == written
    for old, new in zip(data["models"], written["models"], strict=True):
        assert new["name"] == old["name"] and new["version"] == old["version"] and new["format"] == old["format"]


def test_a_warmup_written_with_keys_left_out_reads_with_their_defaults() -> None:
    """The deploy form kept {"batch_size": 1, "count": 2} as it was given; the typed value fills in the rest."""
    [digits] = RevisionSpec.from_json({**FIRST_LOCAL, "models": [entry(warmup={"batch_size": 2})]}).models
    assert digits.warmup == Warmup(batch_size=2, count=1, data="zero")
    assert digits.to_json()["warmup"] == {"batch_size": 2, "count": 1, "data": "zero"}
    [empty] = RevisionSpec.from_json({**FIRST_LOCAL, "models": [entry(warmup={})]}).models
    assert empty.warmup == Warmup()  # {} was rendered as a default warm-up, and still is
    with pytest.raises(SpecError, match="models"):
        RevisionSpec.from_json({**FIRST_LOCAL, "models": [entry(warmup={"count": "many"})]})


def test_the_first_shape_reads_empty_quantities_as_the_default() -> None:
    spec = RevisionSpec.from_json(FIRST_LOCAL)
    assert spec.resources == Resources()
    assert spec.to_json()["resources"] == {"gpu": 0}
    [digits] = spec.models
    assert digits.response_cache and digits.warmup == Warmup(batch_size=1, count=2, data="zero")
    assert digits.dynamic_batching == DynamicBatching(max_queue_delay_microseconds=0)
    assert digits.signature.inputs[0].dims == (-1, 64)


def test_a_pipeline_revision_reads_its_steps_autoscaling_and_requirements() -> None:
    spec = RevisionSpec.from_json(PIPELINE_ON_KUBERNETES)
    assert spec.autoscaling == Autoscaling(min_replicas=2, max_replicas=6, target=5000, metric="queue_time")
    assert spec.resources == Resources(gpu=1, gpu_type="a100", mig_profile="1g.10gb")
    pipeline, preprocess, digits = spec.models
    assert pipeline.is_pipeline and pipeline.dynamic_batching is None
    assert pipeline.ensemble_steps[1] == EnsembleStep(model="digits", version=1, input_map={"input": "features"},
                                                      output_map={"label": "label"})
    assert pipeline.step_references == (("preprocess", 1), ("digits", 1))
    assert preprocess.requirements == ("pillow>=10",)
    assert digits.instance_group == InstanceGroup(count=2, kind="gpu", gpus=(0,))
    rendered = spec.repository(lambda e: None)
    assert [m.name for m in rendered.models] == ["digits-pipeline", "preprocess", "digits"]
    assert rendered.models[0].artifact_path is None and rendered.models[0].ensemble_steps


def test_a_savedmodel_keeps_the_signature_def_inspection_chose() -> None:
    [cnn] = RevisionSpec.from_json(SAVEDMODEL).models
    assert cnn.signature_def == "predict"
    assert ServedModel.of(cnn, None).signature_def == "predict"


def test_hand_made_entries_get_the_defaults() -> None:
    [m] = RevisionSpec.from_json(HAND_MADE).models
    assert m.dynamic_batching == DynamicBatching(max_queue_delay_microseconds=500)
    assert m.instance_group == InstanceGroup()
    assert m.sha256 == "" and m.version_id is None and m.signature.is_empty


@pytest.mark.parametrize("data, message", [
    ({"spec_version": SPEC_VERSION + 1, "models": []}, "written by a newer Modelport"),
    ({"spec_version": "2", "models": []}, "spec_version must be a positive integer"),
    ([], "spec must be a JSON object"),
    ({"models": {"digits": 1}}, "spec.models must be a list"),
    ({"models": [{"name": "m"}]}, "models[0] needs a name, a format and a version"),
    ({"models": [{"name": "m", "version": "one", "format": "onnx"}]}, "models[0] (m)"),
    ({"models": [], "resources": ["gpu"]}, "resources must be a JSON object"),
    ({"models": [], "autoscaling": {"min_replicas": 1}}, "spec:"),
])
def test_unreadable_spec_json_is_refused_with_the_part_named(data: Any, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        RevisionSpec.from_json(data)
    assert message in str(raised.value)


def test_the_spec_cannot_be_changed_by_a_reader() -> None:
    spec = RevisionSpec.from_json(PIPELINE_ON_KUBERNETES)
    definition = spec.models[0].definition
    assert isinstance(definition, PipelineDefinition)
    with pytest.raises(AttributeError):
        definition.steps = ()  # type: ignore[misc]
    with pytest.raises(TypeError, match="immutable"):
        definition.steps[0].input_map["image"] = "elsewhere"  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.replicas = 5  # type: ignore[misc]
    assert isinstance(ModelEntry.from_json(entry()).to_json()["instance_group"]["gpus"], list)


def test_a_row_written_by_earlier_code_loads_as_a_revision_spec(alice: Person) -> None:
    deployment = Deployment.objects.create(team=alice.team, name="old", runtime="kubernetes")
    revision = Revision.objects.create(deployment=deployment, number=1, spec=FIRST_LOCAL)
    # As an earlier Modelport left it: the raw JSON, no spec_version.
    Revision.objects.filter(pk=revision.pk).update(spec=PIPELINE_ON_KUBERNETES)
    assert Revision.objects.filter(pk=revision.pk).values_list("spec__spec_version", flat=True).get() is None
    loaded = Revision.objects.get(pk=revision.pk).spec
    assert isinstance(loaded, RevisionSpec) and loaded == RevisionSpec.from_json(PIPELINE_ON_KUBERNETES)
    # Written again, it is the current version; parts of it can still be queried as JSON.
    revision.spec = loaded
    revision.save()
    assert Revision.objects.filter(pk=revision.pk).values_list("spec__spec_version", flat=True).get() == SPEC_VERSION
    assert Revision.objects.filter(spec__replicas=2).count() == 1
    assert Revision.objects.values_list("spec", flat=True).get() == loaded
