"""The rules of a change live in deployments.actions, so the API, the pages, the CLI and a tune's Apply all keep
them: a change of nothing makes no revision, a canary needs a change, an operator's re-render is the one change
of nothing that makes a revision. (The paths that reach them: test_reconcile_queue.py and test_api_canary.py for
the API, web/tests/test_deploy_form.py for the edit page, modelport_cli/tests/test_cli_portal.py for the CLI.)"""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from deployments import actions, canary, planning
from deployments.model_entry import ModelEntry
from deployments.models import Deployment
from deployments.revision_spec import DynamicBatching
from infra.api_errors import Conflict, Invalid
from models_registry.models import ModelVersion
from tests.support.people import Person


def plan(person: Person, delay: int = 0) -> planning.Plan:
    batching = DynamicBatching(max_queue_delay_microseconds=delay)
    request = planning.DeployRequest(runtime="local", models=(ModelEntry.asked("digits", dynamic_batching=batching),))
    return planning.plan(person.team, request)


def ready(person: Person) -> Deployment:
    deployment = actions.create_deployment(person.team, person.user, "digits-prod", plan(person))
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.READY,
                                                       serving_revision=deployment.revision)
    return Deployment.objects.get(pk=deployment.pk)


def test_a_plan_of_the_settings_in_effect_makes_no_revision_event_or_audit(alice: Person, digits: ModelVersion) -> None:
    deployment = ready(alice)
    assert actions.update_deployment(deployment, alice.user, plan(alice)) is None
    row = Deployment.objects.get()
    assert row.revisions.count() == 1 and row.status == Deployment.Status.READY
    assert not row.events.filter(message__startswith="Revision 2").exists()
    assert not AuditEntry.objects.filter(action="deployment.update").exists()


def test_a_plan_that_changes_something_makes_a_revision(alice: Person, digits: ModelVersion) -> None:
    deployment = ready(alice)
    revision = actions.update_deployment(deployment, alice.user, plan(alice, delay=500))
    assert revision is not None and revision.number == 2
    assert Deployment.objects.get().status == Deployment.Status.PENDING


def test_a_canary_of_no_change_is_invalid_naming_the_rollout(alice: Person, digits: ModelVersion) -> None:
    deployment = ready(alice)
    with pytest.raises(Invalid) as refused:
        actions.update_deployment(deployment, alice.user, plan(alice), canary=canary.Rollout(percent=10))
    assert refused.value.field == "rollout"
    assert "a canary needs a change" in refused.value.message
    assert Deployment.objects.get().canary_revision_id is None


def test_an_unchanged_plan_while_a_canary_runs_is_no_change_and_a_change_is_a_conflict(
        alice: Person, digits: ModelVersion) -> None:
    deployment = ready(alice)
    actions.update_deployment(deployment, alice.user, plan(alice, delay=500), canary=canary.Rollout(percent=10))
    assert actions.update_deployment(deployment, alice.user, plan(alice)) is None
    with pytest.raises(Conflict, match="A canary of revision 2 is in progress"):
        actions.update_deployment(deployment, alice.user, plan(alice, delay=900))


def test_a_rerender_makes_a_revision_of_the_same_spec(alice: Person, digits: ModelVersion) -> None:
    deployment = ready(alice)
    revision = actions.rerender_deployment(deployment, alice.user)
    assert revision.number == 2
    assert revision.spec.to_json() == Deployment.objects.get().revisions.get(number=1).spec.to_json()
    assert list(revision.versions.all()) == [digits]
