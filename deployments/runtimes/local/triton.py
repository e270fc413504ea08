"""Supervise a local tritonserver, the binary shipped in the nvidia-pytriton wheel (see docs/local-runtime.md):
start it, find it, stop it, reap it. The backend directory it starts with is backends.py's, its readiness
readiness.py's, its log serverlog.py's.

Plain functions, no Django: callers pass paths and settings in. The server runs in its own session (process
group) so it outlives the web or worker process that started it; what identifies it afterwards is its pid, which
`is_alive()` checks against /proc so a recycled pid is never adopted. Given a sandbox (modelport.core.sandbox), the
server runs as PID 1 of its own PID namespace, so stopping it ends every process it or its models started.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from deployments.runtimes.local import serverlog
from modelport.core import sandbox as sandboxing
from modelport.core.runtime_env import BINARY_NAME, RuntimeEnv, server_environment


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    http_port: int
    grpc_port: int
    metrics_port: int
    started_at: datetime
    log_path: Path
    host: str = "127.0.0.1"
    sandboxed: bool = False
    cgroups: tuple[str, ...] = ()  # the sandbox's cgroup directories (): no resource limits
    admin_key: str = ""  # the header value Triton's admin APIs require ("": not restricted)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


def pick_free_ports(count: int = 3, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now (another process may still take one before Triton binds it)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# Popen objects of servers this process started, so it can reap them (no zombies) without a ResourceWarning.
_children: dict[int, subprocess.Popen[bytes]] = {}
_exit_codes: dict[int, int] = {}
# The admin API groups (load/unload models, change logging and tracing, register shared memory): a request needs
# ADMIN_HEADER with the server's own random key, which only the portal knows. Statistics stay open (the gateway
# serves them); the gateway refuses the admin paths itself as well.
RESTRICTED_APIS = ("model-repository", "logging", "trace", "shared-memory")
ADMIN_HEADER = "modelport-admin-key"


def trace_args(url: str) -> list[str]:
    """Triton's OpenTelemetry tracing, to the portal's collector (OTLP/HTTP, `.../v1/traces`): a request is traced
    when it carries a `traceparent`, and only then (rate 0: Triton samples nothing of its own, and it ignores the
    sampled flag, so the gateway sends one for its sampled spans only, infra/tracing.traceparent()); Triton's spans
    join the gateway's trace, with the timestamps that split a request into queue and compute (../shared notes:
    triton-local.md, "tracing"). Triton's trace API stays an admin API (RESTRICTED_APIS)."""
    return ["--trace-config", "mode=opentelemetry", "--trace-config", "rate=0", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"opentelemetry,url={url}"]


def start_server(
    repo_dir: Path | str,
    log_path: Path,
    runtime_env: RuntimeEnv,
    backend_dir: Path,
    *,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    response_cache_bytes: int = 0,
    exit_timeout_seconds: int = 5,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    sandbox: sandboxing.Sandbox | None = None,
    admin_key: str | None = None,
    log_max_bytes: int = serverlog.DEFAULT_LOG_MAX_BYTES,
    model_control: str = "none",
    traces_url: str | None = None,
) -> ServerProcess:
    """Spawn tritonserver for `repo_dir`; it logs to `log_path` (truncated; at most `log_max_bytes` on disk with its
    rotated file, see serverlog.log_writer()) and loads every model at start.

    `ports` is (http, grpc, metrics); free ones are picked when omitted. Binding to 127.0.0.1 by default keeps
    the local runtime reachable only through the portal's gateway. `env`: the server's whole environment (default:
    this process's, cleaned by
    modelport.core.runtime_env.server_environment()). `sandbox`: run it confined (raises SandboxError if the
    sandbox cannot be built). `admin_key`: the key of the admin APIs (default: a new random one). `model_control`:
    "explicit" for a pool's server (deployments/runtimes/local/pool.py), which starts empty and loads models through
    the repository API. `traces_url`: export OpenTelemetry spans there (trace_args()).
    """
    reap_children()
    http_port, grpc_port, metrics_port = ports if ports is not None else pick_free_ports(3, host)
    admin_key = admin_key or secrets.token_urlsafe(32)
    args = [
        str(runtime_env.tritonserver),
        # An s3:// URL (credentials from AWS_* in the environment) is passed as it is; Path() would mangle it.
        f"--model-repository={repo_dir if str(repo_dir).startswith('s3://') else Path(repo_dir).resolve()}",
        f"--backend-directory={Path(backend_dir).resolve()}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        # A deployment's repository is rendered complete and served as is: load everything at start, never poll
        # it. A pool's starts empty and is loaded model by model through the (admin) repository API.
        f"--model-control-mode={model_control}",
        # A deployment's server: ready only when every model is; a model that fails to load stops the server with
        # its error logged. A pool's: never, for one team's model loading or failed answers for every team's
        # (issue 30); the gateway answers a shared deployment's readiness from its own models (gateway/app.py).
        f"--strict-readiness={'false' if model_control == 'explicit' else 'true'}",
        "--exit-on-error=true",
        # config.pbtxt is rendered in full; Triton must not guess missing fields.
        "--disable-auto-complete-config",
        "--allow-gpu-metrics=false",
        # stop_server() waits longer than this before SIGKILL, so in-flight requests get to finish.
        f"--exit-timeout-secs={exit_timeout_seconds}",
        f"--http-restricted-api={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key}",
        f"--grpc-restricted-protocol={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key}",
    ]
    if response_cache_bytes > 0:
        args += [
            f"--cache-directory={runtime_env.pytriton_server_dir / 'caches'}",
            f"--cache-config=local,size={response_cache_bytes}",
        ]
    if traces_url:
        args += trace_args(traces_url)
    args += list(extra_args)

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = env if env is not None else server_environment(runtime_env)
    cgroup_dirs: tuple[str, ...] = ()
    with serverlog.log_writer(log_path, log_max_bytes) as log:
        if sandbox is not None:
            started = sandboxing.spawn(
                dataclasses.replace(sandbox.spec, tcp_ports=(http_port, grpc_port, metrics_port)), sandbox.caps,
                sandbox.options, argv=args, env=environment, cwd=str(sandbox.spec.scratch), log=log,
            )
            process, pid, cgroup_dirs = started.process, started.pid, started.cgroups
        else:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=str(log_path.parent),
                start_new_session=True,
                close_fds=True,
            )
            pid = process.pid
    # Keyed by the server's pid: for a sandbox the Popen is the launcher, which exits with the server's status.
    _children[pid] = process
    _exit_codes.pop(pid, None)  # an earlier server may have had this pid
    return ServerProcess(
        pid=pid,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        started_at=datetime.now(UTC),
        log_path=log_path,
        host=host,
        sandboxed=sandbox is not None,
        cgroups=cgroup_dirs,
        admin_key=admin_key,
    )


def is_alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) tritonserver."""
    reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    # "pid (comm) state ...": comm may itself contain spaces or ')', so split at the last ')'.
    comm = stat[stat.find("(") + 1 : stat.rfind(")")]
    state = stat[stat.rfind(")") + 1 :].split()[0]
    if state in ("Z", "X") or comm != BINARY_NAME:
        return False
    # cmdline is briefly empty right after exec; comm (set by exec from the file name) has already answered.
    argv0 = cmdline.split(b"\0", 1)[0].decode(errors="replace")
    return not argv0 or os.path.basename(argv0) == BINARY_NAME


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`: the server and the python-backend stubs it spawned."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # After the command name: state, ppid, pgrp, ...
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


def find_servers(repository_prefix: str) -> list[int]:
    """Running tritonservers whose model repository lies under `repository_prefix` (a directory path ending in
    "/"): those of one var/. Tests run several var/ directories at once; each only ever touches its own."""
    wanted = f"--model-repository={repository_prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(wanted) for arg in args) and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def process_age(pid: int) -> float:
    """Seconds since `pid` started (0.0 if it is gone)."""
    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def is_sandbox_init(pid: int) -> bool:
    """Whether `pid` is PID 1 of a PID namespace of its own: a server started in a sandbox."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) > 1 and ids[-1] == "1"
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return False


def namespace_pids(namespace: str) -> list[int]:
    """Live processes in the PID namespace `namespace` (as /proc/<pid>/ns/pid names it: "pid:[4026532...]")."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state not in ("Z", "X"):
            members.append(int(entry.name))
    return sorted(members)


def server_pids(pid: int) -> list[int]:
    """Every live process of the server at `pid`: its PID namespace when sandboxed, else its process group."""
    if is_sandbox_init(pid):
        try:
            return namespace_pids(os.readlink(f"/proc/{pid}/ns/pid"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return []
    return group_pids(pid)


def stop_server(pid: int, grace_seconds: float = 10.0) -> bool:
    """SIGTERM the server, SIGKILL what is left after `grace_seconds`.

    A sandboxed server is PID 1 of its namespace: once it is gone the kernel has killed every other process in it
    (setsid and double-forked ones included). An unsandboxed one is signalled as a process group.
    Returns False when `pid` was no running tritonserver (nothing was signalled). The group is only signalled
    after `is_alive()` confirmed the pid, because a recycled pid's group belongs to someone else.
    """
    if not is_alive(pid):
        reap(pid)
        return False
    if is_sandbox_init(pid):
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
        _signal(pid, signal.SIGTERM)
        if not _wait_gone(lambda: namespace_pids(namespace), pid, grace_seconds):
            _signal(pid, signal.SIGKILL)
            _wait_gone(lambda: namespace_pids(namespace), pid, 5.0)
    else:
        _signal_group(pid, signal.SIGTERM)
        if not _wait_gone(lambda: group_pids(pid), pid, grace_seconds):
            _signal_group(pid, signal.SIGKILL)
            _wait_gone(lambda: group_pids(pid), pid, 5.0)
    reap(pid)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(members: Callable[[], list[int]], pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        reap(pid)
        if not members():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def reap_children() -> None:
    """Collect servers started by this process that have exited, so a long-lived worker keeps no zombies."""
    for pid in list(_children):
        reap(pid)
    serverlog.reap_keepers()


def exit_status_pending(pid: int) -> bool:
    """Whether `pid` is a server this process started whose exit status is not collected yet. One that `is_alive()`
    already calls gone may still be exiting: its main thread is a zombie while the others end, and for a sandbox
    the launcher passes the status on after the namespace is torn down (seconds on a loaded machine)."""
    return pid in _children


def reap(pid: int, wait: float = 0.0) -> int | None:
    """Collect the exit status of a server this process started (None if still running or not our child).
    `wait`: for a server known to be gone, how long its sandbox launcher may take to pass its status on."""
    process = _children.get(pid)
    if process is not None:
        try:
            code = process.wait(wait) if wait else process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            _exit_codes[pid] = code
            del _children[pid]
        return code
    if pid not in _exit_codes:
        try:
            waited, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if waited:
            _exit_codes[pid] = os.waitstatus_to_exitcode(status)
    return _exit_codes.get(pid)
