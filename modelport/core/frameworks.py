"""The deep-learning frameworks of the local runtime env, and running a script inside that env.

The runtime env (docs/local-runtime.md) always serves ONNX and python models; PyTorch and TensorFlow are optional
extras an operator adds (`make runtime-env RUNTIME_EXTRAS=torch,tensorflow`). What is installed is read from the
env's site-packages (a package directory and its dist-info, nothing imported: importing TensorFlow takes seconds)
and cached until site-packages changes: installing or removing a package adds or removes entries there, which
changes the directory's mtime.

`run_in_runtime_env` is the one place that starts a helper script in the runtime env on an untrusted artifact (the
TorchScript trial run of modelport.core.trial_run): given a `Confinement`, in the sandbox serving Tritons run in
(modelport.core.sandbox.run, no network, a read-only copy of the artifact), else as the worker's user in a session of
its own; both with time, CPU, address-space and file-size limits and a scrubbed environment.

Plain functions, no Django: the caller passes the runtime env in (deployments.local_env reads the settings).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelport.core import formats, sandbox
from modelport.core.runtime_env import RuntimeEnv, RuntimeEnvError, find_runtime_env
from modelport.core.sandbox import cgroups


@dataclass(frozen=True)
class Framework:
    name: str  # the extra's name in RUNTIME_EXTRAS / requirements-runtime-<name>.txt, and the import package
    label: str
    distributions: tuple[str, ...]  # distribution names (normalised) that install the import package
    formats: tuple[str, ...]  # model formats it serves on the local runtime
    serves: str  # those formats, for people
    download: str  # what adding it costs, for messages and docs

    @property
    def install_command(self) -> str:
        return f"make runtime-env RUNTIME_EXTRAS={self.name}"


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("torch", "PyTorch", ("torch",), (formats.TORCHSCRIPT,), "TorchScript",
              "a 200 MB download, 0.9 GB installed"),
    Framework(
        "tensorflow",
        "TensorFlow",
        ("tensorflow_cpu", "tensorflow", "tensorflow_intel"),
        (formats.SAVEDMODEL,),
        "TensorFlow SavedModels",
        "a 310 MB download, 1.3 GB installed",
    ),
)
BY_NAME: dict[str, Framework] = {f.name: f for f in FRAMEWORKS}
FORMAT_FRAMEWORK: dict[str, Framework] = {fmt: f for f in FRAMEWORKS for fmt in f.formats}

# site-packages path -> (its mtime in ns, what was found then).
_detected: dict[Path, tuple[int, dict[str, str]]] = {}
_detected_lock = threading.Lock()


def _normalise(distribution: str) -> str:
    return distribution.lower().replace("-", "_").replace(".", "_")


def _scan(site_packages: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    dist_infos: dict[str, str] = {}
    for entry in site_packages.glob("*.dist-info"):
        name, _, dist_version = entry.name.removesuffix(".dist-info").partition("-")
        dist_infos[_normalise(name)] = dist_version
    for framework in FRAMEWORKS:
        if not (site_packages / framework.name / "__init__.py").is_file():
            continue  # a dist-info left behind by a broken uninstall serves nothing
        version = next((dist_infos[d] for d in framework.distributions if d in dist_infos), None)
        if version is not None:
            versions[framework.name] = version
    return versions


def detect(site_packages: Path) -> dict[str, str]:
    """{framework name: version} of the frameworks installed in `site_packages`, cached until it changes."""
    site_packages = Path(site_packages)
    try:
        mtime = site_packages.stat().st_mtime_ns
    except OSError:
        return {}
    with _detected_lock:
        cached = _detected.get(site_packages)
        if cached is not None and cached[0] == mtime:
            return dict(cached[1])
    found = _scan(site_packages)
    with _detected_lock:
        _detected[site_packages] = (mtime, found)
    return dict(found)


def installed_in(runtime_env_root: Path | str) -> dict[str, str]:
    """The frameworks of the runtime env at `runtime_env_root` ({} when there is none: then nothing serves locally,
    and a deployment fails with the runtime env's own message)."""
    try:
        env = find_runtime_env(Path(runtime_env_root))
    except RuntimeEnvError:
        return {}
    return detect(env.site_packages)


@dataclass(frozen=True)
class FrameworkStatus:
    framework: Framework
    version: str | None  # None: not installed

    @property
    def installed(self) -> bool:
        return self.version is not None


def framework_status(installed: Mapping[str, str]) -> list[FrameworkStatus]:
    """Every optional framework with its version in `installed` (installed_in()), for the upload page and the deploy
    form."""
    return [FrameworkStatus(f, installed.get(f.name)) for f in FRAMEWORKS]


def missing_framework_message(fmt: str, installed: dict[str, str] | set[str] | frozenset[str]) -> str | None:
    """Why the local runtime cannot serve `fmt` for want of a framework (with the command that adds it), or None."""
    framework = FORMAT_FRAMEWORK.get(fmt)
    if framework is None or framework.name in installed:
        return None
    return (
        f"the local runtime env has no {framework.label}, which serves this format: an operator adds it with "
        f"`{framework.install_command}` ({framework.download}); or deploy to Kubernetes"
    )


def check_configured_extras(configured: list[str], installed: dict[str, str]) -> tuple[list[str], list[Framework]]:
    """The names in MODELPORT_RUNTIME_EXTRAS that are no extra, and the extras it names that are not installed."""
    unknown = [name for name in configured if name not in BY_NAME]
    missing = [BY_NAME[name] for name in configured if name in BY_NAME and name not in installed]
    return unknown, missing


# --- Running a script in the runtime env --------------------------------------------------------------------------

# What comes back from a script is bounded: the result file is JSON the portal parses, stderr is shown to users.
RESULT_MAX_BYTES = 256 * 1024
STDERR_TAIL_BYTES = 4096
# The largest file the script may write (unconfined, its scratch directory is on the worker's disk; confined, its
# result file is).
FILE_SIZE_MAX_BYTES = 64 * 2**20
# Run by the runtime env's python before the script: the limits are in place before any uploaded byte is read,
# and hard, so that code in the artifact cannot raise them again.
_LIMITS_PRELUDE = """
import resource, runpy, sys
for item in sys.argv[1].split(","):
    name, soft, hard = item.split(":")
    resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
del sys.argv[:2]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class ScriptResult:
    returncode: int | None  # None when it was killed at the time limit
    result: Any  # the JSON the script wrote to its result file; None if it wrote none (or not valid JSON)
    stderr: str  # the last few KB of its stderr
    timed_out: bool = False
    oom_killed: bool = False  # the kernel killed it at its cgroup's memory limit
    sandboxed: bool = False
    peak_bytes: int = 0  # the most memory its sandbox's cgroup held at once (0: not confined, or no cgroup)

    @property
    def out_of_memory(self) -> bool:
        # An allocation refused under RLIMIT_AS surfaces as MemoryError in Python or as a C++ allocator error.
        text = self.stderr
        return self.oom_killed or "MemoryError" in text or "can't allocate memory" in text or "std::bad_alloc" in text

    @property
    def out_of_cpu_time(self) -> bool:
        # RLIMIT_CPU's SIGXCPU; the sandbox's launcher reports a signal as 128 + its number.
        return self.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)


@dataclass(frozen=True)
class Confinement:
    """The sandbox a script runs in: the one serving Tritons run in (modelport.core.sandbox), with no network."""

    caps: sandbox.Capabilities
    options: sandbox.Options
    name: str  # its cgroup and host name, unique per run
    pids_max: int
    cpu_millicores: int = 1000  # one core: a team's upload cannot take the worker's machine


def script_environment(env: RuntimeEnv, home: Path) -> dict[str, str]:
    """Only what the script needs: the runtime env first on PATH, a private HOME, no portal secrets."""
    return {
        "PATH": os.pathsep.join([str(env.bin_dir), "/usr/local/bin", "/usr/bin", "/bin"]),
        "VIRTUAL_ENV": str(env.root),
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        # Frameworks print banners and warnings on import; keep stderr for the errors that matter.
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _limits(timeout: float, memory_bytes: int) -> str:
    """The prelude's limits: NAME:SOFT:HARD. CPU time gets SIGXCPU at the soft limit, SIGKILL a second later."""
    cpu_seconds = max(1, math.ceil(timeout))
    limits = {"RLIMIT_AS": (memory_bytes, memory_bytes), "RLIMIT_CPU": (cpu_seconds, cpu_seconds + 1),
              "RLIMIT_CORE": (0, 0), "RLIMIT_FSIZE": (FILE_SIZE_MAX_BYTES, FILE_SIZE_MAX_BYTES)}
    return ",".join(f"{name}:{soft}:{hard}" for name, (soft, hard) in limits.items())


def _readable_copy(source: Path, target: Path) -> Path:
    """A copy the sandbox's uid can read (uploads are stored 0600) and cannot change (its directory is read-only
    inside)."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    return target


def run_in_runtime_env(
    env: RuntimeEnv, script: Path, args: list[str], *, timeout: float, memory_bytes: int,
    artifact: Path | None = None, modules: tuple[Path, ...] = (), confinement: Confinement | None = None,
) -> ScriptResult:
    """Run `script` (with `modules` beside it) with the runtime env's python on `args`, within `timeout` seconds of
    wall-clock and CPU time and `memory_bytes` of address space. Given an `artifact`, the script's first argument
    is its path. The script gets `--result FILE` appended and writes its JSON answer there (stdout is not used:
    code in the artifact can print).

    With a `confinement` the script runs in the sandbox, with no network, seeing only the runtime env, a read-only
    copy of itself and of the artifact, and a scratch directory (HOME, TMPDIR, the result); within a cgroup of
    `memory_bytes`, one core and `pids_max` processes; killed with everything it started at the time limit.
    Without one it runs as the worker's own user (an operator's opt-out, SANDBOX_REQUIRED=false)."""
    with tempfile.TemporaryDirectory(prefix="modelport-probe-") as work_dir:
        work = Path(work_dir)
        code, inputs = work / "code", work / "input"
        for directory in (code, inputs):
            directory.mkdir(mode=0o755)
            directory.chmod(0o755)
        for source in (script, *modules):
            _readable_copy(source, code / source.name)
        entry, scratch = code / script.name, work / "scratch"
        if confinement is None:
            scratch.mkdir()
            artifact_args = [str(Path(artifact).resolve())] if artifact is not None else []
        else:
            sandbox.prepare_scratch(scratch, confinement.options)
            artifact_args = ([str(_readable_copy(Path(artifact), inputs / f"artifact{Path(artifact).suffix}"))]
                             if artifact is not None else [])
        # Unconfined: in the scratch directory's top, which the script cannot replace (its parent is the worker's);
        # a symlink planted there is refused when the result is read (O_NOFOLLOW). Confined: an empty file of the
        # worker's beside the scratch, bound into the sandbox (its scratch is a tmpfs that ends with it).
        result_path = scratch / "result.json" if confinement is None else _result_file(work, confinement.options)
        command = [str(env.bin_dir / "python"), "-I", "-c", _LIMITS_PRELUDE, _limits(timeout, memory_bytes),
                   str(entry), *artifact_args, *args, "--result", str(result_path)]
        stderr_path = work / "stderr.txt"
        with open(stderr_path, "wb") as stderr:
            if confinement is None:
                returncode = _run_unconfined(command, stderr, scratch, env, timeout)
                timed_out, oom, peak = returncode is None, False, 0
            else:
                returncode, timed_out, oom, peak = _run_confined(command, stderr, scratch, work, env, timeout,
                                                                 memory_bytes, confinement)
        return ScriptResult(returncode=returncode, result=_read_result(result_path), stderr=_tail(stderr_path),
                            timed_out=timed_out, oom_killed=oom, sandboxed=confinement is not None, peak_bytes=peak)


def _result_file(work: Path, options: sandbox.Options) -> Path:
    path = work / "result.json"
    path.touch(mode=0o600)
    if os.geteuid() == 0:
        os.chown(path, options.uid, options.gid)
    return path


def _run_unconfined(command: list[str], stderr: Any, home: Path, env: RuntimeEnv,
                    timeout: float) -> int | None:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                               cwd=home, env=script_environment(env, home), start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        # The whole session: threads the script started, and any child it spawned.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def _run_confined(command: list[str], stderr: Any, scratch: Path, work: Path, env: RuntimeEnv,
                  timeout: float, memory_bytes: int, confinement: Confinement) -> tuple[int | None, bool, bool, int]:
    # The scratch is a tmpfs of SANDBOX_SCRATCH_SIZE, as a Triton's is: on the worker's disk, files of up to
    # RLIMIT_FSIZE each, as many as it liked, filled the disk until the time limit. The result comes back through
    # the one file bound beside it.
    spec = sandbox.Spec(
        read_only=(work / "code", work / "input", env.root, env.base_prefix), scratch=scratch, tcp_ports=(),
        egress=False, name=confinement.name, network="none",
        limits=cgroups.Limits(memory_bytes, confinement.cpu_millicores, confinement.pids_max),
        scratch_tmpfs=True, writable_files=(work / "result.json",),
    )
    environment = sandbox.environment([env.bin_dir], scratch, {
        "VIRTUAL_ENV": str(env.root), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1",
    })
    finished = sandbox.run(spec, confinement.caps, confinement.options, argv=command, env=environment,
                           cwd=str(scratch), log=stderr, timeout=timeout)
    return finished.returncode, finished.timed_out, finished.oom_kills > 0, finished.peak_bytes


def _read_result(path: Path) -> Any:
    """The script's JSON answer, or None: a regular file of at most RESULT_MAX_BYTES, never through a link (code in
    the artifact may have replaced it with one to a file of the worker's) and never a FIFO to block on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > RESULT_MAX_BYTES:
            return None
        data = fh.read(RESULT_MAX_BYTES + 1)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - STDERR_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace")
