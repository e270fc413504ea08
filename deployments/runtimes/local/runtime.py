"""The local runtime: one real Triton process per running deployment revision, on this machine.

Processes are tracked in TritonServer rows (pid, ports, revision): a restarted web server or worker adopts a live
process instead of starting a second one. Each runs in a sandbox (modelport.core.sandbox, docs/security.md) when this
machine's kernel can build one; where it cannot, python models (uploaded code) are refused if SANDBOX_REQUIRED.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments import logtail, server_memory
from deployments.models import Deployment, Pool, Revision, TritonServer
from deployments.render import RenderError
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import (
    Health,
    Launch,
    Observation,
    Preparation,
    RuntimeUnavailable,
    TemporaryServer,
    TemporaryServerFailed,
    Wake,
)
from deployments.runtimes.local import confined, pool, pool_memory, pyenv, readiness, serverlog, sweeps
from deployments.runtimes.local import triton as local_triton
from deployments.runtimes.local.files import deployment_dir, render, render_spec, repository_dir
from deployments.runtimes.local.policy import plan_errors, resource_errors
from modelport.core.runtime_env import RuntimeEnvError
from modelport.core.sandbox import cgroups
from models_registry.models import record_memory

log = logging.getLogger(__name__)


def isolation(deployment: Deployment) -> dict[str, Any]:
    """What the deployment page shows: does its Triton run sandboxed ({"sandboxed": None} when none runs). A shared
    deployment's Triton is its pool's: a deployment of its own has none, and "–" read as "not known"."""
    revision = deployment.serving_revision or deployment.revision
    if revision is not None and revision.spec.placement.shared:
        shared = pool.server_isolation(revision.spec.placement.pool)
        if shared is not None:
            return shared
    server = (TritonServer.objects.filter(deployment=deployment, state__in=[TritonServer.State.STARTING,
                                                                              TritonServer.State.READY])
              .order_by("-started_at").first())
    if server is None:
        return {"sandboxed": None, "note": "", "egress": deployment.allow_egress}
    return {"sandboxed": server.sandboxed, "note": server.sandbox_note, "egress": server.allow_egress}


def _launch(revision: Revision) -> TritonServer:
    deployment = revision.deployment
    for server in TritonServer.objects.filter(revision=revision,
                                              state__in=[TritonServer.State.STARTING, TritonServer.State.READY]):
        if local_triton.is_alive(server.pid):
            if server.allow_egress == deployment.allow_egress:
                return server
            continue  # started before an operator changed egress: a new server replaces it, retire() stops it
        TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.STOPPED, stopped_at=timezone.now())
        clean_up(server)
    started = timezone.now()
    confined.prune_logs(repository_dir(revision).parent)
    log_path = repository_dir(revision).parent / f"triton-{started:%Y%m%dT%H%M%S%f}.log"
    launched = confined.start_confined(revision.spec, repository_dir(revision), deployment_dir(deployment) / "scratch",
                                       log_path, egress=deployment.allow_egress, label=f"revision {revision.number}",
                                       traced=True)
    if launched.pyenv_key is not None:
        # What this revision's servers run with, for the clean-up: the key a revision computes changes when the
        # runtime env does, while its running Triton keeps using the environment it started with.
        (repository_dir(revision).parent / "pyenv").write_text(launched.pyenv_key)
    process, sandbox_id, note, egress = launched.process, launched.sandbox_id, launched.note, deployment.allow_egress
    return TritonServer.objects.create(
        deployment=deployment, revision=revision, pid=process.pid, http_port=process.http_port,
        grpc_port=process.grpc_port, metrics_port=process.metrics_port, log_path=str(process.log_path),
        started_at=started,
        sandboxed=process.sandboxed, sandbox_note=note, sandbox_id=sandbox_id, cgroups=list(process.cgroups),
        allow_egress=egress, admin_key=process.admin_key,
    )


def _process(server: TritonServer) -> local_triton.ServerProcess:
    return local_triton.ServerProcess(
        pid=server.pid, http_port=server.http_port, grpc_port=server.grpc_port, metrics_port=server.metrics_port,
        started_at=server.started_at, log_path=Path(server.log_path),
    )


def _measure(server: TritonServer) -> None:
    """Keep what each model's own processes took at their peak, per instance, as its version's measured memory
    (the most seen): the next dedicated deployment of it is limited from that (deployments/server_memory.py)."""
    revision = server.revision
    entries = [m for m in revision.spec.models if not m.is_pipeline and m.version_id is not None]
    peaks = pool_memory.model_peaks(server.pid, repository_dir(revision), [m.name for m in entries])
    for entry in entries:
        if peaks[entry.name] and entry.version_id is not None:
            record_memory(entry.version_id, peaks[entry.name] // max(entry.instance_group.count, 1),
                          "its use in a dedicated deployment on this machine")


def _describe(server: TritonServer) -> Launch:
    confinement = "sandboxed" + (", egress allowed" if server.allow_egress else "") if server.sandboxed \
        else "not sandboxed"
    return Launch(revision_id=server.revision_id, url=server.url, grpc_target=server.grpc_target, ref=server.pk,
                  description=f"pid {server.pid}, port {server.http_port}, {confinement}")


def _stop(server: TritonServer) -> None:
    local_triton.stop_server(server.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
    TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.STOPPED, stopped_at=timezone.now())
    clean_up(server)


def clean_up(server: TritonServer) -> None:
    """Remove what the stopped server's sandbox left: its cgroups and scratch directory."""
    if server.cgroups:
        confined.remove_cgroups(server.cgroups)
    if server.sandbox_id:
        shutil.rmtree(confined.scratch_dir(server), ignore_errors=True)


def _oom_killed(server: TritonServer) -> bool:
    """Whether the kernel killed a process of the server at its cgroup's memory limit (memory.events oom_kill:
    the server's cgroups are its own, made at its launch)."""
    return bool(server.cgroups) and cgroups.oom_kills([Path(d) for d in server.cgroups]) > 0


def _memory_limit(server: TritonServer) -> str:
    """The memory limit the server runs under, as the revision gave it ("4Gi") or derived it, and in MiB."""
    spec = server.revision.spec
    limit = confined.limits_for(spec).memory_bytes
    given = spec.memory_limit(settings.SANDBOX_DEFAULT_MEMORY)
    derived = (", derived from what its models were measured to take"
               if server_memory.in_effect(spec)["source"] == "derived" else "")
    return f"{given}, {(limit or 0) / 2**20:.0f} MiB{derived}"


def _memory_report(server: TritonServer) -> str:
    """A sentence when the kernel killed one of the server's processes at the sandbox's memory limit."""
    if not _oom_killed(server):
        return ""
    return (f"Out of memory: a process of this deployment needed more than its limit of {_memory_limit(server)} "
            f"and the kernel killed it. {_more_memory(server)}, or load less.")


def _more_memory(server: TritonServer) -> str:
    """How to give the deployment more memory: the API's field and the CLI's flag, with twice its limit."""
    limit = confined.limits_for(server.revision.spec).memory_bytes or 2**30
    return (f"Give it more memory: resources.memory in the API, or modelport deploy {server.deployment.name} "
            f"--memory {2 * limit // 2**20}Mi")


def _death_report(server: TritonServer) -> str:
    """What a user needs to know about a server that died: Triton's errors, else its last log lines."""
    limits = confined.log_limits()
    serverlog.wait_log_written(Path(server.log_path))
    errors = serverlog.log_errors(Path(server.log_path), **limits)
    lines = errors or serverlog.tail_log(Path(server.log_path), 5, **limits).splitlines()
    memory = _memory_report(server)
    return logtail.excerpt("\n".join(([memory] if memory else []) + lines[-5:]), settings.LOG_EXCERPT_MAX_CHARS)


def running_servers(deployment: Deployment) -> list[TritonServer]:
    return list(
        TritonServer.objects.select_related("revision")
        .filter(deployment=deployment, state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
    )


# `make stop-triton` (the local_tritons command) leaves this beside a stopped server's log, so that the next health
# check tells the deployment it was stopped on purpose instead of reporting a crash.
_OPERATOR_STOP = ".stopped-by-operator"


def mark_stopped_by_operator(pids: Sequence[int]) -> None:
    """Note that the dedicated Tritons at `pids` were stopped by hand; their rows stay as they were (the portal may
    be stopped, and the next health check starts them again)."""
    for log_path, pid in TritonServer.objects.filter(pid__in=list(pids)).exclude(
            state=TritonServer.State.STOPPED).values_list("log_path", "pid"):
        Path(log_path + _OPERATOR_STOP).write_text(str(pid))


def _stopped_by_operator(server: TritonServer) -> bool:
    """Whether `server` is the one an operator stopped: the mark names its pid, so that a later server writing the
    same log (its revision started again) is not taken for it when it dies."""
    marker = Path(server.log_path + _OPERATOR_STOP)
    try:
        stopped = marker.read_text()
    except OSError:
        return False
    marker.unlink(missing_ok=True)
    return stopped == str(server.pid) and not local_triton.is_alive(server.pid)


class LocalRuntime:
    """One tritonserver process per revision on this machine; a rollout starts the new one beside the old. A
    revision placed in a pool is the pool launcher's (local/pool.py, LocalPoolRuntime; runtimes/placed.py)."""

    poll_seconds = 1.0

    @property
    def ready_timeout_seconds(self) -> float:
        return float(settings.TRITON_READY_TIMEOUT_SECONDS)

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        return plan_errors(spec)

    def prepare(self, revision: Revision) -> Preparation:
        errors = resource_errors(revision.spec.resources)
        if errors:
            raise RenderError(errors)
        render(revision)
        return pyenv.prepare_python_env(revision)

    def launch(self, revision: Revision) -> Launch:
        try:
            return _describe(_launch(revision))
        except RuntimeEnvError as exc:
            raise RuntimeUnavailable(f"The local runtime cannot start Triton: {exc}") from None

    def observe(self, launch: Launch) -> Observation:
        server = TritonServer.objects.select_related("revision").filter(pk=launch.ref).first()
        if server is None or server.state == TritonServer.State.STOPPED:
            return Observation("failed", "its Triton process was stopped")
        result = readiness.probe(_process(server), server.revision.spec.model_names)
        detail = "\n".join(result.errors[-5:])
        if result.ready:
            TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.READY)
            _measure(server)
            return Observation("ready", "ready")
        confinement = next((e for e in result.errors if e.startswith(serverlog.SANDBOX_ERROR_PREFIX)), None)
        if confinement:
            return Observation("failed", f"The sandbox {confinement.removeprefix(serverlog.SANDBOX_ERROR_PREFIX)}",
                               detail)
        memory = _memory_report(server)
        alive = local_triton.is_alive(server.pid)
        if memory and alive:
            # A stub killed at the limit leaves Triton waiting for it: stop here with the reason.
            return Observation("failed", memory, detail)
        if result.exit_code is not None or not alive:
            return Observation("failed", f"{memory} {result.message}" if memory else result.message, detail)
        return Observation("starting", result.message, detail)

    def abandon(self, launch: Launch) -> None:
        server = TritonServer.objects.filter(pk=launch.ref).first()
        if server is not None and server.state != TritonServer.State.STOPPED:
            _stop(server)

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        server = TritonServer.objects.select_related("revision").filter(pk=launch.ref).first()
        if server is None or server.state != TritonServer.State.READY:
            return Health(False, "no Triton process is serving it")
        killed = _oom_killed(server)
        if local_triton.is_alive(server.pid) and not killed:
            _measure(server)
            return Health(True)
        if _stopped_by_operator(server):
            _stop(server)
            return Health(False, f"its Triton (pid {server.pid}) was stopped by an operator (make stop-triton)",
                          expected=True)
        report = _death_report(server)
        _stop(server)
        if killed:
            # Triton may outlive a python model's stub that the kernel killed at the limit, the model then answering
            # nothing: the deployment is not ready, and says why.
            return Health(False, f"killed for memory (limit {_memory_limit(server)}). {_more_memory(server)}",
                          report)
        return Health(False, f"the Triton process (pid {server.pid}) died", report)

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        kept = {launch.ref for launch in keep}
        stopped = []
        for server in running_servers(deployment):
            if server.pk not in kept:
                _stop(server)
                stopped.append(f"Stopped the Triton of revision {server.revision.number} (pid {server.pid}).")
        return stopped

    def stop(self, deployment: Deployment) -> None:
        for server in running_servers(deployment):
            _stop(server)

    def teardown(self, deployment: Deployment) -> None:
        self.stop(deployment)
        shutil.rmtree(deployment_dir(deployment), ignore_errors=True)

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        revision = revision or deployment.serving_revision or deployment.revision
        if revision is None:
            return ""
        # That revision's newest server: a canary rolled back (or a failed rollout) started after the server that
        # serves, and its log says nothing about what serves.
        server = TritonServer.objects.filter(deployment=deployment, revision=revision).order_by("-started_at").first()
        return serverlog.tail_log(Path(server.log_path), lines, **confined.log_limits()) if server else ""

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        return Wake(failure="its revision is not in a pool")  # placed.py sends a pool's wakes to LocalPoolRuntime

    def unload_idle(self) -> list[str]:
        return []  # a server of its own is never unloaded for being idle

    def sweep_orphans(self) -> list[str]:
        """The Tritons of this var/ no row knows, dedicated and pools' alike (local/sweeps.py)."""
        return sweeps.sweep_orphans()

    def refresh_access(self) -> int:
        return 0  # its servers read their repositories from this machine's disk

    # --- What the pages, the API and the tuner ask (base.Answers) ------------------------------------------------

    can_tune = True  # a tune's temporary Tritons run on this machine, as the deployment's own does

    def configuration_problems(self) -> list[str]:
        return []

    def isolation(self, deployment: Deployment) -> dict[str, Any] | None:
        return isolation(deployment)

    def server_alive(self, pid: int) -> bool:
        return local_triton.is_alive(pid)

    def start_temporary(self, spec: RevisionSpec, workdir: Path, label: str) -> TemporaryServer:
        # Through the sandboxed launcher every deployment's Triton starts with (confined.start_confined).
        repository = workdir / "repository"
        render_spec(spec, repository)
        started = confined.start_confined(spec, repository, workdir / "scratch", workdir / "triton.log", label=label)
        ready = readiness.wait_ready(started.process, spec.model_names,
                                     timeout=float(settings.TRITON_READY_TIMEOUT_SECONDS))
        if not ready.ready:
            confined.stop_confined(started)
            raise TemporaryServerFailed(ready.message)
        return TemporaryServer(http_url=started.process.http_url, handle=started)

    def stop_temporary(self, server: TemporaryServer) -> None:
        assert isinstance(server.handle, confined.Confined)
        confined.stop_confined(server.handle)

    def temporary_processes(self, root: Path) -> list[tuple[int, float]]:
        return [(pid, local_triton.process_age(pid)) for pid in local_triton.find_servers(f"{root}/")]

    def stop_process(self, pid: int) -> None:
        local_triton.stop_server(pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)

    def refresh_pool_figures(self, shared: Pool) -> None:
        pool.refresh_figures(shared)
