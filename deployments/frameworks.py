"""The deep-learning frameworks of the local runtime env, and running a script inside that env.

The runtime env (docs/local-runtime.md) always serves ONNX and python models; PyTorch and TensorFlow are optional
extras an operator adds (`make runtime-env RUNTIME_EXTRAS=torch,tensorflow`). What is installed is read from the
env's site-packages (a package directory and its dist-info, nothing imported: importing TensorFlow takes seconds)
and cached until site-packages changes: installing or removing a package adds or removes entries there, which
changes the directory's mtime.

`run_in_runtime_env` is the one place that starts a helper script in the runtime env on an untrusted artifact (the
TorchScript trial run of models_registry.inspection): a time limit, an address-space limit, its own session so
that a timeout kills everything it started, and a scrubbed environment. The sandbox of the isolation work wraps
this function.

Plain functions, no Django at import; `local_frameworks()` reads the settings when called.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.runtimes.local import triton as local_triton
from models_registry import formats


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
    Framework("torch", "PyTorch", ("torch",), (formats.TORCHSCRIPT,), "TorchScript", "a 200 MB download, 0.9 GB installed"),
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


def local_frameworks() -> dict[str, str]:
    """The frameworks of the configured runtime env ({} when there is none: then nothing serves locally, and a
    deployment fails with the runtime env's own message)."""
    from django.conf import settings

    try:
        env = local_triton.find_runtime_env(settings.MODELPORT_RUNTIME_ENV)
    except local_triton.RuntimeEnvError:
        return {}
    return detect(env.site_packages)


@dataclass(frozen=True)
class FrameworkStatus:
    framework: Framework
    version: str | None  # None: not installed

    @property
    def installed(self) -> bool:
        return self.version is not None


def local_framework_status() -> list[FrameworkStatus]:
    """Every optional framework with its installed version, for the upload page and the deploy form."""
    found = local_frameworks()
    return [FrameworkStatus(f, found.get(f.name)) for f in FRAMEWORKS]


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


@dataclass(frozen=True)
class ScriptResult:
    returncode: int | None  # None when it was killed at the time limit
    result: Any  # the JSON the script wrote to its result file; None if it wrote none (or not valid JSON)
    stderr: str  # the last few KB of its stderr
    timed_out: bool = False

    @property
    def out_of_memory(self) -> bool:
        # An allocation refused under RLIMIT_AS surfaces as MemoryError in Python or as a C++ allocator error.
        text = self.stderr
        return "MemoryError" in text or "can't allocate memory" in text or "std::bad_alloc" in text


def _limit_memory(memory_bytes: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def script_environment(env: local_triton.RuntimeEnv, home: Path) -> dict[str, str]:
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


def run_in_runtime_env(
    env: local_triton.RuntimeEnv, script: Path, args: list[str], *, timeout: float, memory_bytes: int
) -> ScriptResult:
    """Run `script` with the runtime env's python on `args`, within `timeout` seconds and `memory_bytes` of address
    space. The script gets `--result FILE` appended and writes its JSON answer there (stdout is not used: code in
    the artifact can print)."""
    with tempfile.TemporaryDirectory(prefix="modelport-probe-") as scratch:
        home = Path(scratch)
        result_path = home / "result.json"
        stderr_path = home / "stderr.txt"
        command = [str(env.bin_dir / "python"), "-I", str(script), *args, "--result", str(result_path)]
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=scratch,
                env=script_environment(env, home),
                start_new_session=True,
                # Set between fork and exec, so the limit is in place before the interpreter reads anything.
                preexec_fn=_limit_memory(memory_bytes),
            )
            try:
                returncode: int | None = process.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                returncode, timed_out = None, True
            finally:
                # The whole session: threads the script started, and any child it spawned.
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        with open(stderr_path, "rb") as fh:
            fh.seek(max(0, stderr_path.stat().st_size - STDERR_TAIL_BYTES))
            stderr_text = fh.read().decode("utf-8", "replace")
        result: Any = None
        if result_path.is_file() and result_path.stat().st_size <= RESULT_MAX_BYTES:
            try:
                result = json.loads(result_path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                result = None
        return ScriptResult(returncode=returncode, result=result, stderr=stderr_text, timed_out=timed_out)
