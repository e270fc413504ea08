"""The runtime env: the virtualenv holding nvidia-pytriton (its tritonserver and python-backend files), numpy<2,
onnxruntime and the optional frameworks (docs/local-runtime.md). Finding it, and the environment of the processes
that run in it.

Plain Python: the caller passes the runtime env's root (settings.MODELPORT_RUNTIME_ENV) in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BINARY_NAME = "tritonserver"
_PYTRITON = Path("pytriton") / "tritonserver"


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


def server_environment(runtime_env: RuntimeEnv, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: the python-backend stub runs model.py with the first python3 on PATH."""
    env = dict(os.environ if base is None else base)
    # The portal's own interpreter settings would leak its numpy 2 and packages into the stub.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(runtime_env.bin_dir), env.get("PATH", "/usr/bin:/bin")])
    env["VIRTUAL_ENV"] = str(runtime_env.root)
    return env
