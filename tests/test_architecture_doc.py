"""docs/architecture.md names the modules that own each step: every file, folder and dotted module it cites in
backticks exists in the checkout, so a move or a rename that forgets the page fails here. A bare file name
(`confined.py`) must match exactly one file of the tree, or one beside a path cited earlier in its paragraph."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

_PATH = re.compile(r"`([A-Za-z0-9_][A-Za-z0-9_./-]*\.(?:py|sh|md|yaml|yml|toml|html|js|txt))`")
_FOLDER = re.compile(r"`([a-z_]+(?:/[a-z0-9_]+)*/)`")
_ROOTS = ("accounts", "audit", "models_registry", "deployments", "gateway", "tuning", "web", "portal", "infra",
          "modelport", "modelport_cli", "bench")
_MODULE = re.compile(rf"`((?:{'|'.join(_ROOTS)})(?:\.[a-z_][a-z0-9_]*)+)`")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if (ROOT / line).exists()]


def _ignored_folders() -> set[str]:
    """What the processes make at run time and git ignores (`var/`): cited as a place, never tracked."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip("/") + "/" for line in lines if line.strip().endswith("/") and "*" not in line}


def cited_names_missing(text: str, files: list[str], made_at_run_time: frozenset[str] = frozenset()) -> list[str]:
    """What the page cites and the tree lacks, paragraph by paragraph (a bare name is looked up beside the paths its
    paragraph cited before it, then anywhere)."""
    missing: list[str] = []
    folders = {str(Path(f).parent) + "/" for f in files} | {"/".join(Path(f).parts[:i]) + "/"
                                                              for f in files for i in range(1, len(Path(f).parts))}
    for paragraph in re.split(r"\n\s*\n", text):
        near: list[str] = []
        for cited in _PATH.findall(paragraph):
            if "/" in cited.strip("./"):
                if cited.startswith("$") or not any(f == cited or f.endswith("/" + cited) for f in files):
                    missing.append(cited)
                else:
                    near.append(str(Path(cited).parent))
                continue
            beside = [d for d in near if f"{d}/{cited}" in files]
            if not beside and sum(1 for f in files if Path(f).name == cited) != 1:
                missing.append(cited)
        missing += [f for f in _FOLDER.findall(paragraph) if f not in folders and f not in made_at_run_time]
        for module in _MODULE.findall(paragraph):
            base = module.replace(".", "/")
            parent = base.rsplit("/", 1)[0]  # `pkg.module.attribute` names an attribute of a module
            if not ({base + ".py", base + "/__init__.py", parent + ".py"} & set(files)):
                missing.append(module)
    return missing


def test_every_name_the_architecture_page_cites_exists() -> None:
    assert cited_names_missing(DOC.read_text(), _tracked(), frozenset(_ignored_folders())) == []


def test_a_renamed_module_is_caught() -> None:
    files = ["deployments/runtimes/local/runtime.py", "deployments/runtimes/local/confined.py", "gateway/app.py"]
    text = ("The runtime: `deployments/runtimes/local/runtime.py` (+ `confined.py`).\n\n"
            "The gateway: `gateway/app.py`, `gateway/admission.py`, `deployments.runtimes.registry`, `gone.py`.")
    assert cited_names_missing(text, files) == ["gateway/admission.py", "gone.py", "deployments.runtimes.registry"]
