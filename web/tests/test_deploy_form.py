"""The deploy and settings forms: defaults fitted to the model, the API's rules with each message beside its field,
and the chosen settings kept in the revision's spec."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.model_entry import ModelEntry
from deployments.models import Deployment
from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx
from tests.support.deploying import fake_runtime_env
from tests.support.people import Person, signed_in
from tests.support.versions import make_ready_version
from web.tests.deploy_forms import EDIT, NEW, as_post, errors_of, form_data


def test_the_form_starts_from_the_models_defaults(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).get(NEW)
    [model_form] = response.context["model_forms"]
    assert model_form.initial["max_batch_size"] == digits.max_batch_size > 0
    assert model_form.initial["dynamic_batching"] is True
    assert model_form.initial["max_queue_delay_microseconds"] == 0
    assert response.context["form"].initial["name"] == "digits"
    content = response.content.decode()
    for element_id in ['id="deploy-submit"', 'id="m0-queue-delay-slider"', 'max="100000"', 'id="kubernetes-fields"',
                       'id="id_m0-max_queue_delay_microseconds"', 'role="switch"']:
        assert element_id in content
    assert "more throughput" in content  # the sentence on the latency/throughput trade-off


def test_a_model_without_a_batch_dimension_starts_unbatched(alice: Person) -> None:
    make_ready_version(alice, "fixed", tiny_onnx(batch=False))
    [model_form] = signed_in(alice).get("/deployments/new/?model=fixed").context["model_forms"]
    assert model_form.initial["max_batch_size"] == 0
    assert model_form.initial["dynamic_batching"] is False


def test_deploying_creates_a_deployment_with_the_chosen_settings(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data())
    assert response.status_code == 302
    assert response["Location"] == "/deployments/digits-prod/"
    deployment = Deployment.objects.get(team=alice.team, name="digits-prod")
    assert deployment.runtime == "local"
    assert deployment.created_by == alice.user
    spec = deployment.revision.spec.to_json()
    assert spec["replicas"] == 1
    [model] = spec["models"]
    assert model["model"] == "digits" and model["version"] == 1
    assert model["max_batch_size"] == 16
    assert model["dynamic_batching"] == {"max_queue_delay_microseconds": 2000, "preferred_batch_size": [4, 8],
                                         "preserve_ordering": False}
    assert model["instance_group"] == {"count": 2, "kind": "cpu", "gpus": []}
    assert list(deployment.revision.versions.all()) == [digits]


def test_dynamic_batching_can_be_switched_off(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(**{"m0-dynamic_batching": None}))
    assert response.status_code == 302
    assert Deployment.objects.get().revision.spec.to_json()["models"][0]["dynamic_batching"] is None


def test_a_queue_delay_beyond_the_slider_can_be_typed(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(**{"m0-max_queue_delay_microseconds": "2500000"}))
    assert response.status_code == 302
    batching = Deployment.objects.get().revision.spec.to_json()["models"][0]["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 2_500_000


def test_a_bad_name_is_shown_beside_the_name_field(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(name="Digits_Prod"))
    form_errors, _ = errors_of(response)
    assert "lowercase letters" in form_errors["name"][0]
    assert 'id="id_name_error"' in response.content.decode()
    assert 'aria-invalid="true"' in response.content.decode()


def test_a_preferred_batch_size_over_the_max_is_shown_beside_its_field(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(**{"m0-max_batch_size": "8", "m0-preferred_batch_size": "4, 16"}))
    _, errors = errors_of(response)
    assert errors["preferred_batch_size"] == ["preferred batch size 16 is larger than max_batch_size 8"]
    assert 'id="id_m0-preferred_batch_size_error"' in response.content.decode()


def test_a_queue_delay_over_the_api_limit_is_refused(alice: Person, digits: ModelVersion) -> None:
    _, errors = errors_of(signed_in(alice).post(NEW, form_data(**{"m0-max_queue_delay_microseconds": "20000000"})))
    assert "10000000" in errors["max_queue_delay_microseconds"][0]


def test_too_many_instances_are_refused(alice: Person, digits: ModelVersion) -> None:
    _, errors = errors_of(signed_in(alice).post(NEW, form_data(**{"m0-instance_count": "99"})))
    assert "16" in errors["instance_count"][0]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("m0-max_batch_size", "lots", "Enter a whole number."),
    ("m0-preferred_batch_size", "4, eight", "Enter whole numbers separated by commas"),
    ("replicas", "", "This field is required."),
    ("m0-version", "7", "Select a valid choice."),
])
def test_unreadable_input_is_shown_beside_its_field(alice: Person, digits: ModelVersion, field: str, value: str,
                                                    message: str) -> None:
    response = signed_in(alice).post(NEW, form_data(**{field: value}))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Deployment.objects.exists()


def test_replicas_on_the_local_runtime_are_refused_beside_the_field(alice: Person, digits: ModelVersion) -> None:
    form_errors, _ = errors_of(signed_in(alice).post(NEW, form_data(replicas="3")))
    assert "one Triton server per deployment" in form_errors["replicas"][0]


def test_batching_on_a_model_without_a_batch_dimension_is_refused(alice: Person) -> None:
    make_ready_version(alice, "fixed", tiny_onnx(batch=False))
    response = signed_in(alice).post("/deployments/new/?model=fixed", form_data(name="fixed"))
    _, errors = errors_of(response)
    assert "dynamic first dimension" in errors["max_batch_size"][0]


def test_gpu_fields_count_only_on_kubernetes(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    response = client.post(NEW, form_data(gpu="2", gpu_type="NVIDIA-A100"))
    assert response.status_code == 302
    assert not Deployment.objects.get().revision.spec.to_json()["resources"].get("gpu")
    response = client.post(NEW, form_data(name="digits-gpu", runtime="kubernetes", replicas="3", gpu="2",
                                          gpu_type="NVIDIA-A100", **{"m0-instance_kind": "gpu"}))
    assert response.status_code == 302, response.context["form"].errors or response.context["model_forms"][0].errors
    spec = Deployment.objects.get(name="digits-gpu").revision.spec.to_json()
    assert spec["runtime"] == "kubernetes" and spec["replicas"] == 3
    assert spec["resources"]["gpu"] == 2 and spec["resources"]["gpu_type"] == "NVIDIA-A100"
    assert spec["models"][0]["instance_group"]["kind"] == "gpu"


def test_a_taken_name_is_shown_beside_the_name_field(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    client.post(NEW, form_data())
    response = client.post(NEW, form_data())
    assert response.status_code == 200
    assert "exists already" in response.context["form"].errors["name"][0]
    assert Deployment.objects.count() == 1


def test_a_version_that_is_not_ready_is_not_offered(alice: Person, digits: ModelVersion) -> None:
    ModelVersion.objects.create(model=digits.model, number=2, status=ModelVersion.Status.INVALID)
    response = signed_in(alice).get("/deployments/new/?model=digits&version=2")
    assert response.status_code == 200
    assert response.context["model_forms"][0].initial["version"] == 1
    assert "Version 2 is not ready to deploy" in response.content.decode()


def test_a_model_without_a_ready_version_has_nothing_to_deploy(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="empty")
    response = signed_in(alice).get("/deployments/new/?model=empty")
    assert response.status_code == 200
    assert b"No ready version yet" in response.content
    assert b'id="deploy-submit"' not in response.content


def test_without_a_model_the_form_offers_the_ready_ones(alice: Person, digits: ModelVersion) -> None:
    Model.objects.create(team=alice.team, name="empty")
    content = signed_in(alice).get("/deployments/new/").content.decode()
    assert 'id="deploy-model-digits"' in content
    assert 'id="deploy-model-empty"' not in content


# --- Editing ------------------------------------------------------------------------------------------------------


def test_the_settings_form_starts_from_the_current_revision(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    client.post(NEW, form_data())
    response = client.get(EDIT)
    [model_form] = response.context["model_forms"]
    assert model_form.initial["max_batch_size"] == 16
    assert model_form.initial["preferred_batch_size"] == "4, 8"
    assert model_form.initial["instance_count"] == 2
    assert response.context["form"].fields["name"].disabled
    assert response.context["form"].fields["runtime"].disabled


def test_saving_settings_makes_a_new_revision(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    client.post(NEW, form_data())
    # The name and runtime cannot change: what the browser sends for them is ignored.
    response = client.post(EDIT, form_data(name="renamed", runtime="kubernetes",
                                           **{"m0-max_queue_delay_microseconds": "500", "m0-preferred_batch_size": ""}))
    assert response.status_code == 302
    assert response["Location"] == "/deployments/digits-prod/"
    deployment = Deployment.objects.get()
    assert deployment.name == "digits-prod" and deployment.runtime == "local"
    assert deployment.revision.number == 2
    batching = deployment.revision.spec.to_json()["models"][0]["dynamic_batching"]
    assert batching == {"max_queue_delay_microseconds": 500, "preferred_batch_size": [], "preserve_ordering": False}
    assert deployment.status == Deployment.Status.PENDING


def test_settings_errors_are_shown_and_make_no_revision(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    client.post(NEW, form_data())
    response = client.post(EDIT, form_data(**{"m0-max_batch_size": "2"}))
    assert response.status_code == 200
    assert "larger than max_batch_size 2" in response.context["model_forms"][0].errors["preferred_batch_size"][0]
    assert Deployment.objects.get().revision.number == 1


def test_editing_keeps_settings_the_form_does_not_show(alice: Person, digits: ModelVersion) -> None:
    from deployments import actions, planning
    from deployments.spec import Warmup

    request = planning.DeployRequest(runtime="local", models=(
        ModelEntry.asked("digits", response_cache=True, warmup=Warmup(batch_size=1, count=2)),))
    actions.create_deployment(alice.team, alice.user, "digits-prod", planning.plan(alice.team, request))
    response = signed_in(alice).post(EDIT, form_data())
    assert response.status_code == 302
    model = Deployment.objects.get().revision.spec.to_json()["models"][0]
    assert model["response_cache"] is True
    assert model["warmup"] == {"batch_size": 1, "count": 2, "data": "zero"}


def test_saving_the_settings_unchanged_makes_no_revision_and_says_so(alice: Person, digits: ModelVersion) -> None:
    """The rule is the API's PATCH's (deployments.actions): the page once made a revision and a rollout of it."""
    client = signed_in(alice)
    client.post(NEW, form_data())
    edit = client.get(EDIT)
    response = client.post(EDIT, as_post(edit.context["form"], edit.context["model_forms"]), follow=True)
    assert response.redirect_chain == [("/deployments/digits-prod/", 302)]
    assert "Nothing changed: digits-prod keeps serving these settings" in response.content.decode()
    deployment = Deployment.objects.get()
    assert deployment.revisions.count() == 1 and deployment.revision.number == 1
    assert not deployment.events.filter(message__startswith="Revision 2").exists()


def test_a_canary_of_the_settings_unchanged_is_refused_beside_its_share(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    client.post(NEW, form_data())
    Deployment.objects.update(status=Deployment.Status.READY, serving_revision=Deployment.objects.get().revision)
    edit = client.get(EDIT)
    response = client.post(EDIT, {**as_post(edit.context["form"], edit.context["model_forms"]), "canary_percent": "20"})
    assert response.status_code == 200
    assert response.context["form"].errors["canary_percent"] == [
        "A canary needs a change: these are the settings in effect already."]
    deployment = Deployment.objects.get()
    assert deployment.revisions.count() == 1 and deployment.canary_revision_id is None


def test_a_pipeline_deploys_with_its_steps_from_the_form(alice: Person) -> None:
    from models_registry.samples import digits_pipeline_definition
    from models_registry.tests.pipeline_versions import create_pipeline, digits_steps

    digits_steps(alice)
    assert create_pipeline(alice, digits_pipeline_definition()).status_code == 201
    url = "/deployments/new/?model=digits-pipeline"
    client = signed_in(alice)
    page = client.get(url)
    assert b'id="pipeline-note"' in page.content
    initial = page.context["model_forms"][0].initial
    assert initial["dynamic_batching"] is False
    data = form_data(name="digits-pipeline", **{"m0-max_batch_size": str(initial["max_batch_size"]),
                                                "m0-dynamic_batching": None, "m0-preferred_batch_size": ""})
    response = client.post(url, data)
    assert response.status_code == 302, (response.context["form"].errors, response.context["model_forms"][0].errors)
    spec = Deployment.objects.get().revision.spec.to_json()
    assert sorted(m["name"] for m in spec["models"]) == ["digits", "digits-pipeline", "postprocess", "preprocess"]
    edit = client.get("/deployments/digits-pipeline/edit/")
    assert len(edit.context["model_forms"]) == 4
    resubmit = as_post(edit.context["form"], edit.context["model_forms"])
    response = client.post("/deployments/digits-pipeline/edit/", resubmit)
    assert response.status_code == 302, [f.errors for f in response.context["model_forms"]]
    deployment = Deployment.objects.get()
    assert deployment.revision.number == 1  # the form as rendered asks for what serves: no revision
    assert deployment.revision.spec.to_json()["models"] == spec["models"]


def test_the_form_says_which_frameworks_the_local_runtime_has_and_how_to_add_the_others(
    alice: Person, digits: ModelVersion, settings: Any, tmp_path: Any
) -> None:
    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path, "torch-2.13.0+cpu")
    content = signed_in(alice).get(NEW).content.decode()
    assert ("The local runtime serves ONNX and Python models, and TorchScript with PyTorch 2.13.0+cpu. TensorFlow "
            "SavedModels need TensorFlow, which an operator adds with <code>make runtime-env RUNTIME_EXTRAS=tensorflow"
            "</code>. Kubernetes serves every format.") in content


# --- Fields that do not apply, and values worth a second look ---------------------------------------------------


def test_replicas_show_for_kubernetes_only_and_the_local_runtime_says_why(alice: Person, digits: ModelVersion) -> None:
    content = signed_in(alice).get(NEW).content.decode()
    # Inside the Kubernetes box, with the GPU fields.
    assert (content.index('id="kubernetes-fields"') < content.index('id="field-replicas"')
            < content.index('id="field-gpu"'))
    assert 'data-runtime="kubernetes" hidden' in content  # hidden while the runtime is local
    assert "The local runtime runs one Triton server per deployment" in content
    # The posted value still counts: replicas 3 on the local runtime is refused beside the field (server side).
    form_errors, _ = errors_of(signed_in(alice).post(NEW, form_data(replicas="3")))
    assert "one Triton server per deployment" in form_errors["replicas"][0]


def test_the_kubernetes_runtime_is_disabled_with_the_reason_when_no_cluster_is_configured(
        alice: Person, digits: ModelVersion, settings: Any, bare_runtime_env: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = ""
    settings.KUBERNETES_IN_CLUSTER = False
    content = signed_in(alice).get(NEW).content.decode()
    assert '<option value="kubernetes" disabled>Kubernetes cluster (not configured here)</option>' in content
    assert "The Kubernetes runtime is not available: No Kubernetes cluster is configured" in content
    assert "local runtime serves ONNX, Python models and pipelines" in content

    settings.KUBERNETES_KUBECONFIG = "/etc/kubeconfig"
    settings.KUBERNETES_S3_BUCKET = "repositories"
    settings.KUBERNETES_TRITON_EGRESS = ["10.0.0.0/8:9000"]
    content = signed_in(alice).get(NEW).content.decode()
    assert '<option value="kubernetes">Kubernetes cluster</option>' in content
    assert "need the Kubernetes runtime" in content


def test_extreme_values_carry_a_warning_for_the_page(alice: Person, digits: ModelVersion) -> None:
    content = signed_in(alice).get(NEW).content.decode()
    assert 'data-warn-above="100000"' in content and "A request that arrives alone waits this long" in content
    assert 'data-warn-above="1024"' in content and "A batch this large must fit in memory" in content
    # The help of "Max batch size" is about the field, not a statement about the model.
    assert "The largest batch Triton may hand the model at once" in content
    assert "the model&#x27;s inputs have no batch dimension" not in content


def test_a_pipeline_shows_no_batching_or_instance_fields_and_ignores_posted_ones(alice: Person) -> None:
    """The pipeline's own batching and instances are not applied by Triton: the form does not offer them, and a
    hand-made POST of "instances 3" does not reach the spec."""
    from models_registry.samples import digits_pipeline_definition
    from models_registry.tests.pipeline_versions import create_pipeline, digits_steps

    digits_steps(alice)
    assert create_pipeline(alice, digits_pipeline_definition()).status_code == 201
    url = "/deployments/new/?model=digits-pipeline"
    client = signed_in(alice)
    content = client.get(url).content.decode()
    assert 'id="m0-pipeline-settings"' in content
    for absent in ['name="m0-instance_count"', 'name="m0-dynamic_batching"', 'name="m0-max_queue_delay_microseconds"']:
        assert absent not in content
    initial = client.get(url).context["model_forms"][0].initial
    response = client.post(url, form_data(name="digits-pipeline", **{
        "m0-max_batch_size": str(initial["max_batch_size"]), "m0-instance_count": "3", "m0-instance_kind": "gpu"}))
    assert response.status_code == 302
    pipeline = next(m for m in Deployment.objects.get().revision.spec.to_json()["models"] if m["format"] == "ensemble")
    assert pipeline["instance_group"] == {"count": 1, "kind": "cpu", "gpus": []}
    assert pipeline["dynamic_batching"] is None
    # Editing: the step models keep their own batching and instance fields.
    edit = client.get("/deployments/digits-pipeline/edit/").content.decode()
    assert 'id="m0-pipeline-settings"' in edit and "Set them on the step models below." in edit
    assert 'name="m1-instance_count"' in edit
