from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from moto import mock_aws

from conftest import Person
from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec
from deployments.runtimes import registry
from deployments.runtimes.kubernetes import s3repo
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.tests.fake_kube import FakeKube
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import Clock
from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx
from tests.markers import require


@pytest.fixture(autouse=True, scope="session")
def _kubernetes_schemas_read_once() -> Iterator[None]:
    """kubernetes_validate reads and parses a kind's JSON schema and the whole _definitions.json (megabytes) on every
    validate call; the manifest tests validate each document against each supported version, which made the parsing
    about 2 % of the fast suite's CPU. The files are the installed package's and never change: each is parsed once per
    run. Validation itself is unchanged (jsonschema only reads the schemas)."""
    from functools import lru_cache

    from kubernetes_validate import utils

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "schema_contents", lru_cache(maxsize=None)(utils.schema_contents))
        yield

def make_ready_version(person: Person, name: str = "digits", data: bytes | None = None, **fields: Any) -> ModelVersion:
    """A ready ONNX version through the real upload path (the inspection runs in-process, or in the live worker of a
    test that has one, whichever claims it first)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry import actions
    from models_registry.inspection import inspect_here

    model = (Model.objects.filter(team=person.team, name=name).first()
             or Model.objects.create(team=person.team, name=name))
    upload = SimpleUploadedFile("model.onnx", data or tiny_onnx())
    version = actions.create_version_from_file(model, person.user, upload, "model.onnx", **fields)
    version = inspect_here(version.pk)
    assert version.status == "ready", version.error
    return version


def huge_input(deployment: Deployment) -> None:
    """The served model declares an input too large for the Try-it example (a python model declares its own)."""
    revision = deployment.revision
    assert revision is not None
    spec = revision.spec.to_json()
    spec["models"][0]["signature"]["inputs"][0]["dims"] = [-1, 2**62]  # the first: the batch
    Revision.objects.filter(pk=revision.pk).update(spec=RevisionSpec.from_json(spec))


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


# --- The reconciler's tests: `clock` is the time timezone.now reads, `fake` the runtime (fake_runtime.py) ----------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(timezone, "now", clock)
    return clock


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, settings: Any, clock: Clock) -> FakeRuntime:
    runtime = FakeRuntime()
    monkeypatch.setitem(registry.FACTORIES, "local", lambda: runtime)
    settings.ROLLOUT_DRAIN_SECONDS = 2.0
    return runtime


# --- The Kubernetes runtime's tests (test_k8s_*.py): `kube`, a fake API server; `url_clock`, the signing time ----


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    """A fake Kubernetes API server (fake_kube.py): no real one can run on this machine. An HTTP server with the
    official client's round trips behind every call: marked `kube`, out of the fast suite like the S3 server."""
    require("kube", "starts the fake Kubernetes API server")
    server = FakeKube().start()
    yield server
    server.stop()


class UrlClock:
    """The time the runtime measures URL expiry with, and botocore signs URLs with: tests move it."""

    def __init__(self) -> None:
        self.time = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.time


@pytest.fixture
def url_clock(monkeypatch: pytest.MonkeyPatch) -> UrlClock:
    url_clock = UrlClock()
    monkeypatch.setattr("botocore.auth.get_current_datetime",
                        lambda remove_tzinfo=True: url_clock.time.replace(tzinfo=None))
    return url_clock


@pytest.fixture
def cfg(kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesConfig]:
    """A config for the fake cluster, with S3 from moto's in-process mock (the runtime reads each revision's
    manifest from S3 and presigns URLs; test_k8s_s3.py does the same against moto's server)."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    config = KubernetesConfig(
        kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig")), s3_bucket="models",
        s3_access_key_id="AKIAFAKE", s3_secret_access_key="fake-secret", ready_timeout_seconds=30,
        unschedulable_grace_seconds=60,
    )
    with mock_aws():
        s3repo.client(config).create_bucket(Bucket="models")
        yield config


