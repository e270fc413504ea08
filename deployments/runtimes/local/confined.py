"""Starting a tritonserver confined as every local one is (a deployment's own, a pool's, a tune's, an inspection's
trial call): the refusal of uploaded code where the sandbox is required and missing, the revision's resource limits
as cgroup limits, the sandbox's scratch, and the bounds on reading and keeping its logs. The sandbox's settings and
what this kernel offers are portal.sandbox_settings'."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import secrets
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from deployments import pyenvs
from deployments.models import TritonServer
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import RuntimeUnavailable
from deployments.runtimes.local import backends, pyenv, serverlog
from deployments.runtimes.local import triton as local_triton
from deployments.runtimes.local.files import deployment_dir
from infra import sandbox_settings, tracing
from modelport.core import formats, sandbox
from modelport.core import requirements as requirement_lines
from modelport.core.sandbox import cgroups

log = logging.getLogger(__name__)

# How long a stop waits for a killed server's processes to leave its cgroups before removing them: the kernel takes
# them out as each one finishes exiting, which on a loaded machine (CI) took longer than the instant after the kill.
# The wait ends as soon as they are empty; a cgroup still busy after it is left to the orphan sweep.
CGROUP_EXIT_WAIT_SECONDS = 5.0


# Formats whose artifact is code when served: a python model (pipeline steps included) is a model.py; a TorchScript
# file's forward() and a SavedModel's graph can call file and process operations (torch.from_file, tf.io.read_file).
# ONNX files are data, read by onnxruntime inside Modelport's own python model.
CODE_FORMATS = frozenset({formats.PYTHON, formats.TORCHSCRIPT, formats.SAVEDMODEL})


def runs_uploaded_code(spec: RevisionSpec) -> bool:
    """Whether serving the revision executes code a team uploaded."""
    return any(m.format in CODE_FORMATS for m in spec.models)


def sandbox_refusal(spec: RevisionSpec) -> str | None:
    """Why the local runtime refuses this revision on this machine (fail closed), or None."""
    if not settings.SANDBOX_REQUIRED or not runs_uploaded_code(spec):
        return None
    caps = sandbox_settings.sandbox_capabilities()
    if caps.available:
        return None
    return (f"This machine cannot sandbox uploaded code ({caps.reason}), and python, TorchScript and SavedModel "
            "models run uploaded code, so the local runtime refuses them here. Deploy to Kubernetes, or ask an "
            "operator to make the sandbox work (docs/security.md) or to opt out with SANDBOX_REQUIRED=false.")


def limits_for(spec: RevisionSpec) -> cgroups.Limits:
    """The revision's memory (resources.memory, else derived from its models' figures, else SANDBOX_DEFAULT_MEMORY)
    and resources.cpu as cgroup limits (ValueError: not a valid quantity). The memory limit is what enforces a
    derived figure: a model that takes more than it measured fails alone, at its own server's limit."""
    memory = spec.memory_limit(settings.SANDBOX_DEFAULT_MEMORY)
    cpu = spec.resources.cpu
    return cgroups.Limits(sandbox.memory_bytes(str(memory)) if memory else None,
                          sandbox.cpu_millicores(str(cpu)) if cpu else None, settings.SANDBOX_PIDS_MAX)


def _with_pids(limits: cgroups.Limits, pids_max: int | None) -> cgroups.Limits:
    # A pool's Triton runs many models, each python one with a stub of its own threads: it gets its own pids limit.
    return dataclasses.replace(limits, pids=pids_max) if pids_max else limits


def scratch_dir(server: TritonServer) -> Path:
    return deployment_dir(server.deployment) / "scratch" / server.sandbox_id


@dataclass(frozen=True)
class Confined:
    """A tritonserver started by start_confined(): the process, and what stop_confined() cleans up."""

    process: local_triton.ServerProcess
    sandbox_id: str
    scratch: Path
    note: str
    pyenv_key: str | None = None  # the python environment it runs with (deployments.pyenvs), if any


def start_confined(spec: RevisionSpec, repository: Path, scratch_root: Path, log_path: Path, *,
                   egress: bool = False, label: str = "this server", model_control: str = "none",
                   ports: Sequence[int] | None = None, pids_max: int | None = None,
                   extra_env: Mapping[str, str] | None = None, traced: bool = False) -> Confined:
    """Start a Triton for `spec`'s rendered `repository` as every local deployment's Triton starts: refused where
    the sandbox is required and missing, else sandboxed where this kernel can, with the spec's resource limits, on
    free ports. Deployments (a TritonServer row records it) and tuning (tuning/runner.py: temporary servers)
    both start theirs here. `traced`: a server that answers the gateway, whose spans go to the portal's collector
    when tracing is on (infra/tracing.py). RuntimeUnavailable: it cannot start on this machine."""
    refusal = sandbox_refusal(spec)
    if refusal:
        raise RuntimeUnavailable(refusal)
    env = pyenv.runtime_env()
    try:
        penv = pyenv.python_env_for(spec)
    except (requirement_lines.RequirementError, pyenvs.BuildError) as exc:
        raise RuntimeUnavailable(f"The python environment of {label}: {exc}") from None
    bin_dirs, virtual_env = [env.bin_dir], env.root
    if penv is not None:
        if pyenvs.state_of(pyenv.pyenv_layout(), penv.key, 0).state != "built":
            raise RuntimeUnavailable(f"The python environment of {label} is gone (removed while it was starting): "
                                     "start it again to rebuild it.")
        pyenvs.touch(pyenv.pyenv_layout(), penv.key)
        # The stub's embedded interpreter ignores PYTHONPATH but takes its prefix from the first python3 on PATH:
        # the environment's, whose site-packages comes first and adds the runtime env's behind it (its .pth file).
        bin_dirs, virtual_env = [penv.env_dir / "bin", env.bin_dir], penv.env_dir
    caps = sandbox_settings.sandbox_capabilities()
    options = sandbox_settings.sandbox_options()
    backend_dir = backends.build_backend_dir(env, Path(settings.VAR_DIR), sandboxed=caps.available)
    wants_cache = any(m.response_cache for m in spec.models)
    sandbox_id = secrets.token_hex(8)
    scratch = scratch_root / sandbox_id
    sandbox.prepare_scratch(scratch, options)
    environment = sandbox.environment(bin_dirs, scratch, {
        "VIRTUAL_ENV": str(virtual_env),
        # Read by the python-backend stub wrapper (modelport/core/sandbox/stub.py).
        "MODELPORT_SANDBOX_NET": "egress" if egress else "none",
        "MODELPORT_SANDBOX_EGRESS_PORTS": ",".join(str(p) for p in options.egress_ports) if egress else "",
        **(extra_env or {}),  # a pool's (deployments/runtimes/local/pool_memory.py)
    })
    collector = _collector(label) if traced else None
    confinement = None
    if caps.available:
        box = sandbox.Spec(
            read_only=(repository, backend_dir, env.root, env.base_prefix,
                       *((penv.env_dir,) if penv is not None else ())), scratch=scratch,
            tcp_ports=(), egress=egress, name=sandbox_settings.sandbox_name(sandbox_id),
            limits=_with_pids(limits_for(spec), pids_max),
            scratch_tmpfs=True,
            connect_ports=(collector.port,) if collector is not None else (),
            hosts=collector.hosts if collector is not None else (),
        )
        confinement = sandbox.Sandbox(box, caps, options)
    try:
        process = local_triton.start_server(
            repository, log_path, env, backend_dir,
            response_cache_bytes=settings.TRITON_RESPONSE_CACHE_BYTES if wants_cache else 0,
            env=environment, sandbox=confinement, log_max_bytes=settings.TRITON_LOG_MAX_BYTES,
            model_control=model_control, ports=ports, traces_url=collector.url if collector is not None else None,
        )
    except sandbox.SandboxError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeUnavailable(f"The sandbox for Triton could not be built: {exc}") from None
    note = "; ".join(caps.notes) if caps.available else caps.reason
    return Confined(process=process, sandbox_id=sandbox_id, scratch=scratch, note=note,
                    pyenv_key=penv.key if penv is not None else None)


@dataclass(frozen=True)
class Collector:
    """Where a Triton sends its spans, and what its sandbox must let it reach for that: the port, and the host's
    address for its /etc/hosts (it has no DNS without egress)."""

    url: str
    port: int
    hosts: tuple[tuple[str, str], ...]


_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")


def _collector(label: str) -> Collector | None:
    """The portal's collector (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or _ENDPOINT), resolved now; None when tracing
    is off, or (logged) when the URL is unusable or its host does not resolve: the server then starts untraced,
    since a collector that is down must not stop a deployment."""
    url = tracing.traces_url()
    if url is None:
        return None
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not port or not host:
        log.warning("%s starts untraced: the trace endpoint %r is not an http(s) URL with a host", label, url)
        return None
    try:
        ipaddress.ip_address(host)
        return Collector(url, port, ())
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(host) is None:
        log.warning("%s starts untraced: the trace endpoint's host %r is not a host name", label, host)
        return None
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        log.warning("%s starts untraced: the trace endpoint's host %r does not resolve: %s", label, host, exc)
        return None
    return Collector(url, port, ((host, str(address)),))


def remove_cgroups(directories: Sequence[str | Path]) -> bool:
    """Remove a stopped server's cgroups once its processes have left them; False if some were still busy."""
    return cgroups.remove([Path(d) for d in directories], wait_seconds=CGROUP_EXIT_WAIT_SECONDS)


def stop_confined(confined: Confined) -> None:
    """Stop a server start_confined() started and remove what its sandbox left (its cgroups, its scratch)."""
    local_triton.stop_server(confined.process.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
    if confined.process.cgroups:
        remove_cgroups(confined.process.cgroups)
    shutil.rmtree(confined.scratch, ignore_errors=True)


def log_limits() -> dict[str, int]:
    """What a reader of a local Triton's log reads at most (the settings), as tail_log() and log_errors() take it."""
    return {"max_bytes": settings.LOG_TAIL_MAX_BYTES, "line_max": settings.LOG_LINE_MAX_BYTES}


# Logs of a revision's earlier servers kept beside the current one's (each within TRITON_LOG_MAX_BYTES): a model
# that crashes at every start would otherwise leave a full log per restart.
KEEP_OLD_LOGS = 2


def prune_logs(directory: Path, keep: int = KEEP_OLD_LOGS) -> None:
    """Remove all but the newest `keep` Triton logs (and their rotated files) in a revision's directory."""
    logs = sorted(directory.glob("triton-*.log"))  # the names sort by their start time
    for old in logs[:-keep] if keep else logs:
        for path in serverlog.log_files(old):
            path.unlink(missing_ok=True)
