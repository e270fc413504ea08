"""Test files share helpers through fixture modules and conftests, never by importing another test file: a test
module imported by another runs its module-level setup twice and ties the two files' contents together."""

from __future__ import annotations

import ast
import re

from tests.processes import ROOT

APPS = ("accounts", "audit", "models_registry", "deployments", "gateway", "tuning", "web", "portal", "modelport_cli",
        "modelport", "bench", "tests")

_MAYBE = re.compile(r"^\s*(from|import)\s[^\n]*\btest_", re.M)


def imports_of_test_modules(source: str) -> list[str]:
    """The modules named `test_*` that `source` imports from, anywhere in it (a function's own imports too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        found += [name for name in names if name.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_file_imports_from_a_test_file() -> None:
    offenders, test_files = {}, 0
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            test_files += path.name.startswith("test_")
            text = path.read_text()
            # Parsing every file costs seconds: only those naming a test_ module in an import line are read closely.
            found = imports_of_test_modules(text) if _MAYBE.search(text) else []
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert test_files > 100  # it read the project's tests, not an empty tree
    assert offenders == {}, "move what these import into a fixture module or a conftest: " + repr(offenders)


def test_the_check_sees_every_way_of_importing_one() -> None:
    source = ("from gateway.tests.test_infer_body import OK\n"
              "import tests.test_deploy_e2e\n"
              "def f():\n    from deployments.tests.test_pools import x\n"
              "from tests.deploying import deploy\n")
    assert imports_of_test_modules(source) == ["gateway.tests.test_infer_body", "tests.test_deploy_e2e",
                                               "deployments.tests.test_pools"]
    assert all(_MAYBE.search(line) for line in source.splitlines() if "test_" in line)

