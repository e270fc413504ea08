"""Model repositories in S3 for the Kubernetes runtime, against a real S3-compatible server (moto's server mode,
started by the tests): the upload and its manifest, the init container's script downloading and verifying a
repository through URLs presigned by boto3, and a real local Triton serving, ensemble included, what that script
downloaded. moto does not check signatures or expiry of presigned URLs: test_k8s_fetch.py plays S3's refusal.

The reconcile test also needs a Kubernetes API server, and uses the fake one (deployments/tests/fake_kube.py)
because no API server can run on this machine.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from moto.server import ThreadedMotoServer

from deployments.models import Deployment, Event, Revision
from deployments.render import render_repository
from deployments.runtimes.kubernetes import manifests, s3repo
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.local import backends, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import RepositorySpec
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from deployments.tests.local_triton import pipeline_spec, runtime_env
from modelport.core.runtime_env import RuntimeEnv
from models_registry.models import ModelVersion
from tests.support.deploying import settle
from tests.support.people import Person

pytestmark = pytest.mark.s3

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_config(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> KubernetesConfig:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    config = KubernetesConfig(s3_endpoint_url=moto_url, s3_bucket=f"repos-{uuid.uuid4().hex[:12]}",
                              s3_prefix="modelport/repositories", s3_region=REGION,
                              s3_access_key_id="testing", s3_secret_access_key="testing")
    s3repo.client(config).create_bucket(Bucket=config.s3_bucket)
    return config


def keys(config: KubernetesConfig, prefix: str = "") -> list[str]:
    return sorted(s3repo.list_keys(s3repo.client(config), config.s3_bucket, prefix))


def test_upload_mirrors_the_tree_with_a_placeholder_in_empty_version_directories(
        s3_config: KubernetesConfig, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    render_repository(RepositorySpec(models=pipeline_spec(artifacts)), "kubernetes", tmp_path / "repo")
    s3 = s3repo.client(s3_config)
    prefix = "modelport/repositories/acme/pipe-1/r1/"
    assert not s3repo.is_uploaded(s3, s3_config.s3_bucket, prefix)

    s3repo.upload_repository(s3, s3_config.s3_bucket, prefix, tmp_path / "repo")
    assert keys(s3_config) == [
        "modelport/repositories/acme/pipe-1/r1.uploaded",  # the marker, outside the tree Triton reads
        f"{prefix}add_one/1/model.onnx", f"{prefix}add_one/config.pbtxt",
        f"{prefix}double/1/model.py", f"{prefix}double/config.pbtxt",
        f"{prefix}pipeline/1/.modelport-keep", f"{prefix}pipeline/config.pbtxt",
    ]
    assert s3repo.is_uploaded(s3, s3_config.s3_bucket, prefix)
    body = s3.get_object(Bucket=s3_config.s3_bucket, Key=f"{prefix}add_one/1/model.onnx")["Body"].read()
    assert body == (tmp_path / "repo" / "add_one" / "1" / "model.onnx").read_bytes()
    # The marker records what was uploaded, hashed from the rendered tree: what the pods verify against.
    manifest = s3repo.read_manifest(s3, s3_config.s3_bucket, prefix)
    assert manifest is not None
    assert manifest.directories == ("pipeline/1",)
    rendered = {p.relative_to(tmp_path / "repo").as_posix(): p.read_bytes()
                for p in (tmp_path / "repo").rglob("*") if p.is_file()}
    assert {f.path: (f.size, f.sha256) for f in manifest.files} == {
        path: (len(data), hashlib.sha256(data).hexdigest()) for path, data in rendered.items()}


def test_a_marker_without_a_manifest_counts_as_not_uploaded(s3_config: KubernetesConfig) -> None:
    """Repositories uploaded by an older Modelport have an empty marker: they are uploaded again."""
    s3 = s3repo.client(s3_config)
    s3.put_object(Bucket=s3_config.s3_bucket, Key="p/r1.uploaded", Body=b"")
    assert not s3repo.is_uploaded(s3, s3_config.s3_bucket, "p/r1/")
    s3.put_object(Bucket=s3_config.s3_bucket, Key="p/r1.uploaded",
                  Body=json.dumps({"format": 1, "files": [{"path": "../x", "size": 1, "sha256": "0" * 64}]}).encode())
    assert s3repo.read_manifest(s3, s3_config.s3_bucket, "p/r1/") is None


def fetch_with_presigned_urls(config: KubernetesConfig, prefix: str, target: Path, work: Path) -> Any:
    """What a pod does: the worker writes the access Secret; the init container runs its fetch.py on its
    manifest.json (both read from the Secret's data, as the kubelet would mount them)."""
    s3 = s3repo.client(config)
    manifest = s3repo.read_manifest(s3, config.s3_bucket, prefix)
    assert manifest is not None
    files = s3repo.presign(s3, config.s3_bucket, prefix, manifest, 3600)
    spec = {"models": [], "resources": {}}
    secret = manifests.access_secret(manifests.Target("acme", "pipe", 1, spec, prefix), "ns", files,
                                     manifest.directories, "2026-12-01T00:00:00Z")
    work.mkdir(exist_ok=True)
    for name, data in secret["data"].items():
        (work / name).write_bytes(base64.b64decode(data))
    return subprocess.run([sys.executable, "-I", str(work / "fetch.py"), str(work / "manifest.json"), str(target)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": os.environ["PATH"]})  # no AWS_* variables: the URLs are all it has


def test_the_init_container_fetches_a_repository_through_presigned_urls(s3_config: KubernetesConfig,
                                                                         tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    render_repository(RepositorySpec(models=pipeline_spec(artifacts)), "kubernetes", tmp_path / "repo")
    prefix = "modelport/repositories/acme/pipe-1/r1/"
    s3repo.upload_repository(s3repo.client(s3_config), s3_config.s3_bucket, prefix, tmp_path / "repo")

    result = fetch_with_presigned_urls(s3_config, prefix, tmp_path / "models", tmp_path / "access")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 file(s) fetched, 0 already in place" in result.stdout
    fetched = sorted(p.relative_to(tmp_path / "models").as_posix() for p in (tmp_path / "models").rglob("*"))
    rendered = sorted(p.relative_to(tmp_path / "repo").as_posix() for p in (tmp_path / "repo").rglob("*"))
    assert fetched == rendered  # the ensemble's empty version directory included
    for path in (tmp_path / "repo").rglob("*"):
        if path.is_file():
            assert (tmp_path / "models" / path.relative_to(tmp_path / "repo")).read_bytes() == path.read_bytes()


def test_a_file_changed_in_s3_after_the_upload_is_refused(s3_config: KubernetesConfig, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    render_repository(RepositorySpec(models=pipeline_spec(artifacts)), "kubernetes", tmp_path / "repo")
    prefix = "modelport/repositories/acme/pipe-1/r1/"
    s3 = s3repo.client(s3_config)
    s3repo.upload_repository(s3, s3_config.s3_bucket, prefix, tmp_path / "repo")
    evil = (tmp_path / "repo" / "double" / "1" / "model.py").read_text() + "\nimport os; os.system('id')\n"
    s3.put_object(Bucket=s3_config.s3_bucket, Key=f"{prefix}double/1/model.py", Body=evil.encode())

    result = fetch_with_presigned_urls(s3_config, prefix, tmp_path / "models", tmp_path / "access")
    assert result.returncode == 2
    assert "double/1/model.py does not match what Modelport recorded" in result.stdout
    assert not (tmp_path / "models" / "double" / "1" / "model.py").exists()


def test_a_second_upload_removes_what_the_tree_no_longer_has(s3_config: KubernetesConfig, tmp_path: Path) -> None:
    s3 = s3repo.client(s3_config)
    prefix = "p/r1/"
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "old.bin").write_bytes(b"old")
    s3repo.upload_repository(s3, s3_config.s3_bucket, prefix, tmp_path)
    (tmp_path / "m" / "1" / "old.bin").unlink()
    (tmp_path / "m" / "config.pbtxt").write_text("name: 'm'")
    s3repo.upload_repository(s3, s3_config.s3_bucket, prefix, tmp_path)
    assert keys(s3_config) == ["p/r1.uploaded", "p/r1/m/1/.modelport-keep", "p/r1/m/config.pbtxt"]


def test_deleting_a_revision_leaves_the_others(s3_config: KubernetesConfig, tmp_path: Path) -> None:
    s3 = s3repo.client(s3_config)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("x")
    for number in (1, 2, 10):
        s3repo.upload_repository(s3, s3_config.s3_bucket, f"d-1/r{number}/", tmp_path)
    assert s3repo.uploaded_revisions(s3, s3_config.s3_bucket, "d-1/") == [1, 2, 10]
    assert s3repo.delete_repository(s3, s3_config.s3_bucket, "d-1/r1/") == 1
    assert s3repo.uploaded_revisions(s3, s3_config.s3_bucket, "d-1/") == [2, 10]  # r10 is not r1's
    assert s3repo.delete_prefix(s3, s3_config.s3_bucket, "d-1/") == 4
    assert keys(s3_config) == []


def read_only_root(env: RuntimeEnv, models: Path, tmp_path: Path) -> RuntimeEnv:
    """The runtime env with a tritonserver that runs as in the pod: in a mount namespace of its own where the
    root filesystem and the repository are read-only, and only /tmp (its HOME) and /dev/shm are writable."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-ec",
                            "mount --bind /tmp /tmp; mount -o remount,bind,ro /"], capture_output=True, check=False)
    if probe.returncode != 0 or not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"no mount namespace here to make the root filesystem read-only: {probe.stderr!r}")
    wrapper = tmp_path / "tritonserver-read-only-root"
    wrapper.write_text(f"""#!/bin/sh
exec unshare --mount --propagation private /bin/sh -ec '
mount --bind /tmp /tmp
mount --bind {models} {models}
mount -o remount,bind,ro {models}
mount -o remount,bind,ro /
export HOME=/tmp
exec "$0" "$@"' {env.tritonserver} "$@"
""")
    wrapper.chmod(0o755)
    return dataclasses.replace(env, tritonserver=wrapper)


def mount_options(pid: int, mount_point: Path | str) -> set[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mount_point):
            options = set(fields[5].split(","))
    return options


@pytest.mark.triton
def test_a_real_triton_serves_the_ensemble_the_init_container_fetched(s3_config: KubernetesConfig,
                                                                      tmp_path: Path) -> None:
    """Triton loads the verified local copy (what the pod's Triton container mounts read-only at /models), not
    S3: it needs no credential at all; and it serves with a read-only root filesystem, writing only to /tmp and
    /dev/shm (the pod's emptyDirs)."""
    env = runtime_env()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    # "local": the tritonserver here has only the python backend (see docs/local-runtime.md); the Kubernetes
    # render differs only in the backends it names.
    render_repository(RepositorySpec(models=pipeline_spec(artifacts)), "local", tmp_path / "repo")
    prefix = "modelport/repositories/acme/pipe-1/r1/"
    s3repo.upload_repository(s3repo.client(s3_config), s3_config.s3_bucket, prefix, tmp_path / "repo")
    fetched = fetch_with_presigned_urls(s3_config, prefix, tmp_path / "models", tmp_path / "access")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr

    process = lt.start_server(tmp_path / "models", tmp_path / "triton.log",
                              read_only_root(env, tmp_path / "models", tmp_path),
                              backends.build_backend_dir(env, tmp_path / "var"))
    try:
        deadline = time.monotonic() + 10  # the wrapper execs unshare, sh, then tritonserver in the same process
        while Path(f"/proc/{process.pid}/comm").read_text().strip() != "tritonserver" and time.monotonic() < deadline:
            time.sleep(0.01)
        result = readiness.wait_ready(process, ["add_one", "double", "pipeline"], timeout=120)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(process.log_path, 60)}"
        assert "ro" in mount_options(process.pid, "/")
        assert "ro" in mount_options(process.pid, tmp_path / "models")
        assert "rw" in mount_options(process.pid, "/tmp") and "rw" in mount_options(process.pid, "/dev/shm")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        request = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                          "data": x.ravel().tolist()}]}).encode()
        with urllib.request.urlopen(urllib.request.Request(
                f"{process.http_url}/v2/models/pipeline/infer", data=request,
                headers={"Content-Type": "application/json"}), timeout=30) as response:
            answer = json.load(response)
        [output] = answer["outputs"]
        assert np.allclose(np.array(output["data"]).reshape(output["shape"]), (x + 1) * 2)
    finally:
        lt.stop_server(process.pid, grace_seconds=10)
        if Path(f"/proc/{process.pid}").exists():  # stopped before it became tritonserver: not stop_server's
            os.killpg(process.pid, signal.SIGKILL)


# --- The reconciler: upload to S3, apply to the (fake) cluster, roll to a new revision, delete -------------------


@pytest.fixture
def cluster(s3_config: KubernetesConfig, tmp_path: Path, settings: Any) -> Iterator[FakeKube]:
    kube = FakeKube().start()
    kube.on_apply = fake_kube.rollout_succeeds
    settings.KUBERNETES_KUBECONFIG = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
    settings.KUBERNETES_S3_ENDPOINT_URL = s3_config.s3_endpoint_url
    settings.KUBERNETES_S3_BUCKET = s3_config.s3_bucket
    settings.KUBERNETES_S3_PREFIX = s3_config.s3_prefix
    settings.KUBERNETES_S3_REGION = REGION
    settings.KUBERNETES_S3_ACCESS_KEY_ID = settings.KUBERNETES_S3_SECRET_ACCESS_KEY = "testing"
    settings.KUBERNETES_TRITON_EGRESS = ["127.0.0.1/32"]  # where moto listens
    settings.ROLLOUT_DRAIN_SECONDS = 0
    yield kube
    kube.stop()


def test_the_reconciler_uploads_applies_rolls_out_and_cleans_up(
        alice: Person, digits: ModelVersion, cluster: FakeKube, s3_config: KubernetesConfig, tmp_path: Path) -> None:
    response = alice.client().post("/api/v1/deployments/", {"name": "digits", "runtime": "kubernetes",
                                                            "models": [{"model": "digits"}]}, format="json")
    assert response.status_code == 201, response.json()
    deployment = Deployment.objects.get()
    root = f"modelport/repositories/acme/digits-{deployment.pk}/"

    settle(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.READY, deployment.status_message
    assert deployment.upstream_url == "http://digits.modelport-acme.svc.cluster.local:8000"
    assert deployment.grpc_upstream == "digits.modelport-acme.svc.cluster.local:8001"
    assert keys(s3_config, root) == [f"{root}r1.uploaded", f"{root}r1/digits/1/model.onnx",
                                     f"{root}r1/digits/config.pbtxt"]
    config_pbtxt = s3repo.client(s3_config).get_object(Bucket=s3_config.s3_bucket,
                                                       Key=f"{root}r1/digits/config.pbtxt")["Body"].read().decode()
    assert 'backend: "onnxruntime"' in config_pbtxt  # the official image's backend, not the local python wrapper
    revision = Revision.objects.get(deployment=deployment, number=1)
    assert revision.repository == s3_config.repository_url(f"{root}r1/")
    pod = cluster.applied("Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][0] == "--model-repository=/models"
    assert "AWS_" not in json.dumps(pod) and "testing" not in json.dumps(pod)  # no S3 key anywhere in the pod
    egress = cluster.applied("NetworkPolicy")["spec"]["egress"]
    assert egress[1:] == [{"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}]}]  # DNS, then the S3 endpoint only
    # The access Secret's URLs download the repository from the real S3 server.
    access = cluster.get("/api/v1/namespaces/modelport-acme/secrets/digits-r1-repository")
    assert access is not None and "testing" not in json.dumps(access)
    work = tmp_path / "access"
    work.mkdir()
    for name, data in access["data"].items():
        (work / name).write_bytes(base64.b64decode(data))
    fetched = subprocess.run([sys.executable, "-I", str(work / "fetch.py"), str(work / "manifest.json"),
                              str(tmp_path / "models")], capture_output=True, text=True, timeout=60, check=False,
                             env={"PATH": os.environ["PATH"]})
    assert fetched.returncode == 0, fetched.stdout
    model = (tmp_path / "models" / "digits" / "1" / "model.onnx").read_bytes()
    assert hashlib.sha256(model).hexdigest() == digits.sha256  # the registry's bytes, verified on the way

    alice.client().patch("/api/v1/deployments/digits/", {"replicas": 2}, format="json")
    settle(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.READY and deployment.serving_revision.number == 2  # type: ignore[union-attr]
    assert [k.removeprefix(root) for k in keys(s3_config, root)] == [
        "r2.uploaded", "r2/digits/1/model.onnx", "r2/digits/config.pbtxt"]
    assert Event.objects.filter(deployment=deployment,
                                message="Removed the model repository of revision 1 from S3.").exists()
    assert cluster.applied("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    assert cluster.get("/api/v1/namespaces/modelport-acme/secrets/digits-r1-repository") is None  # retired
    assert cluster.get("/api/v1/namespaces/modelport-acme/secrets/digits-r2-repository") is not None

    assert alice.client().delete("/api/v1/deployments/digits/").status_code == 202
    settle(deployment.pk)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert keys(s3_config, root) == []
    # Pods go with the Deployment through Kubernetes' garbage collector, which the fake does not have.
    left = [p for p in cluster.objects if "/namespaces/modelport-acme/" in p and "/pods/" not in p]
    assert left == []


def test_an_unreachable_s3_fails_the_deployment_saying_what_to_check(
        alice: Person, digits: ModelVersion, cluster: FakeKube, settings: Any) -> None:
    settings.KUBERNETES_S3_BUCKET = "no-such-bucket"
    alice.client().post("/api/v1/deployments/", {"name": "digits", "runtime": "kubernetes",
                                                 "models": [{"model": "digits"}]}, format="json")
    deployment = Deployment.objects.get()
    settle(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.FAILED
    assert deployment.status_message.startswith(
        "The model repository cannot be uploaded to S3 (bucket 'no-such-bucket'")
    assert "NoSuchBucket" in deployment.status_message
    assert not cluster.sent("apply")
