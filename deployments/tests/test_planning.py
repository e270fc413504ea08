"""Deploy planning is one function that the API and the web pages call: the same request plans the same revision
whichever way it came in, and a caller that skips the API's serializer still meets every rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from deployments import planning
from deployments.model_entry import ModelEntry
from deployments.models import Deployment
from deployments.revision_spec import Autoscaling, Resources
from deployments.spec import DynamicBatching, InstanceGroup
from modelport.core.definitions import PythonDefinition
from models_registry.models import ModelVersion
from tests.support.people import Person, signed_in
from web.tests.deploy_forms import NEW, form_data


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
    request = planning.DeployRequest(runtime="local", models=(ModelEntry.asked(
        "digits", version=1, max_batch_size=16, instance_group=InstanceGroup(count=2),
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=2000, preferred_batch_size=(4, 8))),))
    plan = planning.plan(alice.team, request)
    assert plan.spec == from_the_api.spec and plan.versions == (digits,)


def test_defaults_fill_what_is_not_given_and_none_turns_batching_off(alice: Person, digits: ModelVersion) -> None:
    [entry] = planning.plan(alice.team, planning.DeployRequest(
        runtime="local", models=(ModelEntry.asked("digits"),))).spec.models
    assert entry.max_batch_size == 64 and entry.dynamic_batching == DynamicBatching()
    [off] = planning.plan(alice.team, planning.DeployRequest(
        runtime="local", models=(ModelEntry.asked("digits", dynamic_batching=None),))).spec.models
    assert off.dynamic_batching is None and off.max_batch_size == 64


def test_a_revisions_entries_planned_again_give_the_same_spec(alice: Person, digits: ModelVersion) -> None:
    """A planned entry is an asked one with every setting given: request_for() hands the spec's entries back."""
    spec = planning.plan(alice.team, planning.DeployRequest(runtime="local", models=(ModelEntry.asked("digits"),))).spec
    again = planning.request_for(spec)
    assert again.models == spec.models and all(not m.defaults for m in again.models)
    assert planning.plan(alice.team, again).spec == spec


def test_an_asked_entry_says_what_it_leaves_to_the_defaults_and_is_never_stored() -> None:
    asked = ModelEntry.asked("digits", dynamic_batching=None)
    assert asked.asked_version is None and asked.defaults == {"max_batch_size"} and asked.dynamic_batching is None
    assert ModelEntry.asked("digits", version=2, max_batch_size=0).defaults == {"dynamic_batching"}
    with pytest.raises(ValueError, match="plan it first"):
        asked.to_json()


def test_what_a_version_fixes_comes_from_the_registry_not_from_the_request(alice: Person,
                                                                           digits: ModelVersion) -> None:
    """A caller cannot make a revision serve other bytes or another format by writing them into its entry."""
    forged = replace(ModelEntry.asked("digits"), format="python", sha256="0" * 64, version_id=10**6,
                     definition=PythonDefinition(requirements=("evil",)))
    [entry] = planning.plan(alice.team, planning.DeployRequest(runtime="local", models=(forged,))).spec.models
    assert (entry.format, entry.sha256, entry.version_id) == (digits.format, digits.sha256, digits.id)
    assert entry.definition == digits.definition and entry.requirements == ()


def test_a_caller_that_skips_the_serializer_still_meets_every_rule(alice: Person, digits: ModelVersion) -> None:
    request = planning.DeployRequest(
        runtime="kubernetes", replicas=10**6, resources=Resources(cpu="9" * 40, gpu=99),
        autoscaling=Autoscaling(min_replicas=5, max_replicas=2, target=50),
        models=(ModelEntry.asked("digits", instance_group=InstanceGroup(count=99)),
                ModelEntry.asked("nope")),
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
                                                           models=(ModelEntry.asked("digits"),)))
    assert raised.value.errors == {"models[0].model": ["no model named 'digits' in your team"]}


def test_the_local_runtimes_policy_gives_one_message_per_field(alice: Person, digits: ModelVersion) -> None:
    """A bad quantity is refused by the general rule; the local sandbox's own parser does not repeat it."""
    with pytest.raises(planning.PlanError) as raised:
        planning.plan(alice.team, planning.DeployRequest(runtime="local", resources=Resources(memory="lots", gpu=1),
                                                         models=(ModelEntry.asked("digits"),)))
    assert len(raised.value.errors["resources.memory"]) == 1
    assert raised.value.errors["resources.gpu"] == [
        "the local runtime has no GPU: use gpu 0, or runtime 'kubernetes'"]


def test_only_a_dedicated_deployment_scales_to_zero(alice: Person, digits: ModelVersion) -> None:
    """A pool stays up for every team; a shared deployment's models go when idle by the pool's unload instead."""
    request = planning.DeployRequest(
        runtime="local", placement=planning.PlacementRequest(mode="shared"),
        autoscaling=Autoscaling(min_replicas=0, max_replicas=2, target=50), models=(ModelEntry.asked("digits"),))
    with pytest.raises(planning.PlanError) as raised:
        planning.plan(alice.team, request)
    [message] = raised.value.errors["autoscaling.min_replicas"]
    assert "placement.idle_unload_seconds" in message and "'dedicated'" in message
    below = replace(request, placement=None, autoscaling=Autoscaling(min_replicas=-1, max_replicas=2, target=50))
    with pytest.raises(planning.PlanError) as negative:
        planning.plan(alice.team, below)
    assert negative.value.errors["autoscaling.min_replicas"] == ["use 0 (scale to zero) or more"]
