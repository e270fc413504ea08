from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from moto import mock_aws

from deployments.runtimes import registry
from deployments.runtimes.kubernetes import s3repo
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.tests.fake_kube import FakeKube
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import Clock
from tests.markers import require
from tests.support.clocks import UrlClock


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


@pytest.fixture
def tiny_models_limited_to_4gi(settings: Any) -> None:
    """For tests that count in the 4Gi every dedicated local deployment given no memory was limited to before issue
    31: with Triton's share at 4Gi less POOL_MODEL_MEMORY_MIN, a tiny ONNX model's derived limit is 4Gi again
    (deployments/tests/test_server_memory.py tests the derivation itself). Used as a module's mark."""
    settings.SANDBOX_SERVER_MEMORY = "3968Mi"
    settings.POOL_MODEL_MEMORY_MIN = "128Mi"


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


