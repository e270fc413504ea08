"""A shared deployment's idle time (placement.idle_unload_seconds) changed alone is set in place (issue 31): no
revision, no rollout, nothing loaded again; a revision is for what changes the model repository served. The API's
PATCH and the reconciler on the fake runtime (fake_runtime.py); the settings page in web/tests/test_pools_pages.py,
the CLI in modelport_cli/tests/test_cli_portal.py."""

from __future__ import annotations

from audit.models import AuditEntry
from deployments.models import Deployment, PoolLoad
from deployments.pools import shared_pool
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import Clock, S, tick, ticks_until
from tests.support.deploying import post_deployment
from tests.support.people import Person
from tests.support.versions import make_ready_version

PATH = "/api/v1/deployments/digits-prod/"


def _serving_shared(alice: Person, fake: FakeRuntime, clock: Clock, idle: int = 600) -> Deployment:
    make_ready_version(alice)
    created = post_deployment(alice, placement={"mode": "shared", "idle_unload_seconds": idle})
    assert created.status_code == 201, created.json()
    deployment = Deployment.objects.get(name="digits-prod")
    ticks_until(deployment, lambda d: d.status == S.READY and d.drain_until is None, clock)
    return Deployment.objects.get(pk=deployment.pk)


def test_a_new_idle_time_alone_makes_no_revision_and_reloads_nothing(alice: Person, fake: FakeRuntime,
                                                                    clock: Clock) -> None:
    deployment = _serving_shared(alice, fake, clock)
    load = PoolLoad.objects.create(pool=shared_pool(), revision=deployment.revision, deployment=deployment,
                                   state=PoolLoad.State.LOADED, idle_unload_seconds=600)
    calls = len(fake.calls)

    patched = alice.client().patch(PATH, {"placement": {"idle_unload_seconds": 60}}, format="json")

    assert patched.status_code == 200, patched.json()
    assert patched.json()["revision"] == 1
    placement = patched.json()["placement"]
    assert (placement["mode"], placement["pool"], placement["idle_unload_seconds"]) == ("shared", "shared", 60)
    assert placement["state"] == "loaded"  # still: nothing was unloaded or loaded for it
    deployment.refresh_from_db()
    assert deployment.revisions.count() == 1 and deployment.serving_revision_id == deployment.revision_id
    assert deployment.revision.spec.placement.idle_unload_seconds == 60
    assert deployment.status == S.READY
    # The pool's idle pass reads the load's own figure: changed there too, the models left loaded.
    load.refresh_from_db()
    assert (load.idle_unload_seconds, load.state) == (60, PoolLoad.State.LOADED)
    # The reconciler has nothing to roll out: a health check, no prepare and no launch.
    tick(deployment)
    assert not [c for c in fake.calls[calls:] if c.startswith(("prepare", "launch"))], fake.calls[calls:]
    assert fake.launched_revisions() == [1]
    newest = deployment.events.first()
    assert newest is not None
    assert newest.message == ("Idle time set to 60 s (it was 600 s) by alice, on revision 1 in place: nothing was "
                              "loaded again.")
    entry = AuditEntry.objects.filter(action="deployment.update").latest("id")
    assert entry.detail == {"revision": 1, "idle_unload_seconds": 60}

    # The same PATCH again changes nothing, and says nothing.
    events = deployment.events.count()
    assert alice.client().patch(PATH, {"placement": {"idle_unload_seconds": 60}}, format="json").status_code == 200
    assert deployment.events.count() == events


def test_an_idle_time_with_another_change_still_makes_a_revision(alice: Person, fake: FakeRuntime,
                                                                clock: Clock) -> None:
    _serving_shared(alice, fake, clock)
    patched = alice.client().patch(PATH, {"placement": {"idle_unload_seconds": 60}, "models": [
        {"model": "digits", "instance_group": {"count": 2, "kind": "cpu"}}]}, format="json")
    assert patched.status_code == 200, patched.json()
    assert patched.json()["revision"] == 2
    deployment = Deployment.objects.get(name="digits-prod")
    assert deployment.revision.spec.placement.idle_unload_seconds == 60
    # A change of placement mode is a rollout too, as before.
    ticks_until(deployment, lambda d: d.status == S.READY and d.drain_until is None, clock)
    assert alice.client().patch(PATH, {"placement": {"mode": "dedicated"}}, format="json").json()["revision"] == 3


def test_a_canary_of_an_idle_time_alone_is_a_400_saying_it_changes_in_place(alice: Person, fake: FakeRuntime,
                                                                           clock: Clock) -> None:
    _serving_shared(alice, fake, clock)
    refused = alice.client().patch(PATH, {"placement": {"idle_unload_seconds": 60},
                                          "rollout": {"strategy": "canary", "percent": 10}}, format="json")
    assert refused.status_code == 400, refused.json()
    assert "set in place with no new revision" in str(refused.json()["error"])
    deployment = Deployment.objects.get(name="digits-prod")
    assert deployment.revision.spec.placement.idle_unload_seconds == 600 and deployment.canary_revision_id is None
