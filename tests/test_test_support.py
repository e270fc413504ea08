"""Test files share helpers through fixture modules and conftests, never by importing another test file: a test
module imported by another runs its module-level setup twice and ties the two files' contents together."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.processes import ROOT

APPS = ("accounts", "audit", "models_registry", "deployments", "gateway", "tuning", "performance", "web", "portal",
        "modelport_cli", "modelport", "bench", "tests")

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



# --- Helpers come from the support package (tests/support/), fixtures from one conftest each ------------------------

_CONFTEST_IMPORT = re.compile(r"^\s*(from|import)\s[^\n]*\bconftest\b", re.M)


def imports_of_conftest_modules(source: str) -> list[str]:
    """The conftest modules that `source` imports, or imports from, anywhere in it: `from conftest import Person`,
    `from gateway.tests.conftest import call`, `from tests import conftest`, `import deployments.tests.conftest`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.rsplit(".", 1)[-1] == "conftest":
                found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names if alias.name == "conftest"]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.rsplit(".", 1)[-1] == "conftest"]
    return found


def _python_files() -> list[Path]:
    return [ROOT / "conftest.py"] + [path for app in APPS for path in sorted((ROOT / app).rglob("*.py"))]


def test_no_module_imports_from_a_conftest_module() -> None:
    """A conftest is pytest's, loaded once per directory: imported by name too it runs twice (once as `conftest`,
    once as `tests.conftest`) and its helpers are handed out two ways. Helpers live in tests/support/."""
    offenders, read = {}, 0
    for path in _python_files():
        text = path.read_text()
        read += 1
        found = imports_of_conftest_modules(text) if _CONFTEST_IMPORT.search(text) else []
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert read > 300
    assert offenders == {}, "import these from tests/support/ instead: " + repr(offenders)


def fixtures_defined(source: str) -> list[str]:
    """The names of the pytest fixtures that `source` defines (a fixture's `name=` where it gives one)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) not in ("pytest.fixture", "fixture"):
                continue
            given = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
            names.append(given[0].value if given and isinstance(given[0], ast.Constant) else node.name)
    return names


def test_each_fixture_name_is_defined_once() -> None:
    """One name, one meaning: a fixture defined in two test modules (or a module and a conftest) is either the same
    thing twice, which belongs in the narrowest conftest over both, or two things under one name, which a reader
    of either test cannot tell apart."""
    where: dict[str, list[str]] = {}
    for path in _python_files():
        if not (path.name.startswith("test_") or path.name == "conftest.py"):
            continue
        text = path.read_text()
        if "fixture" in text:
            for name in fixtures_defined(text):
                where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert len(where) > 50 and {"alice", "people", "digits"} <= where.keys()  # it found the project's fixtures
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert twice == {}, "rename, or move into one conftest: " + repr(twice)


def test_the_checks_see_every_way_of_importing_and_defining() -> None:
    source = ("from conftest import Person\n"
              "from gateway.tests.conftest import call\n"
              "from tests import conftest as fixtures\n"
              "def f():\n    import deployments.tests.conftest\n"
              "from tests.support.people import Person\n")
    assert imports_of_conftest_modules(source) == ["conftest", "gateway.tests.conftest", "tests.conftest",
                                                   "deployments.tests.conftest"]
    assert all(_CONFTEST_IMPORT.search(line) for line in source.splitlines() if "conftest" in line)
    fixtures = ("import pytest\n"
                "@pytest.fixture\ndef alice(): ...\n"
                "@pytest.fixture(scope='module')\ndef server(): ...\n"
                "@pytest.fixture(name='portal')\ndef _portal(): ...\n"
                "@pytest.mark.slow\ndef test_not_a_fixture(): ...\n")
    assert fixtures_defined(fixtures) == ["alice", "server", "portal"]
