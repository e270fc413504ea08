from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from conftest import Person
from deployments.runtimes.kubernetes import s3repo
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.tests.fake_kube import FakeKube
from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx


def make_ready_version(person: Person, name: str = "digits", data: bytes | None = None, **fields: Any) -> ModelVersion:
    """A ready ONNX version through the real upload path (the inspection runs in-process)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry import actions
    from models_registry.inspection import inspect_version

    model = Model.objects.filter(team=person.team, name=name).first() or Model.objects.create(team=person.team, name=name)
    upload = SimpleUploadedFile("model.onnx", data or tiny_onnx())
    version = actions.create_version_from_file(model, person.user, upload, "model.onnx", **fields)
    inspect_version(version.pk)
    version.refresh_from_db()
    assert version.status == "ready", version.error
    return version


def settle(deployment_id: int, ticks: int = 10) -> None:
    """Tick the reconciler as the worker would, one tick right after the other (the runtimes here answer at once,
    so the waits between ticks are left out), until it wants no next one."""
    from deployments import reconcile

    for _ in range(ticks):
        if reconcile.reconcile(deployment_id) is None:
            return
    raise AssertionError(f"deployment {deployment_id} is not at rest after {ticks} ticks")


@pytest.fixture
def digits_v1(alice: Person) -> ModelVersion:
    return make_ready_version(alice)


# --- The Kubernetes runtime's tests (test_k8s_*.py) ------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    """A fake Kubernetes API server (fake_kube.py): no real one can run on this machine."""
    server = FakeKube().start()
    yield server
    server.stop()


class Clock:
    """The time the runtime measures URL expiry with, and botocore signs URLs with: tests move it."""

    def __init__(self) -> None:
        self.time = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.time


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda remove_tzinfo=True: clock.time.replace(tzinfo=None))
    return clock


@pytest.fixture
def cfg(fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesConfig]:
    """A config for the fake cluster, with S3 from moto's in-process mock (the runtime reads each revision's
    manifest from S3 and presigns URLs; test_k8s_s3.py does the same against moto's server)."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    config = KubernetesConfig(
        kubeconfig=str(fake.write_kubeconfig(tmp_path / "kubeconfig")), s3_bucket="models",
        s3_access_key_id="AKIAFAKE", s3_secret_access_key="fake-secret", ready_timeout_seconds=30,
        unschedulable_grace_seconds=60,
    )
    with mock_aws():
        s3repo.client(config).create_bucket(Bucket="models")
        yield config


