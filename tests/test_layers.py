"""The layers (pyproject.toml's import-linter contracts, `lint-imports` in `make lint`): the checkout keeps them, and
an import that runs up a layer, or a runtime that queues its own work, breaks them. No two of the project's modules
(outside tests) import each other, even through others or inside a function. The broken cases run on a copy of the
checkout's packages with one bad import added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120,
                          check=False)


# Run in a process of its own: grimp finds the packages on sys.path, and this one has the checkout's imported.
# A circle is printed as the modules on it, the first again at the end; test modules are left out (they reach
# across everything to set up what they test).
_CIRCLES = """
import sys, tomllib
import grimp

packages = tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]["root_packages"]
graph = grimp.build_graph(*packages, cache_dir=None)
for module in list(graph.modules):
    parts = module.split(".")
    if "tests" in parts or "conftest" in parts or parts[-1].startswith("test_"):
        graph.remove_module(module)
circles = set()
for importer in graph.modules:
    for imported in graph.find_modules_directly_imported_by(importer):
        chain = graph.find_shortest_chain(importer=imported, imported=importer)
        if chain:
            ring = [importer, *chain[:-1]]
            at = ring.index(min(ring))  # one circle, whichever of its modules it was found from
            circles.add(" -> ".join(ring[at:] + ring[:at + 1]))
for circle in sorted(circles):
    print(circle)
"""


def _circles(root: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-c", _CIRCLES], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.splitlines()


def _copy(tmp_path: Path) -> Path:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    for package in packages:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "*.onnx", "*.zip", "results", "sample_models", "golden", "triton_models"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _add_import(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_checkout_keeps_its_layers() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    # deployments sits below the gateway and the pages.
    ("deployments.reconcile", "from web import views", "deployments.reconcile -> web.views"),
    ("deployments.canary", "from gateway import stats", "deployments.canary -> gateway.stats"),
    # accounts sits below audit (it signals, audit records).
    ("accounts.tokens", "from audit.log import record", "accounts.tokens -> audit.log"),
    # tuning's load generator is tuning's: bench may use it, not the other way round.
    ("tuning.measure", "from bench import stack", "tuning.measure -> bench.stack"),
    # A model-level module may not reach an API module, even of its own app.
    ("deployments.planning", "from deployments import api", "deployments.planning -> deployments.api"),
    # A runtime answers; the reconciler and the tasks act.
    ("deployments.runtimes.local.runtime", "from deployments import tasks",
     "deployments.runtimes.local.runtime -> deployments.tasks"),
    # The pages, the API and tuning ask the runtime protocol, through the registry; they import no runtime.
    ("web.overview", "from deployments.runtimes.local import triton",
     "web.overview -> deployments.runtimes.local.triton"),
    ("tuning.runner", "from deployments.runtimes.local import confined",
     "tuning.runner -> deployments.runtimes.local.confined"),
    ("deployments.api", "from deployments.runtimes.kubernetes import config",
     "deployments.api -> deployments.runtimes.kubernetes.config"),
    # The gateway wakes a pooled revision through the runtime's wake, not the pool's module.
    ("gateway.cold_start", "from deployments.runtimes.local import pool",
     "gateway.cold_start -> deployments.runtimes.local.pool"),
])
def test_an_import_up_the_layers_breaks_the_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = _copy(tmp_path)
    _add_import(root, module, line)
    result = _lint(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in result.stdout, result.stdout


def test_the_runtime_contract_names_who_may_import_a_runtime_and_exempts_no_import() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "runtimes-behind-the-registry"]
    assert contract["type"] == "protected" and "ignore_imports" not in contract
    assert contract["protected_modules"] == ["deployments.runtimes.local", "deployments.runtimes.kubernetes"]


def test_no_two_modules_of_the_checkout_import_each_other() -> None:
    assert _circles(ROOT) == []


def test_an_import_circle_is_found_even_through_a_third_module_and_inside_a_function(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # pool imports confined; confined importing runtime (which imports pool) closes a circle of three.
    _add_import(root, "deployments.runtimes.local.confined",
                "def _late() -> None:\n    from deployments.runtimes.local import runtime  # noqa: F401")
    assert "deployments.runtimes.local.confined -> deployments.runtimes.local.runtime -> " \
           "deployments.runtimes.local.pool -> deployments.runtimes.local.confined" in _circles(root)


# Folder by folder, as the layers contract orders them (its top-level names; "web : portal" share a rank): an arrow
# runs back up when a module imports one of a folder higher up. The contract's ignore_imports let an app's API
# modules, admin and management commands reach up (they are the top layer, spread over the apps); this counts every
# import, those included, so that a folder holds one layer.
_BACK_ARROWS = """
import tomllib
import grimp

config = tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]
layers = next(c for c in config["contracts"] if c["id"] == "layers")["layers"]
rank = {}
for height, layer in enumerate(reversed(layers)):
    for name in layer.replace("|", ":").split(":"):
        rank.setdefault(name.strip().split(".")[0], height)
graph = grimp.build_graph(*config["root_packages"], cache_dir=None)
for importer in sorted(graph.modules):
    parts = importer.split(".")
    if "tests" in parts or "conftest" in parts or parts[-1].startswith("test_"):
        continue
    for imported in sorted(graph.find_modules_directly_imported_by(importer)):
        if "tests" in imported.split("."):
            continue
        low, high = importer.split(".")[0], imported.split(".")[0]
        if low in rank and high in rank and rank[high] > rank[low]:
            print(importer, "->", imported)
"""


def _back_arrows(root: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-c", _BACK_ARROWS], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.splitlines()


def test_no_folder_imports_one_above_it() -> None:
    assert _back_arrows(ROOT) == []


def test_an_api_module_importing_the_pages_is_an_arrow_back_up(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # The layers contract lets an API module import anything; the folder count does not.
    _add_import(root, "tuning.api", "from web import inference  # noqa: F401")
    assert "tuning.api -> web.inference" in _back_arrows(root)
