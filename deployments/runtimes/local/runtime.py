"""The local runtime: one real Triton process per running deployment revision, on this machine.

Processes are tracked in TritonServer rows (pid, ports, revision): a restarted web server or worker adopts a live
process instead of starting a second one. Each runs in a sandbox (deployments.sandbox, docs/security.md) when this
machine's kernel can build one; where it cannot, python models (uploaded code) are refused if SANDBOX_REQUIRED.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments import frameworks, pyenvs, sandbox
from deployments.models import Deployment, Revision, TritonServer
from deployments.render import RenderError, render_repository
from deployments.revision_spec import ModelEntry, Resources, RevisionSpec
from deployments.runtimes.artifacts import artifact_path
from deployments.runtimes.base import (
    PREPARED,
    Health,
    Launch,
    Observation,
    Preparation,
    PreparationFailed,
    RuntimeUnavailable,
)
from deployments.runtimes.local import triton as local_triton
from deployments.sandbox import cgroups
from deployments.spec import validate_repository
from models_registry import formats
from models_registry.validation import archive_limits

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def runtime_env() -> local_triton.RuntimeEnv:
    return local_triton.find_runtime_env(settings.MODELPORT_RUNTIME_ENV)


# --- The sandbox ---------------------------------------------------------------------------------------------------


def sandbox_options() -> sandbox.Options:
    return sandbox.Options(
        uid=settings.SANDBOX_UID, gid=settings.SANDBOX_GID, shm_bytes=sandbox.memory_bytes(settings.SANDBOX_SHM_SIZE),
        pids_max=settings.SANDBOX_PIDS_MAX, egress_ports=tuple(int(p) for p in settings.SANDBOX_EGRESS_PORTS),
        cgroup_parent=settings.SANDBOX_CGROUP_PARENT,
    )


@lru_cache(maxsize=1)
def sandbox_capabilities() -> sandbox.Capabilities:
    """What this machine's kernel offers, checked once per process by building a throw-away sandbox."""
    if not settings.SANDBOX_ENABLED:
        return sandbox.Capabilities(False, "SANDBOX_ENABLED is false")
    caps = sandbox.check(sandbox_options())
    (log.info if caps.available and not caps.notes else log.warning)("Triton sandbox: %s", caps.describe())
    return caps


def runs_uploaded_code(spec: RevisionSpec) -> bool:
    """Whether the revision executes code a team uploaded: python models (pipeline steps included). ONNX files are
    data, read by onnxruntime inside Modelport's own python model."""
    return any(m.format == formats.PYTHON for m in spec.models)


def sandbox_refusal(spec: RevisionSpec) -> str | None:
    """Why the local runtime refuses this revision on this machine (fail closed), or None."""
    if not settings.SANDBOX_REQUIRED or not runs_uploaded_code(spec):
        return None
    caps = sandbox_capabilities()
    if caps.available:
        return None
    return (f"This machine cannot sandbox uploaded code ({caps.reason}), and python models run uploaded code, so "
            "the local runtime refuses them here. Deploy to Kubernetes, or ask an operator to make the sandbox work "
            "(docs/security.md) or to opt out with SANDBOX_REQUIRED=false.")


def limits_for(spec: RevisionSpec) -> cgroups.Limits:
    """The revision's resources.memory / resources.cpu as cgroup limits (ValueError: not a valid quantity)."""
    memory = spec.resources.memory or settings.SANDBOX_DEFAULT_MEMORY
    cpu = spec.resources.cpu
    return cgroups.Limits(sandbox.memory_bytes(str(memory)) if memory else None,
                          sandbox.cpu_millicores(str(cpu)) if cpu else None, settings.SANDBOX_PIDS_MAX)


def resource_errors(resources: Resources) -> dict[str, list[str]]:
    """resources.memory and resources.cpu the local runtime cannot enforce, per field."""
    errors: dict[str, list[str]] = {}
    for key, parse in (("memory", sandbox.memory_bytes), ("cpu", sandbox.cpu_millicores)):
        value = getattr(resources, key)
        if not value:
            continue
        try:
            parse(str(value))
        except ValueError as exc:
            errors[f"resources.{key}"] = [str(exc)]
    return errors


def _var_tag() -> str:
    """Short and stable per VAR_DIR: names this var/'s cgroups, so that sweeping never touches another's."""
    return hashlib.sha256(str(settings.VAR_DIR).encode()).hexdigest()[:8]


def scratch_dir(server: TritonServer) -> Path:
    return deployment_dir(server.deployment) / "scratch" / server.sandbox_id


def isolation(deployment: Deployment) -> dict[str, Any]:
    """What the deployment page shows: does its Triton run sandboxed ({"sandboxed": None} when none runs)."""
    server = (TritonServer.objects.filter(deployment=deployment, state__in=[TritonServer.State.STARTING,
                                                                              TritonServer.State.READY])
              .order_by("-started_at").first())
    if server is None:
        return {"sandboxed": None, "note": "", "egress": deployment.allow_egress}
    return {"sandboxed": server.sandboxed, "note": server.sandbox_note, "egress": server.allow_egress}


# --- Python models' requirements (deployments/pyenvs.py) ------------------------------------------------------------


@dataclass(frozen=True)
class PythonEnv:
    """The environment a revision's Triton runs with: its python models' requirements installed over the runtime
    env."""

    key: str
    requirements: tuple[str, ...]
    identity: pyenvs.RuntimeIdentity

    @property
    def env_dir(self) -> Path:
        return pyenv_layout().env_dir(self.key)

    @property
    def site_packages(self) -> Path:
        return pyenv_layout().site_packages(self.key, self.identity)


def pyenv_layout() -> pyenvs.Layout:
    return pyenvs.Layout(Path(settings.PYENVS_DIR))


def python_env_for(spec: RevisionSpec) -> PythonEnv | None:
    """The environment the revision needs: the union of its python models' requirements (pipeline steps
    included; one Triton runs them all), normalized. None when they need nothing the runtime env lacks.

    Raises RequirementError, RuntimeEnvError (no runtime env) or pyenvs.BuildError (its python cannot run)."""
    lines = [line for entry in spec.models for line in entry.requirements]
    if not lines:
        return None
    parsed = pyenvs.parse_requirements(lines)
    env = runtime_env()
    identity = pyenvs.runtime_identity(env.bin_dir / "python", env.site_packages,
                                       env=local_triton.server_environment(env))
    if all(pyenvs.satisfied_by(r, identity) for r in parsed):
        return None
    requirements = pyenvs.normalized(parsed)
    return PythonEnv(pyenvs.env_key(requirements, identity), requirements, identity)


def pip_options() -> pyenvs.PipOptions:
    return pyenvs.PipOptions(index_url=settings.MODELPORT_PIP_INDEX_URL, find_links=settings.MODELPORT_PIP_FIND_LINKS,
                             timeout_seconds=settings.MODELPORT_PIP_TIMEOUT_SECONDS)


def _requested_for_at_most() -> float:
    """A build asked for longer ago than this is presumed lost (its worker died): ask again."""
    return float(settings.MODELPORT_PIP_TIMEOUT_SECONDS) + 120.0


def prepare_python_env(revision: Revision) -> Preparation:
    """Is the revision's environment built? If nobody builds it, queue its build (a worker on the inspection
    queue; never in a web request nor in a reconciler tick). A failed build fails the revision with pip's lines."""
    try:
        penv = python_env_for(revision.spec)
    except pyenvs.RequirementError as exc:
        raise RenderError({"requirements": [str(exc)]}) from None
    except local_triton.RuntimeEnvError as exc:
        raise RuntimeUnavailable(f"The local runtime cannot install python packages: {exc}") from None
    except pyenvs.BuildError as exc:
        raise RuntimeUnavailable(str(exc)) from None
    if penv is None:
        return PREPARED
    layout = pyenv_layout()
    found = pyenvs.state_of(layout, penv.key, _requested_for_at_most())
    if found.state == "missing":
        if not _queue_build(revision, penv):
            return Preparation(False, f"Waiting for the task queue to build the python environment of revision "
                                      f"{revision.number} (the broker is unreachable).", retry_seconds=5.0,
                               building=True)
        found = pyenvs.state_of(layout, penv.key, _requested_for_at_most())  # built already when tasks run eagerly
    if found.state == "built":
        return PREPARED
    if found.state == "failed":
        detail = pyenvs.forget_failure(layout, penv.key) or found.message
        # pip's last "ERROR:" line says it in one line (the CLI and the badges show the first line of a status).
        errors = [line.removeprefix("ERROR:").strip() for line in detail.splitlines() if line.startswith("ERROR:")]
        raise PreparationFailed(f"pip could not install its python packages ({', '.join(penv.requirements)})"
                                + (f": {errors[-1]}" if errors else ""), detail)
    return Preparation(False, f"Installing python packages for revision {revision.number}: "
                              f"{', '.join(penv.requirements)}.", retry_seconds=2.0, building=True)


def _queue_build(revision: Revision, penv: PythonEnv) -> bool:
    """Queue the build; False when the broker cannot be reached (a later tick asks again)."""
    from deployments.tasks import BROKER_DOWN, build_python_env

    pyenvs.mark_requested(pyenv_layout(), penv.key, penv.requirements)
    try:
        build_python_env.delay(revision.pk)
    except BROKER_DOWN as exc:
        log.warning("could not queue the build of python environment %s: %s", penv.key, exc)
        pyenv_layout().requested_file(penv.key).unlink(missing_ok=True)
        return False
    return True


def build_python_env(revision_id: int) -> int | None:
    """Build the revision's environment (the Celery task's work); the id of its deployment, None when there is
    nothing to build (the revision is gone, or needs no environment)."""
    revision = Revision.objects.select_related("deployment").filter(pk=revision_id).first()
    if revision is None:
        return None
    try:
        penv = python_env_for(revision.spec)
    except (pyenvs.RequirementError, local_triton.RuntimeEnvError, pyenvs.BuildError) as exc:
        log.warning("no python environment for revision %s: %s", revision_id, exc)
        return revision.deployment_id
    if penv is None:
        return None
    env = runtime_env()
    started = time.monotonic()
    result = pyenvs.build(pyenv_layout(), penv.key, penv.requirements, env.bin_dir / "python", env.site_packages,
                          penv.identity, pip_options())
    log.info("python environment %s for %s: %s in %.1f s", penv.key, ", ".join(penv.requirements), result.outcome,
             time.monotonic() - started)
    return revision.deployment_id


def deployment_dir(deployment: Deployment) -> Path:
    return Path(settings.DEPLOYMENTS_DIR) / str(deployment.pk)


def repository_dir(revision: Revision) -> Path:
    return deployment_dir(revision.deployment) / f"r{revision.number}" / "repository"


def render(revision: Revision) -> Path:
    """Render the revision's repository (idempotent: an existing complete render is reused)."""
    out = repository_dir(revision)
    if (out.parent / "rendered").exists():
        return out
    render_spec(revision.spec, out)
    (out.parent / "rendered").write_text(timezone.now().isoformat())
    Revision.objects.filter(pk=revision.pk).update(repository=str(out))
    return out


def render_spec(spec: RevisionSpec, out: Path) -> None:
    """Render `spec`'s repository into `out`, readable by the sandbox's uid (RenderError: it cannot be served)."""
    render_repository(spec.repository(lambda entry: artifact_path(entry.sha256)), "local", out,
                      local_frameworks=frameworks.local_frameworks(), archive_limits=archive_limits())
    pyenvs.readable_by_all(out)


@dataclass(frozen=True)
class Confined:
    """A tritonserver started by start_confined(): the process, and what stop_confined() cleans up."""

    process: local_triton.ServerProcess
    sandbox_id: str
    scratch: Path
    note: str
    pyenv_key: str | None = None  # the python environment it runs with (deployments.pyenvs), if any


def start_confined(spec: RevisionSpec, repository: Path, scratch_root: Path, log_path: Path, *,
                   egress: bool = False, label: str = "this server") -> Confined:
    """Start a Triton for `spec`'s rendered `repository` as every local deployment's Triton starts: refused where
    the sandbox is required and missing, else sandboxed where this kernel can, with the spec's resource limits, on
    free ports. Deployments (a TritonServer row records it) and tuning (tuning/runner.py: temporary servers)
    both start theirs here. RuntimeUnavailable: it cannot start on this machine."""
    refusal = sandbox_refusal(spec)
    if refusal:
        raise RuntimeUnavailable(refusal)
    env = runtime_env()
    try:
        penv = python_env_for(spec)
    except (pyenvs.RequirementError, pyenvs.BuildError) as exc:
        raise RuntimeUnavailable(f"The python environment of {label}: {exc}") from None
    bin_dirs, virtual_env = [env.bin_dir], env.root
    if penv is not None:
        if pyenvs.state_of(pyenv_layout(), penv.key, 0).state != "built":
            raise RuntimeUnavailable(f"The python environment of {label} is gone (removed while it was starting): "
                                     "start it again to rebuild it.")
        pyenvs.touch(pyenv_layout(), penv.key)
        # The stub's embedded interpreter ignores PYTHONPATH but takes its prefix from the first python3 on PATH:
        # the environment's, whose site-packages comes first and adds the runtime env's behind it (its .pth file).
        bin_dirs, virtual_env = [penv.env_dir / "bin", env.bin_dir], penv.env_dir
    caps = sandbox_capabilities()
    options = sandbox_options()
    backend_dir = local_triton.build_backend_dir(env, Path(settings.VAR_DIR), sandboxed=caps.available)
    wants_cache = any(m.response_cache for m in spec.models)
    sandbox_id = secrets.token_hex(8)
    scratch = scratch_root / sandbox_id
    sandbox.prepare_scratch(scratch, options)
    environment = sandbox.environment(bin_dirs, scratch, {
        "VIRTUAL_ENV": str(virtual_env),
        # Read by the python-backend stub wrapper (deployments/sandbox/stub.py).
        "MODELPORT_SANDBOX_NET": "egress" if egress else "none",
        "MODELPORT_SANDBOX_EGRESS_PORTS": ",".join(str(p) for p in options.egress_ports) if egress else "",
    })
    confinement = None
    if caps.available:
        box = sandbox.Spec(
            read_only=(repository, backend_dir, env.root, env.base_prefix,
                       *((penv.env_dir,) if penv is not None else ())), scratch=scratch,
            tcp_ports=(), egress=egress, name=f"mp-{_var_tag()}-{sandbox_id}", limits=limits_for(spec),
        )
        confinement = sandbox.Sandbox(box, caps, options)
    try:
        process = local_triton.start_server(
            repository, log_path, env, backend_dir,
            response_cache_bytes=settings.TRITON_RESPONSE_CACHE_BYTES if wants_cache else 0,
            env=environment, sandbox=confinement,
        )
    except sandbox.SandboxError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeUnavailable(f"The sandbox for Triton could not be built: {exc}") from None
    note = "; ".join(caps.notes) if caps.available else caps.reason
    return Confined(process=process, sandbox_id=sandbox_id, scratch=scratch, note=note,
                    pyenv_key=penv.key if penv is not None else None)


def stop_confined(confined: Confined) -> None:
    """Stop a server start_confined() started and remove what its sandbox left (its cgroups, its scratch)."""
    local_triton.stop_server(confined.process.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
    if confined.process.cgroups:
        cgroups.remove([Path(d) for d in confined.process.cgroups], wait_seconds=2.0)
    shutil.rmtree(confined.scratch, ignore_errors=True)


def _launch(revision: Revision) -> TritonServer:
    deployment = revision.deployment
    for server in TritonServer.objects.filter(revision=revision, state__in=[TritonServer.State.STARTING, TritonServer.State.READY]):
        if local_triton.is_alive(server.pid):
            if server.allow_egress == deployment.allow_egress:
                return server
            continue  # started before an operator changed egress: a new server replaces it, retire() stops it
        TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.STOPPED, stopped_at=timezone.now())
        clean_up(server)
    started = timezone.now()
    log_path = repository_dir(revision).parent / f"triton-{started:%Y%m%dT%H%M%S%f}.log"
    confined = start_confined(revision.spec, repository_dir(revision), deployment_dir(deployment) / "scratch",
                              log_path, egress=deployment.allow_egress, label=f"revision {revision.number}")
    if confined.pyenv_key is not None:
        # What this revision's servers run with, for the clean-up: the key a revision computes changes when the
        # runtime env does, while its running Triton keeps using the environment it started with.
        (repository_dir(revision).parent / "pyenv").write_text(confined.pyenv_key)
    process, sandbox_id, note, egress = confined.process, confined.sandbox_id, confined.note, deployment.allow_egress
    return TritonServer.objects.create(
        deployment=deployment, revision=revision, pid=process.pid, http_port=process.http_port,
        grpc_port=process.grpc_port, metrics_port=process.metrics_port, log_path=str(process.log_path), started_at=started,
        sandboxed=process.sandboxed, sandbox_note=note, sandbox_id=sandbox_id, cgroups=list(process.cgroups),
        allow_egress=egress, admin_key=process.admin_key,
    )


def _process(server: TritonServer) -> local_triton.ServerProcess:
    return local_triton.ServerProcess(
        pid=server.pid, http_port=server.http_port, grpc_port=server.grpc_port, metrics_port=server.metrics_port,
        started_at=server.started_at, log_path=Path(server.log_path),
    )


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
        cgroups.remove([Path(d) for d in server.cgroups], wait_seconds=2.0)
    if server.sandbox_id:
        shutil.rmtree(scratch_dir(server), ignore_errors=True)


def _memory_report(server: TritonServer) -> str:
    """A sentence when the kernel killed one of the server's processes at the sandbox's memory limit."""
    if not server.cgroups or not cgroups.oom_kills([Path(d) for d in server.cgroups]):
        return ""
    limit = limits_for(server.revision.spec).memory_bytes
    given = server.revision.spec.resources.memory or settings.SANDBOX_DEFAULT_MEMORY
    return (f"Out of memory: a process of this deployment needed more than its limit of {given} "
            f"({(limit or 0) / 2**20:.0f} MiB) and the kernel killed it. Raise resources.memory, or load less.")


def _death_report(server: TritonServer) -> str:
    """What a user needs to know about a server that died: Triton's errors, else its last log lines."""
    errors = local_triton.log_errors(Path(server.log_path))
    lines = errors or local_triton.tail_log(Path(server.log_path), 5).splitlines()
    memory = _memory_report(server)
    return "\n".join(([memory] if memory else []) + lines[-5:])


def running_servers(deployment: Deployment) -> list[TritonServer]:
    return list(
        TritonServer.objects.select_related("revision")
        .filter(deployment=deployment, state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
    )


# Where the renderer's checks run before anything is rendered: no file is read, so any path does.
_NO_ARTIFACT_YET = Path("artifact")


def plan_errors(spec: RevisionSpec) -> dict[str, list[str]]:
    """The local runtime's policy for a planned revision (LocalRuntime.check_plan)."""
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    for entry in spec.models:
        _check_requirements(entry, add)
    if spec.replicas != 1:
        add("replicas", "the local runtime runs one Triton server per deployment: use replicas 1, or runtime "
                        "'kubernetes'")
    if spec.resources.gpu:
        add("resources.gpu", "the local runtime has no GPU: use gpu 0, or runtime 'kubernetes'")
    if spec.autoscaling:
        add("autoscaling", "the local runtime runs one Triton server per deployment: autoscaling needs runtime "
                           "'kubernetes'")
    for key, messages in resource_errors(spec.resources).items():
        errors.setdefault(key, []).extend(messages)
    refusal = sandbox_refusal(spec)
    if refusal:
        add("runtime", refusal)
    found = validate_repository(spec.repository(lambda entry: _NO_ARTIFACT_YET), "local",
                                local_frameworks=frameworks.local_frameworks())
    for key, messages in found.items():
        errors.setdefault(key, []).extend(messages)
    return errors


def _check_requirements(entry: ModelEntry, add: Callable[[str, str], None]) -> None:
    """The local runtime installs a python model's requirements (deployments/pyenvs.py) when each line is a plain
    requirement; whether pip finds them shows when the environment is built (the deployment fails with pip's
    message)."""
    try:
        pyenvs.parse_requirements(list(entry.requirements))
    except pyenvs.RequirementError as exc:
        add(f"{entry.name}.requirements", f"model {entry.name!r} version {entry.version}: {exc}")


class LocalRuntime:
    """One tritonserver process per revision on this machine; a rollout starts the new one beside the old."""

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
        return prepare_python_env(revision)

    def launch(self, revision: Revision) -> Launch:
        try:
            return _describe(_launch(revision))
        except local_triton.RuntimeEnvError as exc:
            raise RuntimeUnavailable(f"The local runtime cannot start Triton: {exc}") from None

    def observe(self, launch: Launch) -> Observation:
        server = TritonServer.objects.select_related("revision").filter(pk=launch.ref).first()
        if server is None or server.state == TritonServer.State.STOPPED:
            return Observation("failed", "its Triton process was stopped")
        result = local_triton.probe(_process(server), server.revision.spec.model_names)
        detail = "\n".join(result.errors[-5:])
        if result.ready:
            TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.READY)
            return Observation("ready", "ready")
        confinement = next((e for e in result.errors if e.startswith(local_triton.SANDBOX_ERROR_PREFIX)), None)
        if confinement:
            return Observation("failed", f"The sandbox {confinement.removeprefix(local_triton.SANDBOX_ERROR_PREFIX)}",
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
        if local_triton.is_alive(server.pid):
            return Health(True)
        report = _death_report(server)
        _stop(server)
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

    def logs(self, deployment: Deployment, lines: int) -> str:
        server = TritonServer.objects.filter(deployment=deployment).order_by("-started_at").first()
        return local_triton.tail_log(Path(server.log_path), lines) if server else ""


def sweep_orphans() -> list[str]:
    """Stop the Tritons of this var/ that no starting or ready TritonServer row knows (one a worker spawned just
    before it died, say) once they are TRITON_ORPHAN_GRACE_SECONDS old, and remove cgroups and scratch directories
    that no live server uses. Returns a line per thing removed."""
    live = list(TritonServer.objects.filter(state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
                .values("pid", "sandbox_id", "cgroups"))
    known_pids = {row["pid"] for row in live}
    grace = settings.TRITON_ORPHAN_GRACE_SECONDS
    done = []
    for pid in local_triton.find_servers(f"{Path(settings.DEPLOYMENTS_DIR)}/"):
        if pid not in known_pids and local_triton.process_age(pid) >= grace:
            local_triton.stop_server(pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
            done.append(f"stopped an orphaned Triton (pid {pid})")
            log.warning("Stopped an orphaned Triton (pid %s) that no database row knows.", pid)
    known_ids = {row["sandbox_id"] for row in live}
    cutoff = time.time() - grace
    for scratch in Path(settings.DEPLOYMENTS_DIR).glob("*/scratch/*"):
        if scratch.name not in known_ids and _mtime(scratch) < cutoff:
            shutil.rmtree(scratch, ignore_errors=True)
            done.append(f"removed the scratch directory {scratch}")
    done += collect_python_envs()
    known_cgroups = {directory for row in live for directory in row["cgroups"]}
    layout = sandbox_capabilities().cgroups
    for parent in layout.parents.values():
        for directory in parent.glob(f"mp-{_var_tag()}-*"):
            # Old enough too: a launcher joins its cgroup a moment after it is made, before any row knows it.
            if str(directory) not in known_cgroups and _mtime(directory) < cutoff \
                    and not cgroups.members([directory]) and cgroups.remove([directory], wait_seconds=0):
                done.append(f"removed the cgroup {directory}")
    return done


def collect_python_envs() -> list[str]:
    """Remove python environments that no revision of a running deployment needs, unused for
    PYENV_KEEP_UNUSED_SECONDS (a stopped deployment started again within that time finds its environment)."""
    layout = pyenv_layout()
    if not layout.root.is_dir():
        return []
    in_use = set()
    running = Deployment.objects.filter(desired_state=Deployment.Desired.RUNNING).select_related(
        "revision", "serving_revision", "canary_revision")
    # A canary being prepared has no server yet: its environment is needed all the same.
    revisions = [r for d in running for r in (d.revision, d.serving_revision, d.canary_revision) if r is not None]
    for server in TritonServer.objects.filter(state__in=[TritonServer.State.STARTING, TritonServer.State.READY]) \
            .select_related("revision", "deployment"):
        try:
            in_use.add((repository_dir(server.revision).parent / "pyenv").read_text().strip())
        except OSError:
            pass
    for revision in revisions:
        if not any(m.requirements for m in revision.spec.models):
            continue
        try:
            penv = python_env_for(revision.spec)
        except (pyenvs.RequirementError, local_triton.RuntimeEnvError, pyenvs.BuildError):
            continue
        if penv is not None:
            in_use.add(penv.key)
    return pyenvs.collect_garbage(layout, in_use, float(settings.PYENV_KEEP_UNUSED_SECONDS))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
