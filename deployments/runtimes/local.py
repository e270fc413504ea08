"""The local runtime: one real Triton process per running deployment revision, on this machine.

Processes are tracked in TritonServer rows (pid, ports, revision): a restarted web server or worker adopts a live
process instead of starting a second one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from deployments import local_triton, python_requirements
from deployments.models import Deployment, Revision, TritonServer
from deployments.render import render_repository
from deployments.runtimes.base import Health, Launch, Ready
from deployments.snapshot import repository_spec
from models_registry.models import Blob
from models_registry.storage import FilesystemStore, get_store
from models_registry.validation import archive_limits


@lru_cache(maxsize=1)
def runtime_env() -> local_triton.RuntimeEnv:
    return local_triton.find_runtime_env(settings.MODELPORT_RUNTIME_ENV)


def local_has_torch() -> bool:
    try:
        return runtime_env().has_module("torch")
    except local_triton.RuntimeEnvError:
        return False


def missing_requirements(lines: list[str]) -> list[python_requirements.Requirement]:
    """The requirements of a python model that the runtime env cannot import ([] without a runtime env: then
    nothing can be served locally, and the deployment fails with the runtime env's own message)."""
    if not lines:
        return []
    try:
        env = runtime_env()
    except local_triton.RuntimeEnvError:
        return []
    return python_requirements.missing_requirements(env.bin_dir / "python", env.site_packages, lines,
                                                    env=local_triton.server_environment(env))


def deployment_dir(deployment: Deployment) -> Path:
    return Path(settings.DEPLOYMENTS_DIR) / str(deployment.pk)


def repository_dir(revision: Revision) -> Path:
    return deployment_dir(revision.deployment) / f"r{revision.number}" / "repository"


def artifact_path(sha256: str) -> Path:
    """A local file holding the blob: the store's own file, or a cached download from S3."""
    store = get_store()
    key = Blob.key_for(sha256)
    if isinstance(store, FilesystemStore):
        return store.path(key)
    cached = Path(settings.VAR_DIR) / "cache" / "blobs" / sha256
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".part")
        with store.open(key) as source, open(tmp, "wb") as out:
            shutil.copyfileobj(source, out, 1024 * 1024)
        tmp.replace(cached)
    return cached


def render(revision: Revision) -> Path:
    """Render the revision's repository (idempotent: an existing complete render is reused)."""
    out = repository_dir(revision)
    if (out.parent / "rendered").exists():
        return out
    spec = repository_spec(revision.spec, lambda entry: artifact_path(entry["sha256"]) if entry.get("sha256") else None)
    render_repository(spec, "local", out, local_has_torch=local_has_torch(), archive_limits=archive_limits())
    (out.parent / "rendered").write_text(timezone.now().isoformat())
    Revision.objects.filter(pk=revision.pk).update(repository=str(out))
    return out


def _launch(revision: Revision) -> TritonServer:
    for server in TritonServer.objects.filter(revision=revision, state__in=[TritonServer.State.STARTING, TritonServer.State.READY]):
        if local_triton.is_alive(server.pid):
            return server
        TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.STOPPED, stopped_at=timezone.now())
    env = runtime_env()
    backend_dir = local_triton.build_backend_dir(env, Path(settings.VAR_DIR))
    wants_cache = any(m.get("response_cache") for m in revision.spec["models"])
    started = timezone.now()
    log_path = repository_dir(revision).parent / f"triton-{started:%Y%m%dT%H%M%S%f}.log"
    process = local_triton.start_server(
        repository_dir(revision), log_path, env, backend_dir,
        response_cache_bytes=settings.TRITON_RESPONSE_CACHE_BYTES if wants_cache else 0,
    )
    return TritonServer.objects.create(
        deployment=revision.deployment, revision=revision, pid=process.pid, http_port=process.http_port,
        grpc_port=process.grpc_port, metrics_port=process.metrics_port, log_path=str(process.log_path), started_at=started,
    )


def _process(server: TritonServer) -> local_triton.ServerProcess:
    return local_triton.ServerProcess(
        pid=server.pid, http_port=server.http_port, grpc_port=server.grpc_port, metrics_port=server.metrics_port,
        started_at=server.started_at, log_path=Path(server.log_path),
    )


def _describe(server: TritonServer) -> Launch:
    return Launch(revision_id=server.revision_id, url=server.url, grpc_target=server.grpc_target, ref=server.pk,
                  description=f"pid {server.pid}, port {server.http_port}")


def _stop(server: TritonServer) -> None:
    local_triton.stop_server(server.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
    TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.STOPPED, stopped_at=timezone.now())


def _death_report(server: TritonServer) -> str:
    """What a user needs to know about a server that died: Triton's errors, else its last log lines."""
    errors = local_triton.log_errors(Path(server.log_path))
    lines = errors or local_triton.tail_log(Path(server.log_path), 5).splitlines()
    return "\n".join(lines[-5:])


def running_servers(deployment: Deployment) -> list[TritonServer]:
    return list(
        TritonServer.objects.select_related("revision")
        .filter(deployment=deployment, state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
    )


class LocalRuntime:
    """One tritonserver process per revision on this machine; a rollout starts the new one beside the old."""

    def prepare(self, revision: Revision) -> None:
        render(revision)

    def launch(self, revision: Revision) -> Launch:
        return _describe(_launch(revision))

    def wait_ready(self, launch: Launch, keep_waiting: Callable[[], bool]) -> Ready:
        server = TritonServer.objects.select_related("revision").get(pk=launch.ref)
        models = [m["name"] for m in server.revision.spec["models"]]
        deadline = timezone.now().timestamp() + settings.TRITON_READY_TIMEOUT_SECONDS
        while True:
            # Short slices, so that the caller renews its lease and notices when the user changed their mind.
            result = local_triton.wait_ready(_process(server), models, timeout=1.0)
            if result.ready:
                TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.READY)
                return Ready(True, "ready")
            if result.exit_code is not None or not local_triton.is_alive(server.pid):
                return Ready(False, result.message, "\n".join(result.errors[-5:]))
            if timezone.now().timestamp() >= deadline:
                return Ready(False, f"not ready after {settings.TRITON_READY_TIMEOUT_SECONDS:g} s: {result.message}",
                             "\n".join(result.errors[-5:]))
            if not keep_waiting():
                return Ready(False, "cancelled", cancelled=True)

    def abandon(self, launch: Launch) -> None:
        server = TritonServer.objects.filter(pk=launch.ref).first()
        if server is not None:
            _stop(server)

    def check(self, deployment: Deployment) -> Health:
        server = None
        if deployment.serving_revision_id is not None:  # (a server always has a revision)
            server = TritonServer.objects.filter(revision_id=deployment.serving_revision_id,
                                                 state=TritonServer.State.READY).first()
        if server is not None and local_triton.is_alive(server.pid):
            return Health(True)
        if server is None:
            return Health(False, "no Triton process is serving it")
        report = _death_report(server)
        _stop(server)
        return Health(False, f"the Triton process (pid {server.pid}) died", report)

    def retire(self, deployment: Deployment, keep: Launch) -> list[str]:
        stopped = []
        for server in running_servers(deployment):
            if server.pk != keep.ref:
                _stop(server)
                stopped.append(f"Stopped the Triton of revision {server.revision.number} (pid {server.pid}).")
        return stopped

    def stop(self, deployment: Deployment) -> None:
        for server in running_servers(deployment):
            _stop(server)

    def teardown(self, deployment: Deployment) -> None:
        self.stop(deployment)
        shutil.rmtree(deployment_dir(deployment), ignore_errors=True)

    def logs(self, deployment: Deployment, lines: int) -> str:
        server = TritonServer.objects.filter(deployment=deployment).order_by("-started_at").first()
        return local_triton.tail_log(Path(server.log_path), lines) if server else ""
