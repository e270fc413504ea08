"""Deployments made as the API makes them, and ticked to rest as the worker would (the fast suite's runtimes answer
at once). The end-to-end tests' deploy-and-wait against a real Triton is tests/deploying.py."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec
from tests.support.people import Person


def deploy(person: Person, name: str = "digits-prod", model: str = "digits", **body: Any) -> Deployment:
    """Created as the API creates it (its input parsed by the API's serializer, then planned); the reconciler is not
    run: its on_commit never fires inside a test transaction, so a new deployment stays pending."""
    from deployments import actions
    from deployments.api import DeploymentInputSerializer, plan_input

    serializer = DeploymentInputSerializer(data={"name": name, "models": [{"model": model}], **body})
    serializer.is_valid(raise_exception=True)
    return actions.create_deployment(person.team, person.user, name, plan_input(person.team, serializer))


def post_deployment(person: Person, **body: Any) -> Any:
    """POST /api/v1/deployments/ of alice's "digits" as "digits-prod", with `body` over those defaults."""
    payload = {"name": "digits-prod", "models": [{"model": "digits"}], **body}
    return person.client().post("/api/v1/deployments/", payload, format="json")


def settle(deployment_id: int, ticks: int = 10) -> None:
    """Tick the reconciler as the worker would, one tick right after the other (the runtimes here answer at once,
    so the waits between ticks are left out), until it wants no next one."""
    from deployments import reconcile

    for _ in range(ticks):
        if reconcile.reconcile(deployment_id) is None:
            return
    raise AssertionError(f"deployment {deployment_id} is not at rest after {ticks} ticks")


def huge_input(deployment: Deployment) -> None:
    """The served model declares an input too large for the Try-it example (a python model declares its own)."""
    revision = deployment.revision
    assert revision is not None
    spec = revision.spec.to_json()
    spec["models"][0]["signature"]["inputs"][0]["dims"] = [-1, 2**62]  # the first: the batch
    Revision.objects.filter(pk=revision.pk).update(spec=RevisionSpec.from_json(spec))


def fake_runtime_env(root: Any, *packages: str) -> Any:
    """A runtime env laid out as pip leaves it: the tritonserver binary, and `packages` ("torch-2.13.0")."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "pytriton" / "tritonserver" / "bin").mkdir(parents=True)
    (site / "pytriton" / "tritonserver" / "bin" / "tritonserver").write_text("")
    for package in packages:
        name, _, version = package.partition("-")
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        (site / f"{name}-{version}.dist-info").mkdir()
    return root
