"""The local runtime's sandbox: each deployment's Triton runs confined (docs/security.md, "Local runtime").

This module is the portal's side, with no Django: it checks what the kernel offers (`check()`), turns a
deployment's needs into the launcher's plan (`build_plan()`) and starts the launcher (`spawn()`), which builds the
sandbox in its own processes (launcher.py). kernel.py holds the system calls; stub.py confines the python-backend
stubs further; cgroups.py the resource limits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelport.core.quantity import parse_quantity
from modelport.core.sandbox import cgroups, kernel

LAUNCHER = Path(__file__).resolve().with_name("launcher.py")
HERE = LAUNCHER.parent
# Inside its last user namespace the program runs as this uid/gid (the sandbox uid outside).
INSIDE_UID = 1000
INSIDE_GID = 1000
SPAWN_TIMEOUT_SECONDS = 30.0


class SandboxError(RuntimeError):
    """The sandbox could not be built; the message says which step the kernel refused."""


# --- Quantities (as the deployment spec stores them: Kubernetes quantities, parsed by modelport.core.quantity) --------

MIN_MEMORY_BYTES = 128 * 2**20  # tritonserver alone needs about 60 MiB before any model is loaded
MIN_CPU_MILLICORES = 10  # the CFS quota's floor (1 ms per 100 ms period)


def memory_bytes(text: str) -> int:
    """resources.memory in bytes (rounded up, as Kubernetes does); ValueError with a message for the user."""
    value = parse_quantity(text)
    result = int(value.to_integral_value(rounding="ROUND_CEILING"))
    if result < MIN_MEMORY_BYTES:
        raise ValueError(f"{text!r} is too little memory to run Triton: give at least 128Mi")
    if result > 2**62:
        raise ValueError(f"{text!r} is more memory than any machine has")
    return result


MIN_SCRATCH_BYTES = 2**20


def scratch_bytes(text: str) -> int:
    """SANDBOX_SCRATCH_SIZE in bytes (rounded up); ValueError with a message for the operator."""
    result = int(parse_quantity(text).to_integral_value(rounding="ROUND_CEILING"))
    if result < MIN_SCRATCH_BYTES:
        raise ValueError(f"{text!r} is too small a scratch directory: give at least 1Mi")
    if result > 2**62:
        raise ValueError(f"{text!r} is more memory than any machine has")
    return result


def cpu_millicores(text: str) -> int:
    """resources.cpu in thousandths of a core; ValueError with a message for the user."""
    value = parse_quantity(text) * 1000
    result = int(value.to_integral_value(rounding="ROUND_CEILING"))
    if result < MIN_CPU_MILLICORES:
        raise ValueError(f"{text!r} is less CPU than the kernel can enforce: give at least 10m (a hundredth of a core)")
    if result > 1_000_000:
        raise ValueError(f"{text!r} is more CPU than any machine has: give at most 1000 cores")
    return result


# --- What the kernel offers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The operator's settings (SANDBOX_* in portal/settings.py)."""

    uid: int = 65534  # the sandbox's uid outside when the portal runs as root
    gid: int = 65534
    shm_bytes: int = 2**30
    # The scratch directory (HOME, TMPDIR, /tmp) is a tmpfs of this size inside the sandbox, never the host's disk:
    # a write past it fails with ENOSPC, and what it holds is memory, charged to the sandbox's memory cgroup.
    scratch_bytes: int = 2**30
    pids_max: int = 1024
    egress_ports: tuple[int, ...] = (53, 80, 443)
    cgroup_parent: str = ""  # "": below the starting process's own cgroup
    cgroup_root: Path = Path("/sys/fs/cgroup")
    # The CPU priority of everything in a sandbox (a nice value, 0 to 19; 0: the portal's own): uploaded code runs
    # below the portal's processes, so that a model busy on every core never makes the gateway wait for one
    # (SANDBOX_NICE; docs/security.md, "CPU").
    nice: int = 10


@dataclass(frozen=True)
class Capabilities:
    available: bool  # namespaces, mounts and seccomp work: a sandbox can be built
    reason: str = ""  # why not, when not
    landlock_abi: int = 0
    cgroups: cgroups.Layout = field(default_factory=lambda: cgroups.Layout(0, {}))
    notes: tuple[str, ...] = ()  # the layers weaker than designed on this machine

    def describe(self) -> str:
        """One paragraph for logs and the operators' overview."""
        if not self.available:
            return f"not available: {self.reason}"
        text = f"available (Landlock ABI {self.landlock_abi}, cgroup v{self.cgroups.version})" if \
            self.cgroups.version else f"available (Landlock ABI {self.landlock_abi}, no cgroups)"
        return text + ("; " + "; ".join(self.notes) if self.notes else "")


def check(options: Options, python: str = sys.executable) -> Capabilities:
    """Build a throw-away sandbox the way a real one is built (with the stub's confinement inside it) and report
    what works. Takes about a tenth of a second; callers cache it per process."""
    if sys.platform != "linux":
        return Capabilities(False, f"the sandbox needs Linux, this is {sys.platform}")
    try:
        max_ns = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except (OSError, ValueError):
        max_ns = 1
    if max_ns == 0:
        return Capabilities(False, "user namespaces are disabled (sysctl user.max_user_namespaces = 0)")
    try:
        kernel.libseccomp()
    except OSError as exc:
        return Capabilities(False, f"libseccomp is missing ({exc}): install the libseccomp2 package")
    abi = kernel.landlock_abi()
    notes = []
    if abi == 0:
        notes.append("no Landlock (kernel older than 5.13 or Landlock disabled): the filesystem rules rest on the "
                     "mount namespace alone")
    elif abi < 4:
        notes.append(f"Landlock ABI {abi} has no TCP rules (Linux 6.7+): Triton itself may open TCP connections; "
                     "its python models still run in an empty network namespace")
    if 0 < abi < 6:
        notes.append(f"Landlock ABI {abi} cannot scope signals and abstract sockets (Linux 6.12+)")
    layout = cgroups.detect(options.cgroup_root, options.cgroup_parent)
    if layout.version == 0:
        notes.append(f"no resource limits: {layout.note}")
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    plan = build_plan(
        Spec(read_only=(), scratch=scratch, tcp_ports=(), egress=False, name="probe",
             limits=cgroups.Limits(None, None, options.pids_max)),
        Capabilities(True, landlock_abi=abi), options, argv=["/bin/true"], env={}, cwd="/",
    )
    plan["mounts"] = [m for m in plan["mounts"] if m["writable"] is False]  # the probe writes nowhere
    plan["probe"] = True
    try:
        process, _, note = _start(plan, python, subprocess.DEVNULL)
    except SandboxError as exc:
        return Capabilities(False, str(exc), abi, layout, tuple(notes))
    process.wait()
    return Capabilities(True, "", abi, layout, tuple(notes + ([note] if note else [])))


# --- The plan -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What one sandbox may see and do; the program and its environment come with build_plan()."""

    read_only: tuple[Path, ...]  # visible, read-only, at the same path (the runtime env, the repository, ...)
    scratch: Path  # the only writable directory (HOME and TMPDIR live in it); /dev/shm is private
    tcp_ports: tuple[int, ...]  # the ports the program may listen on
    egress: bool  # an operator allowed outgoing connections (to options.egress_ports)
    name: str  # cgroup and host name
    limits: cgroups.Limits
    # "host": the machine's network namespace (Triton must listen where the gateway reaches it); "none": an empty
    # one, for programs that need no network at all (a one-shot run(), say).
    network: str = "host"
    # True: the scratch directory is a tmpfs of options.scratch_bytes inside the sandbox (a model cannot fill the
    # host's disk: Tritons, and one-shot runs, whose result comes back through `writable_files`); False: the host's
    # directory itself.
    scratch_tmpfs: bool = False
    # Files of the host's bound writable at the same path (a one-shot run's result beside a tmpfs scratch): the
    # sandbox can rewrite them, within RLIMIT_FSIZE, but not create a file beside them, nor unlink or replace them
    # (a mount point), so what it leaves on the host's disk is bounded.
    writable_files: tuple[Path, ...] = ()
    # TCP ports the program may connect to whatever its egress (a trace collector's, docs/observability.md), and
    # (name, address) lines added to its /etc/hosts so that it reaches a named one without DNS, which it lacks
    # without egress. Landlock's rules are ports, not addresses: see docs/security.md, "Tracing".
    connect_ports: tuple[int, ...] = ()
    hosts: tuple[tuple[str, str], ...] = ()


# System directories every program needs, read-only; the merged-/usr links are recreated as links.
_SYSTEM_DIRS = ("/usr",)
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
        "/etc/ssl/certs", "/etc/ca-certificates", "/etc/os-release", "/etc/mime.types")
_ETC_EGRESS = ("/etc/resolv.conf", "/etc/gai.conf", "/etc/host.conf")
_CPU_INFO = "/sys/devices/system/cpu"  # CPU counts and topology, read by glibc, numpy and onnxruntime


def build_plan(spec: Spec, caps: Capabilities, options: Options, *, argv: list[str], env: dict[str, str], cwd: str,
               cgroup_procs: list[str] | None = None) -> dict[str, Any]:
    """The launcher's plan (JSON): every path the sandbox sees, its Landlock and seccomp rules, its ids."""
    mounts: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(path: Path | str, writable: bool) -> None:
        target = os.path.abspath(str(path))
        if target in seen or not os.path.exists(target):
            return
        seen.add(target)
        mounts.append({"source": target, "target": target, "writable": writable})

    for directory in _SYSTEM_DIRS:
        add(directory, False)
    links = {}
    for link in _ROOT_LINKS:
        if os.path.islink(link):
            links[link] = os.readlink(link)
        elif os.path.isdir(link):
            add(link, False)
    for etc in _ETC + (_ETC_EGRESS if spec.egress else ()):
        add(etc, False)
    add(_CPU_INFO, False)
    for path in spec.read_only:
        add(path, False)
    home, tmp = spec.scratch / "home", spec.scratch / "tmp"
    if spec.scratch_tmpfs:
        # A fresh tmpfs at the scratch directory's path (the host's directory stays empty), holding home/ and tmp/;
        # /tmp is that tmp/ (the launcher binds both from where it mounted the tmpfs).
        target = os.path.abspath(str(spec.scratch))
        seen.add(target)
        mounts.append({"source": target, "target": target, "writable": True,
                       "tmpfs_bytes": options.scratch_bytes, "tmpfs_dirs": ["home", "tmp"]})
        mounts.append({"source": str(tmp), "target": "/tmp", "writable": True, "in_tmpfs": target})
    else:
        add(spec.scratch, True)
        if tmp.is_dir():
            mounts.append({"source": str(tmp), "target": "/tmp", "writable": True})
    for path in spec.writable_files:
        add(path, True)

    all_rights = kernel.landlock_fs_rights(caps.landlock_abi)
    device_rights = kernel.FS_READ_FILE | kernel.FS_WRITE_FILE | kernel.FS_TRUNCATE
    landlock: list[tuple[str, int]] = [
        (m["target"], all_rights if m["writable"] else kernel.FS_READ_EXEC) for m in mounts
    ]
    # Writing in /proc: the stub wrapper maps its own user namespace (/proc/self/uid_map) before it confines the
    # model, whose nested domain can only read there; the kernel's own checks guard the rest of /proc.
    landlock += [("/etc", kernel.FS_READ), ("/proc", kernel.FS_READ | kernel.FS_WRITE_FILE),
                 ("/dev", kernel.FS_READ_DIR), ("/dev/shm", all_rights)]
    landlock += [(f"/dev/{name}", device_rights) for name in ("null", "zero", "full", "random", "urandom")]
    return {
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "hostname": spec.name[:63],
        # The launcher maps the sandbox's root to this uid: the sandbox uid when the portal is root (so nothing in
        # it is root anywhere), the portal's own uid otherwise (the only one an unprivileged process may map).
        "outer_uid": options.uid if os.geteuid() == 0 else os.geteuid(),
        "outer_gid": options.gid if os.geteuid() == 0 else os.getegid(),
        "privileged": os.geteuid() == 0,
        "inner_uid": INSIDE_UID,
        "inner_gid": INSIDE_GID,
        "mounts": mounts,
        "symlinks": links,
        "files": _etc_files(home, spec.name, spec.hosts),
        "shm_bytes": options.shm_bytes,
        "landlock_abi": caps.landlock_abi,
        "landlock": landlock,
        "landlock_scopes": kernel.SCOPE_ABSTRACT_UNIX_SOCKET | kernel.SCOPE_SIGNAL,
        "tcp_bind": list(spec.tcp_ports),
        "tcp_connect": sorted({*(options.egress_ports if spec.egress else ()), *spec.connect_ports}),
        "udp": spec.egress,  # DNS; Landlock has no UDP rules, so without egress seccomp refuses UDP sockets
        "socket_families": [kernel.AF_UNIX, kernel.AF_INET, kernel.AF_INET6, kernel.AF_NETLINK],
        "cgroup_procs": cgroup_procs or [],
        "network": spec.network,
        "nice": options.nice,
    }


def _etc_files(home: Path, name: str, hosts: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """/etc files written for the sandbox instead of the host's: its own user, no host names or accounts."""
    return {
        "/etc/passwd": f"triton:x:{INSIDE_UID}:{INSIDE_GID}:Modelport sandbox:{home}:/usr/sbin/nologin\n"
                       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "/etc/group": f"triton:x:{INSIDE_GID}:\nnogroup:x:65534:\n",
        "/etc/hosts": f"127.0.0.1\tlocalhost {name[:63]}\n::1\tlocalhost ip6-localhost\n"
                      + "".join(f"{address}\t{host}\n" for host, address in hosts),
        "/etc/hostname": f"{name[:63]}\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }


def environment(bin_dirs: list[Path], scratch: Path, extra: dict[str, str]) -> dict[str, str]:
    """The program's whole environment: nothing of the portal's (its secrets live in its environment)."""
    return {
        "PATH": os.pathsep.join([*(str(d) for d in bin_dirs), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "LANG": "C.UTF-8",
        **extra,
    }


def prepare_scratch(scratch: Path, options: Options) -> None:
    """The sandbox's writable directory, owned by the sandbox uid (when the portal is root) and private to it."""
    for directory in (scratch, scratch / "home", scratch / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        if os.geteuid() == 0:
            os.chown(directory, options.uid, options.gid)


@dataclass(frozen=True)
class Sandbox:
    """A sandbox to build: what it may do, what this machine offers, the operator's settings."""

    spec: Spec
    caps: Capabilities
    options: Options


# --- Starting ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    process: subprocess.Popen[bytes]  # the launcher: it exits with the program's status
    pid: int  # the program (PID 1 of the sandbox) as this machine's PID namespace numbers it
    cgroups: tuple[str, ...]  # its cgroup directories ((): no limits)


def spawn(spec: Spec, caps: Capabilities, options: Options, *, argv: list[str], env: dict[str, str], cwd: str,
          log: Any, python: str = sys.executable, die_with_parent: bool = False) -> Started:
    """Start `argv` in a sandbox made to `spec`; its output goes to `log` (a file object)."""
    directories: list[Path] = []
    if caps.cgroups.version:
        try:
            directories = cgroups.create(caps.cgroups, spec.name, spec.limits)
        except OSError as exc:
            raise SandboxError(f"cannot create the sandbox's cgroup: {exc}") from None
    plan = build_plan(spec, caps, options, argv=argv, env=env, cwd=cwd,
                      cgroup_procs=cgroups.procs_files(directories))
    plan["die_with_parent"] = die_with_parent
    try:
        process, pid, _ = _start(plan, python, log)
    except SandboxError:
        cgroups.remove(directories, wait_seconds=1)
        raise
    return Started(process, pid, tuple(str(d) for d in directories))


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None: killed at the time limit
    timed_out: bool
    oom_kills: int = 0  # processes the kernel killed at the cgroup's memory limit (0 without cgroups)
    # The most memory the run's cgroup held at once (0 without one): a trial run's figure for the version. Not
    # part of the outcome's equality, since it differs from run to run.
    peak_bytes: int = field(default=0, compare=False)


def _peak(directories: list[Path]) -> int:
    memory = cgroups.memory_directory(directories)
    return cgroups.peak_bytes(memory) if memory is not None else 0


def run(spec: Spec, caps: Capabilities, options: Options, *, argv: list[str], env: dict[str, str], cwd: str, log: Any,
        timeout: float, python: str = sys.executable) -> Finished:
    """Run `argv` to its end in a sandbox made to `spec` (give it network "none" unless it must listen), within
    `timeout` seconds: at the limit its PID 1 is killed, and with it everything it started. For one-shot runs of
    uploaded code, such as a trial run at inspection."""
    # A one-shot run ends with the process that asked for it: an inspection ended at Celery's time limit (the soft
    # limit's exception here, or the hard limit's SIGKILL of the worker child) leaves no uploaded code running.
    started = spawn(spec, caps, options, argv=argv, env=env, cwd=cwd, log=log, python=python, die_with_parent=True)
    directories = [Path(d) for d in started.cgroups]
    try:
        try:
            status = started.process.wait(timeout)  # the launcher exits with the program's status
            return Finished(status, False, cgroups.oom_kills(directories), _peak(directories))
        except subprocess.TimeoutExpired:
            _kill(started)
            return Finished(None, True, cgroups.oom_kills(directories), _peak(directories))
        except BaseException:
            _kill(started)
            raise
    finally:
        cgroups.remove(directories, wait_seconds=2)


def _kill(started: Started) -> None:
    """SIGKILL the sandbox's PID 1 (the kernel then ends everything in its namespace) and reap the launcher."""
    try:
        os.kill(started.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    started.process.wait()


def _start(plan: dict[str, Any], python: str, log: Any) -> tuple[subprocess.Popen[bytes], int, str]:
    """Run the launcher with `plan`: its Popen, the program's pid and the probe's note (what it found weaker)."""
    try:
        process = subprocess.Popen(
            [python, "-I", "-S", str(LAUNCHER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True, close_fds=True, env={}, cwd="/",
        )
    except OSError as exc:
        raise SandboxError(f"cannot run the sandbox launcher with {python}: {exc}") from None
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(json.dumps(plan).encode())
        process.stdin.close()
    except BrokenPipeError:
        pass
    line = _read_line(process.stdout, SPAWN_TIMEOUT_SECONDS)
    process.stdout.close()
    try:
        answer = json.loads(line) if line else {}
    except ValueError:
        answer = {}
    if "pid" in answer or "probe" in answer:
        return process, int(answer.get("pid", 0)), str(answer.get("note", ""))
    if process.poll() is None:
        process.kill()
    process.wait()
    raise SandboxError(str(answer.get("error") or f"the sandbox launcher failed (status {process.returncode})"))


def _read_line(stream: Any, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    fd = stream.fileno()
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").split("\n", 1)[0]
