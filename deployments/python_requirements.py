"""Can a serving environment import what a python model's requirements.txt lists?

The local runtime runs python-backend models with the runtime env's interpreter and installs nothing at deploy
time (the serving network is air-gapped, and a deploy must not change what other deployments run with). So a
deployment whose python model needs a package the runtime env lacks is refused up front, naming the modules.

Plain functions, no Django. The check runs the environment's own python with `importlib.util.find_spec` for each
requirement's import name (never importing the model's code); answers are cached per environment until its
site-packages directory changes (a `pip install` there adds entries, which changes the directory's mtime).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Distributions whose import name is not their name with "-" -> "_" (keys normalized as in PEP 503).
IMPORT_NAMES: dict[str, str] = {
    "pillow": "PIL",
    "pillow-simd": "PIL",
    "scikit-learn": "sklearn",
    "scikit-image": "skimage",
    "opencv-python": "cv2",
    "opencv-python-headless": "cv2",
    "opencv-contrib-python": "cv2",
    "opencv-contrib-python-headless": "cv2",
    "pyyaml": "yaml",
    "beautifulsoup4": "bs4",
    "protobuf": "google.protobuf",
    "python-dateutil": "dateutil",
    "onnxruntime-gpu": "onnxruntime",
    "tensorflow-cpu": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "faiss-cpu": "faiss",
    "faiss-gpu": "faiss",
    "pycryptodome": "Crypto",
    "pyzmq": "zmq",
    "pymupdf": "fitz",
    "nvidia-pytriton": "pytriton",
    "msgpack-python": "msgpack",
    "python-multipart": "multipart",
    "pytorch-lightning": "pytorch_lightning",
}

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
CHECK_TIMEOUT_SECONDS = 60

# Runs inside the serving environment. Markers (`; python_version < "3.12"`) are evaluated there too, with the
# packaging library when that environment has it (pip vendors one); without it a requirement always applies.
_CHECK_SCRIPT = """
import importlib.util, json, sys
try:
    from packaging.markers import Marker
except ImportError:
    try:
        from pip._vendor.packaging.markers import Marker
    except ImportError:
        Marker = None
answers = {}
for module, marker in json.loads(sys.argv[1]):
    if marker and Marker is not None:
        try:
            if not Marker(marker).evaluate():
                answers[module + ";" + marker] = True
                continue
        except Exception:
            pass
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    answers[module + ";" + marker] = found
print(json.dumps(answers))
"""


class CheckFailed(RuntimeError):
    """The environment's python could not be run to answer."""


@dataclass(frozen=True)
class Requirement:
    line: str  # as written in requirements.txt
    distribution: str
    module: str  # the name to import
    marker: str = ""

    @property
    def key(self) -> str:
        return f"{self.module};{self.marker}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def import_name(distribution: str) -> str:
    """The module a distribution is imported as: "pillow" -> "PIL", "scikit-learn" -> "sklearn", "my-pkg" -> "my_pkg"."""
    known = IMPORT_NAMES.get(normalize(distribution))
    return known if known else distribution.lower().replace("-", "_")


def parse_requirement(line: str) -> Requirement | None:
    """A requirements.txt line as parsed at inspection ("numpy>=1.26", "pillow; python_version>'3.9'")."""
    match = _NAME.match(line)
    if match is None:
        return None
    distribution = match.group(1)
    marker = line.split(";", 1)[1].strip() if ";" in line else ""
    return Requirement(line=line.strip(), distribution=distribution, module=import_name(distribution), marker=marker)


_cache: dict[tuple[str, int], dict[str, bool]] = {}
_cache_lock = threading.Lock()


def _environment_stamp(site_packages: Path) -> int:
    try:
        return site_packages.stat().st_mtime_ns
    except OSError:
        return 0


def missing_requirements(python: Path, site_packages: Path, lines: Sequence[str],
                         env: Mapping[str, str] | None = None) -> list[Requirement]:
    """The requirements among `lines` that `python` cannot import, in order; [] when all can.

    Raises CheckFailed when the interpreter cannot be run.
    """
    wanted = [r for r in (parse_requirement(line) for line in lines) if r is not None]
    if not wanted:
        return []
    cache_key = (str(python), _environment_stamp(site_packages))
    with _cache_lock:
        known = dict(_cache.get(cache_key, {}))
    unknown = sorted({(r.module, r.marker) for r in wanted if r.key not in known})
    if unknown:
        try:
            result = subprocess.run(
                [str(python), "-I", "-c", _CHECK_SCRIPT, json.dumps(unknown)],
                capture_output=True, text=True, timeout=CHECK_TIMEOUT_SECONDS, env=dict(env) if env else None,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CheckFailed(f"could not run {python}: {exc}") from None
        if result.returncode != 0:
            raise CheckFailed(f"{python} failed: {result.stderr.strip()[-500:]}")
        answers = {str(k): bool(v) for k, v in json.loads(result.stdout).items()}
        known.update(answers)
        with _cache_lock:
            _cache.setdefault(cache_key, {}).update(answers)
    return [r for r in wanted if not known.get(r.key, False)]


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
