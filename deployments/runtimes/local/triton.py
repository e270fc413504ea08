"""Supervise a local tritonserver, the binary shipped in the nvidia-pytriton wheel (see docs/local-runtime.md).

Plain functions, no Django: callers pass paths and settings in. The server runs in its own session (process
group) so it outlives the web or worker process that started it; what identifies it afterwards is its pid, which
`is_alive()` checks against /proc so a recycled pid is never adopted. Given a sandbox (deployments.sandbox), the
server runs as PID 1 of its own PID namespace, so stopping it ends every process it or its models started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from deployments import sandbox as sandboxing

BINARY_NAME = "tritonserver"
_PYTRITON = Path("pytriton") / "tritonserver"
# Python-backend files Triton expects in <backend-directory>/python/.
_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
_STUB = "triton_python_backend_stub"

# Triton log lines start "E1129 12:34:56.789012 4242 file.cc:123] message"; I/W/E give the severity.
_LOG_PREFIX_RE = re.compile(r"^([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*\] ?")
# The model status table Triton prints when models fail: "| name | 1 | UNAVAILABLE: Internal: ... |".
_UNAVAILABLE_RE = re.compile(r"^\|\s*(\S+)\s*\|\s*(\d+)\s*\|\s*(UNAVAILABLE: .*?)\s*\|?\s*$")
MAX_ERROR_LINES = 40
# What the python-backend stub wrapper writes when it cannot confine a model (deployments/sandbox/stub.py); Triton
# itself then waits for the stub until the ready timeout, so the runtime looks for this line.
SANDBOX_ERROR_PREFIX = "modelport sandbox: "
# Error lines every start on a machine without a GPU prints; they say nothing about the models.
_HARMLESS = (
    "CudaDriverHelper has not been initialized",
    "Failed to initialize NVML",
    "DCGM unable to start",
    "Unable to allocate pinned system memory",
)


class RuntimeEnvError(RuntimeError):
    """The runtime env is missing or incomplete; the message says what to install."""


@dataclass(frozen=True)
class RuntimeEnv:
    root: Path  # the virtualenv holding nvidia-pytriton, numpy<2, onnxruntime
    python_version: str  # "3.11": the stub must match the Python that runs model.py files
    site_packages: Path
    tritonserver: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def pytriton_server_dir(self) -> Path:
        return self.site_packages / _PYTRITON

    def has_module(self, name: str) -> bool:
        """Whether `name` (e.g. "torch") is installed in the runtime env, judged by its package directory."""
        return (self.site_packages / name).is_dir()

    @property
    def base_prefix(self) -> Path:
        """The Python installation the runtime env was made from (its standard library; the stub needs it)."""
        try:
            for line in (self.root / "pyvenv.cfg").read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    return Path(value.strip()).resolve().parent
        except OSError:
            pass
        return (self.bin_dir / "python3").resolve().parents[1]


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


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    message: str  # one line for a status page
    errors: tuple[str, ...] = ()  # Triton's own error lines, for the user
    exit_code: int | None = None  # set when the server exited before it was ready
    waited_seconds: float = 0.0
    models_not_ready: tuple[str, ...] = field(default_factory=tuple)


def find_runtime_env(root: Path) -> RuntimeEnv:
    """Locate the tritonserver binary and the python-backend files inside the runtime env at `root`."""
    root = Path(root)
    if not root.is_dir():
        raise RuntimeEnvError(
            f"no runtime env at {root}: create it with `python3 -m venv {root}` and "
            f"`{root}/bin/pip install -r requirements-runtime.txt`"
        )
    candidates = sorted(root.glob("lib/python3.*/site-packages"))
    for site_packages in candidates:
        binary = site_packages / _PYTRITON / "bin" / BINARY_NAME
        if binary.is_file():
            version = site_packages.parent.name.removeprefix("python")
            return RuntimeEnv(root=root, python_version=version, site_packages=site_packages, tritonserver=binary)
    raise RuntimeEnvError(f"no {BINARY_NAME} in the runtime env at {root}: install nvidia-pytriton into it")


def build_backend_dir(env: RuntimeEnv, var_dir: Path, *, sandboxed: bool = False) -> Path:
    """A --backend-directory holding python/ with the backend library, its utils and the matching stub.

    Triton looks for the stub inside the python backend's directory, but the wheel keeps stubs per Python version
    elsewhere, so the directory is assembled here. The entries are symlinks, not copies: the stub finds its
    bundled libraries (libcudart, ...) through an RPATH relative to its real location, which a copy would lose.
    For sandboxed servers the stub entry is a script that confines the model (deployments/sandbox/stub.py) and
    then runs the real stub.
    """
    source = env.pytriton_server_dir
    stub = source / "python_backend_stubs" / env.python_version / _STUB
    if not stub.is_file():
        raise RuntimeEnvError(f"nvidia-pytriton has no python-backend stub for Python {env.python_version}")
    backend_dir = Path(var_dir) / ("triton-backends-sandboxed" if sandboxed else "triton-backends")
    python_dir = backend_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name, src in [(n, source / "backends" / "python" / n) for n in _BACKEND_FILES] + [(_STUB, stub)]:
        if sandboxed and name == _STUB:
            continue
        dest = python_dir / name
        if dest.is_symlink() and os.readlink(dest) == str(src):
            continue
        # Replaced atomically, so a server starting meanwhile never finds the entry missing.
        tmp = dest.with_name(f".{name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(src)
        os.replace(tmp, dest)
    if sandboxed:
        # The wrapper and the kernel bindings it uses, copied: the sandbox sees the backend directory, not the
        # portal's source tree.
        code_dir = backend_dir / "modelport"
        code_dir.mkdir(exist_ok=True)
        for name in ("kernel.py", "stub.py"):
            _write_if_changed(code_dir / name, (sandboxing.HERE / name).read_text(), 0o644)
        script = (f"#!{env.bin_dir / 'python3'} -IS\n"
                  "# Generated by Modelport: confines the python model, then runs the real stub.\n"
                  f"import sys\nsys.path.insert(0, {str(code_dir)!r})\nimport stub\nstub.main({str(stub)!r})\n")
        _write_if_changed(python_dir / _STUB, script, 0o755)
    return backend_dir


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if path.is_file() and not path.is_symlink() and path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


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
) -> ServerProcess:
    """Spawn tritonserver for `repo_dir`; it logs to `log_path` (truncated) and loads every model at start.

    `ports` is (http, grpc, metrics); free ones are picked when omitted. Binding to 127.0.0.1 by default keeps
    the local runtime reachable only through the portal's gateway. `env`: the server's whole environment (default:
    this process's, cleaned by server_environment()). `sandbox`: run it confined (raises SandboxError if the
    sandbox cannot be built). `admin_key`: the key of the admin APIs (default: a new random one).
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
        # The repository is rendered complete and served as is: load everything at start, never poll it.
        "--model-control-mode=none",
        # Ready only when every model is; a model that fails to load stops the server with its error logged.
        "--strict-readiness=true",
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
    args += list(extra_args)

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = env if env is not None else server_environment(runtime_env)
    cgroup_dirs: tuple[str, ...] = ()
    with open(log_path, "wb") as log:
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


def server_environment(runtime_env: RuntimeEnv, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: the python-backend stub runs model.py with the first python3 on PATH."""
    env = dict(os.environ if base is None else base)
    # The portal's own interpreter settings would leak its numpy 2 and packages into the stub.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(runtime_env.bin_dir), env.get("PATH", "/usr/bin:/bin")])
    env["VIRTUAL_ENV"] = str(runtime_env.root)
    return env


def is_alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) tritonserver."""
    _reap(pid)
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
        _reap(pid)
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
    _reap(pid)
    return True


def probe(server: ServerProcess, model_names: Iterable[str], waited: float = 0.0) -> ReadyResult:
    """One look, without waiting: is the server ready with every model, still loading, or gone?"""
    names = list(model_names)
    if not is_alive(server.pid):
        code = _reap(server.pid, wait=2.0)
        errors = tuple(log_errors(server.log_path))
        first = _first_line(summary_error(errors)) or f"see the log at {server.log_path}"
        return ReadyResult(
            ready=False,
            message=f"tritonserver exited (code {code}) before it was ready: {first}",
            errors=errors,
            exit_code=code,
            waited_seconds=waited,
            models_not_ready=tuple(names),
        )
    not_ready = names
    if _http_ok(server, "/v2/health/ready"):
        not_ready = [n for n in names if not _http_ok(server, f"/v2/models/{n}/ready")]
        if not not_ready:
            return ReadyResult(ready=True, message="ready", waited_seconds=waited)
    errors = tuple(log_errors(server.log_path))
    summary = _first_line(summary_error(errors))
    return ReadyResult(
        ready=False,
        message=summary or f"loading {', '.join(not_ready) or 'its models'}",
        errors=errors,
        waited_seconds=waited,
        models_not_ready=tuple(not_ready),
    )


def wait_ready(
    server: ServerProcess,
    model_names: Iterable[str],
    timeout: float,
    *,
    poll_interval: float = 0.2,
) -> ReadyResult:
    """Poll until the server and every model are ready, the server exits, or `timeout` seconds pass (for tools and
    tests; the reconciler probes once per tick instead)."""
    names = list(model_names)
    start = time.monotonic()
    while True:
        waited = time.monotonic() - start
        result = probe(server, names, waited)
        if result.ready or result.exit_code is not None or not is_alive(server.pid):
            return result
        if waited >= timeout:
            return dataclasses.replace(result, message=f"not ready after {timeout:g} s"
                                       + (f": {result.message}" if result.errors else ""))
        time.sleep(poll_interval)


def model_stats(server: ServerProcess, model: str) -> dict[str, object]:
    """Triton's statistics for `model` (the first entry of /v2/models/<model>/stats)."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=5) as response:
        data = json.load(response)
    stats: dict[str, object] = data["model_stats"][0]
    return stats


def log_errors(log_path: Path, limit: int = MAX_ERROR_LINES) -> list[str]:
    """Triton's error messages in the log, without the timestamp prefix; multi-line messages stay whole."""
    errors: list[str] = []
    current: list[str] | None = None
    for raw in _read_lines(log_path):
        line = raw.rstrip("\n")
        prefix = _LOG_PREFIX_RE.match(line)
        table_row = _UNAVAILABLE_RE.match(line)
        if prefix:
            _flush(errors, current)
            current = [line[prefix.end() :]] if prefix.group(1) == "E" else None
        elif table_row:
            _flush(errors, current)
            current = None
            name, version, status = table_row.groups()
            errors.append(f"model '{name}' version {version}: {status}")
        elif line.startswith(("error: ", SANDBOX_ERROR_PREFIX)):
            _flush(errors, current)
            current = None
            errors.append(line)
        elif current is not None and line.strip() and not line.startswith(("+-", "|")):
            current.append(line)  # continuation of a multi-line error (a Python traceback, say)
    _flush(errors, current)
    unique = list(dict.fromkeys(errors))
    return unique[-limit:]


def tail_log(path: Path, lines: int = 100) -> str:
    """The last `lines` lines of the log ("" if it does not exist yet)."""
    return "".join(deque(_read_lines(path), maxlen=lines))


def _read_lines(path: Path) -> Iterable[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f
    except FileNotFoundError:
        return


def _flush(errors: list[str], current: list[str] | None) -> None:
    if not current:
        return
    message = "\n".join(current).strip()
    # Triton 2.51 logs each message as a JSON string literal: decode it so newlines in tracebacks are real.
    if len(message) >= 2 and message[0] == message[-1] == '"':
        try:
            message = str(json.loads(message))
        except ValueError:
            pass
    if not any(noise in message for noise in _HARMLESS):
        errors.append(message.strip())


def summary_error(errors: Sequence[str]) -> str | None:
    """The error most worth showing first: Triton's "failed to load" line when there is one."""
    for error in errors:
        if "failed to load" in error and not error.startswith("error: "):
            return error
    return errors[0] if errors else None


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _http_ok(server: ServerProcess, path: str) -> bool:
    try:
        with urllib.request.urlopen(server.http_url + path, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


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
        _reap(pid)
        if not members():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def reap_children() -> None:
    """Collect servers started by this process that have exited, so a long-lived worker keeps no zombies."""
    for pid in list(_children):
        _reap(pid)


def _reap(pid: int, wait: float = 0.0) -> int | None:
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
