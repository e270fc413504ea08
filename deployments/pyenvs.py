"""Python environments for python models with their own requirements.txt (the local runtime).

A revision whose python models list requirements gets an environment layered on the runtime env: a virtualenv made
by the runtime env's own python whose site-packages holds only what the runtime env lacks, and a .pth file that
adds the runtime env's site-packages behind it (so numpy, onnxruntime, torch... are never installed twice). Triton
runs that revision with the environment's bin/ first on PATH (the python-backend stub takes its Python prefix from
the first python3 there; it ignores PYTHONPATH).

One environment per distinct requirement set and runtime env: the key is the sha256 of the normalized, sorted
requirements, the runtime env's Python version and every distribution it holds (name==version). Two deployments
with the same requirements share one; a changed runtime env (an extra installed) gets new ones.

Safety (docs/security.md): requirements.txt is uploaded, hence hostile. Each line must be a plain PEP 508
requirement (a name, extras, version specifiers, a marker), parsed by modelport.core.requirements: no options
(-r, -e, --index-url, --hash, ...), no URLs, no paths, so the uploader can choose neither the index nor a local file;
nor pip, setuptools or wheel, which are the runtime env's and make the environment (PACKAGING_TOOLS there).
pip installs wheels only (--only-binary=:all:): no setup.py of an sdist ever runs at build time. The index is the
operator's (MODELPORT_PIP_INDEX_URL / MODELPORT_PIP_FIND_LINKS, else pip's own configuration), and every distribution
the runtime env has is a constraint, so nothing it serves with is upgraded or downgraded.

Plain functions, no Django: the runtime (deployments/runtimes/local/pyenv.py) calls them, a Celery task builds.
Builds are serialized per key by a lock file; a build writes into the environment's directory and marks it complete
last (pip writes absolute paths into what it installs, so building elsewhere and renaming would leave stale paths);
a directory without the mark is a crashed build, removed by the next one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deployments import logtail

KEY_VERSION = "1"  # part of every key: a change of layout gets new environments
BUILT_MARK = ".modelport-built"
# Keep this many characters of pip's output when a build fails (its last lines say why).
PIP_OUTPUT_TAIL = 2000
# --- The runtime env's identity --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeIdentity:
    """What an environment is layered on: the runtime env's Python and every distribution in it."""

    python_version: str  # "3.11.7"
    distributions: tuple[str, ...]  # "numpy==1.26.4", sorted

    @property
    def fingerprint(self) -> str:
        text = "\n".join((self.python_version, *self.distributions))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def short_python(self) -> str:
        return ".".join(self.python_version.split(".")[:2])


_IDENTITY_SCRIPT = """
import importlib.metadata as m, json, platform
seen = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if name and name.lower() not in seen:
        seen[name.lower()] = name + "==" + d.version
print(json.dumps({"python": platform.python_version(), "distributions": sorted(seen.values())}))
"""

_identities: dict[tuple[str, int], RuntimeIdentity] = {}
_identities_lock = threading.Lock()


class BuildError(RuntimeError):
    """The environment could not be built; the message says why (pip's last lines for a failed install)."""


def runtime_identity(python: Path, site_packages: Path, env: Mapping[str, str] | None = None) -> RuntimeIdentity:
    """Asked of the runtime env's python once per state of its site-packages (an install changes its mtime)."""
    try:
        stamp = site_packages.stat().st_mtime_ns
    except OSError:
        stamp = 0
    cache_key = (str(python), stamp)
    with _identities_lock:
        known = _identities.get(cache_key)
    if known is not None:
        return known
    try:
        result = subprocess.run([str(python), "-I", "-c", _IDENTITY_SCRIPT], capture_output=True, text=True,
                                timeout=60, env=dict(env) if env is not None else None, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"could not run the runtime env's python {python}: {exc}") from None
    if result.returncode != 0:
        raise BuildError(f"the runtime env's python {python} failed: {result.stderr.strip()[-500:]}")
    data = json.loads(result.stdout)
    identity = RuntimeIdentity(str(data["python"]), tuple(str(d) for d in data["distributions"]))
    with _identities_lock:
        _identities[cache_key] = identity
    return identity


def clear_cache() -> None:
    with _identities_lock:
        _identities.clear()


def satisfied_by(requirement: Requirement, identity: RuntimeIdentity) -> bool:
    """Whether the runtime env already has what `requirement` asks (the sample pipeline's "numpy", "pillow"): then
    no environment is needed for it. Conservative: a requirement with extras or a marker is never taken as
    satisfied (what they pull in, or whether they apply, is pip's to decide)."""
    if requirement.extras or requirement.marker:
        return False
    wanted = canonicalize_name(requirement.name)
    for line in identity.distributions:
        name, _, version = line.partition("==")
        if canonicalize_name(name) == wanted:
            return requirement.specifier.contains(version, prereleases=True)
    return False


def runtime_conflicts(requirements: Sequence[Requirement], identity: RuntimeIdentity) -> list[str]:
    """Why each requirement the runtime env contradicts cannot be installed, one sentence each: it names a package
    the runtime env has at a version its specifier excludes (`numpy==2.4.6` over numpy 1.26.4, which an MLflow model
    pins by default). Every package of the runtime env is a constraint of the build, so pip could only fail on it,
    and its message says ResolutionImpossible; this says which line, and what would do. A requirement with a marker
    is left to pip (whether it applies is the runtime env's python's to judge)."""
    versions = {canonicalize_name(name): version
                for name, _, version in (line.partition("==") for line in identity.distributions)}
    found: list[str] = []
    for requirement in requirements:
        version = versions.get(canonicalize_name(requirement.name))
        if requirement.marker or version is None or requirement.specifier.contains(version, prereleases=True):
            continue
        found.append(f"{requirement} asks for another {requirement.name} than the runtime env's {version}, and a "
                     f"python model's environment keeps every package the runtime env serves with at its version: "
                     f"ask for a range that holds {version} (or no version), e.g. when logging an MLflow model with "
                     "pip_requirements=[...]")
    return found


def env_key(requirements: Sequence[str], identity: RuntimeIdentity) -> str:
    """The environment's name: the same requirement set on the same runtime env, the same key."""
    text = json.dumps({"v": KEY_VERSION, "requirements": list(requirements), "python": identity.python_version,
                       "runtime": identity.fingerprint}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- Where environments live, and what state one is in ----------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """var/pyenvs/: <key>/ (the environment), <key>.lock, <key>.requested (a build is queued or running),
    <key>.failed (pip's last lines)."""

    root: Path

    def env_dir(self, key: str) -> Path:
        return self.root / key

    def site_packages(self, key: str, identity: RuntimeIdentity) -> Path:
        return self.env_dir(key) / "lib" / f"python{identity.short_python}" / "site-packages"

    def _file(self, key: str, suffix: str) -> Path:
        return self.root / f"{key}.{suffix}"

    def lock_file(self, key: str) -> Path:
        return self._file(key, "lock")

    def requested_file(self, key: str) -> Path:
        return self._file(key, "requested")

    def failed_file(self, key: str) -> Path:
        return self._file(key, "failed")


@dataclass(frozen=True)
class EnvState:
    state: Literal["built", "failed", "queued", "missing"]
    message: str = ""


def state_of(layout: Layout, key: str, requested_for_at_most: float) -> EnvState:
    """Built, failed (pip's message), queued (a build was asked for less than `requested_for_at_most` s ago, so
    it is waiting for or running in a worker) or missing (nobody builds it)."""
    if (layout.env_dir(key) / BUILT_MARK).exists():
        return EnvState("built")
    try:
        return EnvState("failed", layout.failed_file(key).read_text(errors="replace"))
    except FileNotFoundError:
        pass
    try:
        asked = layout.requested_file(key).stat().st_mtime
    except FileNotFoundError:
        return EnvState("missing")
    return EnvState("queued") if time.time() - asked < requested_for_at_most else EnvState("missing")


def mark_requested(layout: Layout, key: str, requirements: Sequence[str]) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.requested_file(key).write_text("\n".join(requirements) + "\n")


def forget_failure(layout: Layout, key: str) -> str:
    """Take a failure's message (the deployment that waited for it fails with it), so that the next attempt (a
    retry, another deployment) builds again rather than failing forever on what may have been a network error."""
    path = layout.failed_file(key)
    try:
        message = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    path.unlink(missing_ok=True)
    return message


# --- Building -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipOptions:
    """The operator's package source (settings MODELPORT_PIP_*): "" leaves pip's own configuration (pip.conf,
    PIP_* variables) in charge."""

    index_url: str = ""
    find_links: str = ""
    timeout_seconds: float = 900.0
    extra_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildResult:
    outcome: Literal["built", "already-built", "busy", "failed"]
    env_dir: Path
    message: str = ""


Runner = Callable[..., subprocess.CompletedProcess[str]]


@contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """An exclusive lock on `path` if nobody holds it (yields False when someone does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pip_command(runtime_python: Path, env_dir: Path, constraints: Path, requirements: Sequence[str],
                options: PipOptions) -> list[str]:
    command = [str(runtime_python), "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
               "--only-binary=:all:", "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
               "--progress-bar=off", "-c", str(constraints)]
    if options.index_url:
        command += ["--index-url", options.index_url]
    if options.find_links:
        command += ["--find-links", options.find_links]
    # Each line was checked to start with a name: none can be read as an option.
    return [*command, *requirements]


# What pip may see of the worker's environment: its own configuration, proxies and certificates, never the portal's
# secrets (SECRET_KEY, DATABASE_URL, S3 keys) nor the portal's interpreter settings.
_PIP_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY",
                    "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


def _pip_environment(options: PipOptions) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PIP_ENVIRONMENT or k.startswith(("PIP_", "XDG_"))}
    env.update(options.extra_env)
    return env


def _tail(text: str) -> str:
    # Whole lines from the end (a line cut in two would be misread as pip's last "ERROR:"), none over 500 characters.
    return logtail.tail_text(text.strip(), PIP_OUTPUT_TAIL, max_bytes=PIP_OUTPUT_TAIL, line_max=500).strip()


def build(layout: Layout, key: str, requirements: Sequence[str], runtime_python: Path, runtime_site_packages: Path,
          identity: RuntimeIdentity, options: PipOptions, run: Runner = subprocess.run) -> BuildResult:
    """Build environment `key` for `requirements` (normalized lines) unless it is built or being built.

    Never raises for a failed install: the result (and <key>.failed) carries pip's last lines."""
    env_dir = layout.env_dir(key)
    with _locked(layout.lock_file(key)) as mine:
        if not mine:
            return BuildResult("busy", env_dir)
        try:
            if (env_dir / BUILT_MARK).exists():
                return BuildResult("already-built", env_dir)
            layout.failed_file(key).unlink(missing_ok=True)
            shutil.rmtree(env_dir, ignore_errors=True)  # a build that crashed half-way
            message = _build(env_dir, requirements, runtime_python, runtime_site_packages, identity, options, run)
            if message:
                shutil.rmtree(env_dir, ignore_errors=True)
                layout.failed_file(key).write_text(message)
                return BuildResult("failed", env_dir, message)
            readable_by_all(env_dir)
            (env_dir / BUILT_MARK).write_text(json.dumps({
                "requirements": list(requirements), "python": identity.python_version,
                "runtime": identity.fingerprint, "built_at": time.time()}))
            return BuildResult("built", env_dir)
        finally:
            layout.requested_file(key).unlink(missing_ok=True)


def _build(env_dir: Path, requirements: Sequence[str], runtime_python: Path, runtime_site_packages: Path,
           identity: RuntimeIdentity, options: PipOptions, run: Runner) -> str:
    """Make the environment; "" when it worked, else why not."""
    env = _pip_environment(options)
    try:
        made = run([str(runtime_python), "-m", "venv", "--without-pip", str(env_dir)], capture_output=True, text=True,
                   timeout=120, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not create the virtualenv: {exc}"
    if made.returncode != 0:
        return f"could not create the virtualenv: {_tail(made.stderr or made.stdout)}"
    site_packages = env_dir / "lib" / f"python{identity.short_python}" / "site-packages"
    site_packages.mkdir(parents=True, exist_ok=True)
    # addsitedir (not a bare path) so that the runtime env's own .pth files are processed as well.
    (site_packages / "_modelport_runtime_env.pth").write_text(
        f"import site; site.addsitedir({str(runtime_site_packages)!r})\n")
    constraints = env_dir / "modelport-constraints.txt"
    constraints.write_text("\n".join(identity.distributions) + "\n")
    (env_dir / "modelport-requirements.txt").write_text("\n".join(requirements) + "\n")
    command = pip_command(runtime_python, env_dir, constraints, requirements, options)
    try:
        # In the new environment's own directory: nothing there is pip's to read as a requirement's local file.
        result = run(command, capture_output=True, text=True, timeout=options.timeout_seconds, env=env, check=False,
                     cwd=str(env_dir))
    except subprocess.TimeoutExpired:
        return f"pip did not finish within {options.timeout_seconds:g} s (MODELPORT_PIP_TIMEOUT_SECONDS)"
    except OSError as exc:
        return f"could not run pip: {exc}"
    if result.returncode != 0:
        return _tail("\n".join(part.strip() for part in (result.stdout, result.stderr) if part.strip())) or \
            f"pip failed with status {result.returncode}"
    return ""


def readable_by_all(root: Path) -> None:
    """Sandboxed Tritons read what the worker wrote (an environment, a rendered repository) as another uid; whatever
    the worker's umask was, they must be able to."""
    for directory, _, files in os.walk(root):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o111 else 0o644)


# --- Clean-up -------------------------------------------------------------------------------------------------


def collect_garbage(layout: Layout, in_use: set[str], older_than_seconds: float) -> list[str]:
    """Remove built environments no revision uses any more and unused for `older_than_seconds` (judged by
    their mark's mtime, touched at each launch); a line per environment removed. Skips any being built."""
    removed: list[str] = []
    if not layout.root.is_dir():
        return removed
    cutoff = time.time() - older_than_seconds
    for mark in layout.root.glob(f"*/{BUILT_MARK}"):
        key = mark.parent.name
        if key in in_use:
            continue
        try:
            if mark.stat().st_mtime >= cutoff:
                continue
        except FileNotFoundError:
            continue
        with _locked(layout.lock_file(key)) as mine:
            if not mine:
                continue
            shutil.rmtree(mark.parent, ignore_errors=True)
        removed.append(f"removed the unused python environment {mark.parent}")
    return removed


def touch(layout: Layout, key: str) -> None:
    """An environment was just used: the garbage collection keeps it a while longer."""
    try:
        os.utime(layout.env_dir(key) / BUILT_MARK)
    except FileNotFoundError:
        pass
