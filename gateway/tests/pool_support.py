"""A shared deployment's rows as the gateway's tests need them (a revision in the pool `shared`, its PoolLoad)."""

from __future__ import annotations

from deployments.models import Deployment, PoolLoad, Revision
from deployments.pools import shared_pool
from tests.support.people import Person

SHARED = {"mode": "shared", "pool": "shared", "idle_unload_seconds": 600}


def shared_deployment(person: Person, name: str, upstream_url: str, *, load: str | None = "loaded") -> Deployment:
    """A deployment serving revision 1 from the pool `shared`; `load`: its PoolLoad's state, None for no row."""
    deployment = Deployment.objects.create(team=person.team, name=name, upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1, spec={
        "spec_version": 2, "runtime": "local", "placement": SHARED,
        "models": [{"name": "digits", "version": 1, "format": "onnx"}]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    if load is not None:
        PoolLoad.objects.create(pool=shared_pool(), revision=revision, deployment=deployment, state=load)
    deployment.refresh_from_db()
    return deployment
