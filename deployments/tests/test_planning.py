"""Deploy planning is one function that the API and the web pages call: the same request plans the same revision
whichever way it came in, and a caller that skips the API's serializer still meets every rule."""

from __future__ import annotations

import pytest

from conftest import Person
from deployments import planning
from deployments.models import Deployment
from deployments.revision_spec import Autoscaling, Resources
from deployments.spec import DynamicBatching, InstanceGroup
from deployments.tests.conftest import make_ready_version
from models_registry.models import ModelVersion
from web.tests.conftest import signed_in
from web.tests.test_deploy_form import NEW, form_data


@pytest.fixture
def digits(alice: Person) -> ModelVersion:
    return make_ready_version(alice, "digits")


def test_the_api_and_the_web_form_plan_the_same_revision(alice: Person, digits: ModelVersion) -> None:
    assert signed_in(alice).post(NEW, form_data()).status_code == 302
    from_the_form = Deployment.objects.get(name="digits-prod").revision
    response = alice.client().post("/api/v1/deployments/", {"name": "digits-api", "models": [{
        "model": "digits", "version": 1, "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_microseconds": 2000, "preferred_batch_size": [4, 8]},
        "instance_group": {"count": 2, "kind": "cpu"}}]}, format="json")
    assert response.status_code == 201, response.json()
    from_the_api = Deployment.objects.get(name="digits-api").revision
    assert from_the_form is not None and from_the_api is not None
    assert from_the_api.spec == from_the_form.spec
    request = planning.DeployRequest(runtime="local", models=(planning.ModelRequest(
        model="digits", version=1, max_batch_size=16, instance_group=InstanceGroup(count=2),
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=2000, preferred_batch_size=(4, 8))),))
    plan = planning.plan(alice.team, request)
    assert plan.spec == from_the_api.spec and plan.versions == (digits,)


def test_defaults_fill_what_is_not_given_and_none_turns_batching_off(alice: Person, digits: ModelVersion) -> None:
    [entry] = planning.plan(alice.team, planning.DeployRequest(
        runtime="local", models=(planning.ModelRequest(model="digits"),))).spec.models
    assert entry.max_batch_size == 64 and entry.dynamic_batching == DynamicBatching()
    [off] = planning.plan(alice.team, planning.DeployRequest(
        runtime="local", models=(planning.ModelRequest(model="digits", dynamic_batching=None),))).spec.models
    assert off.dynamic_batching is None and off.max_batch_size == 64


def test_a_caller_that_skips_the_serializer_still_meets_every_rule(alice: Person, digits: ModelVersion) -> None:
    request = planning.DeployRequest(
        runtime="kubernetes", replicas=10**6, resources=Resources(cpu="9" * 40, gpu=99),
        autoscaling=Autoscaling(min_replicas=5, max_replicas=2, target=50),
        models=(planning.ModelRequest(model="digits", instance_group=InstanceGroup(count=99)),
                planning.ModelRequest(model="nope")),
    )
    with pytest.raises(planning.PlanError) as raised:
        planning.plan(alice.team, request)
    errors = raised.value.errors
    assert errors["replicas"] == ["use between 1 and 100 replicas"]
    assert errors["resources.gpu"] == ["use between 0 and 16 GPUs per replica"]
    assert "not a Kubernetes quantity" in errors["resources.cpu"][0]
    assert errors["autoscaling.max_replicas"] == ["max_replicas must be at least min_replicas"]
    assert "between 1 and 16" in errors["models[0].instance_group.count"][0]
    assert errors["models[1].model"] == ["no model named 'nope' in your team"]
    with pytest.raises(planning.PlanError) as unknown:
        planning.plan(alice.team, planning.DeployRequest(runtime="mars", models=()))
    assert "unknown runtime 'mars'" in unknown.value.errors["runtime"][0]


def test_charlie_cannot_plan_with_alices_models(alice: Person, charlie: Person, digits: ModelVersion) -> None:
    with pytest.raises(planning.PlanError) as raised:
        planning.plan(charlie.team, planning.DeployRequest(runtime="local",
                                                           models=(planning.ModelRequest(model="digits"),)))
    assert raised.value.errors == {"models[0].model": ["no model named 'digits' in your team"]}


def test_the_local_runtimes_policy_gives_one_message_per_field(alice: Person, digits: ModelVersion) -> None:
    """A bad quantity is refused by the general rule; the local sandbox's own parser does not repeat it."""
    with pytest.raises(planning.PlanError) as raised:
        planning.plan(alice.team, planning.DeployRequest(runtime="local", resources=Resources(memory="lots", gpu=1),
                                                         models=(planning.ModelRequest(model="digits"),)))
    assert len(raised.value.errors["resources.memory"]) == 1
    assert raised.value.errors["resources.gpu"] == [
        "the local runtime has no GPU: use gpu 0, or runtime 'kubernetes'"]
