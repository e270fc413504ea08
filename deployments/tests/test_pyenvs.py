"""Python models' environments (deployments/pyenvs.py): requirements.txt parsed strictly (a hostile one chooses
neither the index nor a file), keys that stay stable, and builds serialized by a lock, with a fake pip (the real one
installs from an index in tests/test_pyenvs_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deployments import pyenvs
from deployments.tests.fake_pip import FakePip
from modelport.core import requirements as requirement_lines

IDENTITY = pyenvs.RuntimeIdentity("3.11.7", ("numpy==1.26.4", "onnxruntime==1.32.0"))


@pytest.mark.parametrize("line", [
    "-r other.txt",
    "--requirement=other.txt",
    "-e .",
    "-e git+https://github.com/x/y.git#egg=y",
    "--index-url http://attacker.example/simple",
    "-i http://attacker.example/simple",
    "--extra-index-url http://attacker.example/simple",
    "--find-links /tmp",
    "-f file:///etc",
    "-c /etc/passwd",
    "--trusted-host attacker.example",
    "git+https://github.com/x/y.git",
    "https://attacker.example/evil-1.0-py3-none-any.whl",
    "evil @ https://attacker.example/evil-1.0-py3-none-any.whl",
    "evil@https://attacker.example/evil.whl",
    "evil @ file:///etc/passwd",
    "./local-package",
    "../up",
    "/etc/passwd",
    "~/pkg",
    "numpy --hash=sha256:0123456789abcdef",
    "numpy --index-url=http://x",
    "numpy \\",
    "numpy; os.system('id')",
    "numpy==",
    "nu mpy",
    "a" * 501,
    # pip reads these as files in its working directory (and builds an sdist, even with --only-binary=:all:).
    "evil.tar.gz", "evil.whl", "evil.ZIP", "evil.tgz[extra]", "x===evil.tar.gz", "x===1.0", "x==1.0+evil.tgz",
    "x>=1,!=2.0+evil.whl",
    'evil.tar.gz; python_version >= "3"',
])
def test_a_line_that_is_not_a_plain_requirement_is_refused(line: str) -> None:
    with pytest.raises(requirement_lines.RequirementError):
        requirement_lines.parse_line(line)


@pytest.mark.parametrize("line", [
    "numpy", "numpy>=1.26", "tabulate[widechars]>=0.9,<1", 'six; python_version >= "3"', "zope.interface==5.*",
    "Pillow~=10.0", "torch==2.13.0+cpu",
])
def test_plain_requirements_are_accepted(line: str) -> None:
    assert requirement_lines.parse_line(line).name


@pytest.mark.parametrize("line", ["pip", "setuptools>=99", "wheel", "SetupTools", "pip==24.0",
                                  "distribute", 'wheel; python_version >= "3"', "pip[test]"])
def test_the_packaging_tools_are_refused_as_requirements(line: str) -> None:
    """The runtime env's pip, setuptools and wheel make the environment: a model's own copy (or a version the
    runtime env's constraints forbid) is refused at upload, saying so, not found out by a failed build."""
    with pytest.raises(requirement_lines.RequirementError, match="is a packaging tool, not a dependency"):
        requirement_lines.parse_line(line)


@pytest.mark.parametrize("line", ["pipx", "wheel-inspect", "setuptools-scm", "virtualenv", "build", "pip-tools"])
def test_packages_named_like_the_packaging_tools_are_accepted(line: str) -> None:
    assert requirement_lines.parse_line(line).name == line


def test_a_requirements_file_keeps_its_requirements_and_names_the_line_it_refuses() -> None:
    text = "# tools\nnumpy>=1.20  # arrays\n\ntabulate\n"
    assert requirement_lines.parse_requirements_txt(text) == ["numpy>=1.20", "tabulate"]
    with pytest.raises(requirement_lines.RequirementError,
                       match=r"requirements.txt line 3 \('--index-url http://evil/'\)"):
        requirement_lines.parse_requirements_txt("numpy\n\n--index-url http://evil/\n")
    with pytest.raises(requirement_lines.RequirementError, match="at most 100"):
        requirement_lines.parse_requirements_txt("\n".join(f"pkg{i}" for i in range(101)))


def test_stored_requirements_are_checked_with_their_number() -> None:
    with pytest.raises(requirement_lines.RequirementError,
                       match=r"requirement 2 \('-e \.'\) is refused: not a package"):
        requirement_lines.parse_requirements(["numpy", "-e ."])


def test_the_same_set_written_differently_normalizes_to_the_same_lines() -> None:
    one = requirement_lines.normalized(
        requirement_lines.parse_requirements(["Six>=1", "Tabulate[WideChars] <1, >=0.9", "six >= 1"]))
    two = requirement_lines.normalized(requirement_lines.parse_requirements(["tabulate[widechars]>=0.9,<1", "six>=1"]))
    assert one == two == ("six>=1", "tabulate[widechars]<1,>=0.9")


def test_keys_are_stable_and_change_with_the_requirements_or_the_runtime_env() -> None:
    key = pyenvs.env_key(("six>=1", "tabulate"), IDENTITY)
    # A changed key orphans every environment built so far: it changes only on purpose (KEY_VERSION).
    assert key == pyenvs.env_key(("six>=1", "tabulate"), pyenvs.RuntimeIdentity(IDENTITY.python_version,
                                                                               IDENTITY.distributions))
    assert len(key) == 32 and all(c in "0123456789abcdef" for c in key)
    assert pyenvs.env_key(("tabulate",), IDENTITY) != key
    assert pyenvs.env_key(("six>=1", "tabulate"), pyenvs.RuntimeIdentity("3.11.7", ("numpy==1.26.4",))) != key
    assert pyenvs.env_key(("six>=1", "tabulate"), pyenvs.RuntimeIdentity("3.11.8", IDENTITY.distributions)) != key


@pytest.mark.parametrize(("line", "satisfied"), [
    ("numpy", True), ("NumPy>=1.20,<2", True), ("numpy==1.26.*", True), ("numpy>=2", False), ("onnxruntime", True),
    ("tabulate", False), ("numpy[extra]", False), ('numpy; python_version >= "3"', False),
])
def test_what_the_runtime_env_has_needs_no_environment(line: str, satisfied: bool) -> None:
    assert pyenvs.satisfied_by(requirement_lines.parse_line(line), IDENTITY) is satisfied


@pytest.mark.parametrize(("line", "conflicts"), [
    ("numpy==2.4.6", True), ("NumPy>=2", True), ("onnxruntime<1", True), ("numpy[extra]==2.4.6", True),
    ("numpy", False), ("numpy==1.26.*", False), ("numpy>=1.26,<3", False), ("tabulate==0.9", False),
    ('numpy==2.4.6; python_version >= "3"', False),  # whether a marker applies is pip's to judge
])
def test_a_requirement_the_runtime_env_contradicts_is_named_with_its_version(line: str, conflicts: bool) -> None:
    found = pyenvs.runtime_conflicts([requirement_lines.parse_line(line)], IDENTITY)
    assert bool(found) is conflicts
    if conflicts:
        name = "onnxruntime" if "onnxruntime" in line else "numpy"
        assert found[0].startswith(f"{requirement_lines.parse_line(line)} asks for another")
        assert f"the runtime env's {dict(d.split('==') for d in IDENTITY.distributions)[name]}" in found[0]


def test_the_runtime_envs_identity_is_asked_once_until_its_site_packages_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pyenvs.clear_cache()
    calls = []
    real_run = subprocess.run

    def counting_run(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(pyenvs.subprocess, "run", counting_run)
    site = tmp_path / "site-packages"
    site.mkdir()
    first = pyenvs.runtime_identity(Path(sys.executable), site)
    assert first.python_version == ".".join(map(str, sys.version_info[:3]))
    assert any(d.lower().startswith("packaging==") for d in first.distributions)
    assert pyenvs.runtime_identity(Path(sys.executable), site) == first
    assert len(calls) == 1
    (site / "new_package").mkdir()  # what a pip install into the runtime env does to the directory
    pyenvs.runtime_identity(Path(sys.executable), site)
    assert len(calls) == 2
    with pytest.raises(pyenvs.BuildError, match="could not run"):
        pyenvs.runtime_identity(tmp_path / "no-python", tmp_path)


# --- Building, with a fake pip ------------------------------------------------------------------------------------


def build(layout: pyenvs.Layout, pip: FakePip, requirements: tuple[str, ...] = ("tabulate",),
          options: pyenvs.PipOptions | None = None) -> pyenvs.BuildResult:
    key = pyenvs.env_key(requirements, IDENTITY)
    return pyenvs.build(layout, key, requirements, Path("/rt/bin/python"), Path("/rt/lib/python3.11/site-packages"),
                        IDENTITY, options or pyenvs.PipOptions(), run=pip)


def test_a_build_installs_wheels_only_over_the_runtime_env_with_what_it_has_as_constraints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_KEY", "the portal's")  # pip never sees it (FakePip checks)
    monkeypatch.setenv("PIP_INDEX_URL", "https://the-operators-pip-config.example/simple")
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    pip = FakePip()
    options = pyenvs.PipOptions(index_url="https://mirror.internal/simple", find_links="/srv/wheelhouse")
    result = build(layout, pip, ("six>=1", "tabulate"), options)
    assert result.outcome == "built"
    key = pyenvs.env_key(("six>=1", "tabulate"), IDENTITY)
    env_dir = layout.env_dir(key)
    assert result.env_dir == env_dir
    venv, install = pip.commands
    assert pip.environments[1]["PIP_INDEX_URL"] == "https://the-operators-pip-config.example/simple"
    assert venv == ["/rt/bin/python", "-m", "venv", "--without-pip", str(env_dir)]
    assert install[:6] == ["/rt/bin/python", "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install"]
    assert "--only-binary=:all:" in install and "--no-input" in install
    assert install[install.index("-c") + 1] == str(env_dir / "modelport-constraints.txt")
    assert install[install.index("--index-url") + 1] == "https://mirror.internal/simple"
    assert install[install.index("--find-links") + 1] == "/srv/wheelhouse"
    assert install[-2:] == ["six>=1", "tabulate"]
    assert (env_dir / "modelport-constraints.txt").read_text() == "numpy==1.26.4\nonnxruntime==1.32.0\n"
    site = layout.site_packages(key, IDENTITY)
    assert (site / "_modelport_runtime_env.pth").read_text() == (
        "import site; site.addsitedir('/rt/lib/python3.11/site-packages')\n")
    assert (site / "tabulate.py").stat().st_mode & 0o777 == 0o644  # a sandboxed Triton reads it as another uid
    assert pyenvs.state_of(layout, key, 60) == pyenvs.EnvState("built")
    assert build(layout, pip).outcome == "built"  # another set: another environment
    assert build(layout, pip, ("six>=1", "tabulate")).outcome == "already-built"
    assert len(pip.commands) == 4


def test_without_operator_settings_pip_uses_its_own_configuration(tmp_path: Path) -> None:
    pip = FakePip()
    build(pyenvs.Layout(tmp_path), pip)
    assert "--index-url" not in pip.commands[1] and "--find-links" not in pip.commands[1]


def test_a_failed_install_keeps_pips_last_lines_and_leaves_no_half_environment(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    error = "ERROR: Could not find a version that satisfies the requirement nonexistent-pkg-zzz==9.9"
    result = build(layout, FakePip(fails_with=error), ("nonexistent-pkg-zzz==9.9",))
    assert result.outcome == "failed"
    assert result.message == f"Collecting nonexistent-pkg-zzz==9.9\n{error}"
    key = pyenvs.env_key(("nonexistent-pkg-zzz==9.9",), IDENTITY)
    assert not layout.env_dir(key).exists()
    assert pyenvs.state_of(layout, key, 60) == pyenvs.EnvState("failed", result.message)
    # The deployment that waited takes the failure; a retry builds again.
    assert pyenvs.forget_failure(layout, key) == result.message
    assert pyenvs.state_of(layout, key, 60).state == "missing"
    assert pyenvs.forget_failure(layout, key) == ""


def test_two_builds_of_one_key_never_race(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    key = pyenvs.env_key(("tabulate",), IDENTITY)
    pip = FakePip()
    with pyenvs._locked(layout.lock_file(key)) as mine:  # another worker's build holds the lock
        assert mine
        assert build(layout, pip).outcome == "busy"
    assert pip.commands == []
    assert build(layout, pip).outcome == "built"


def test_a_build_that_crashed_half_way_is_started_over(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    key = pyenvs.env_key(("tabulate",), IDENTITY)
    (layout.env_dir(key) / "lib").mkdir(parents=True)
    (layout.env_dir(key) / "half-written").write_text("")
    assert pyenvs.state_of(layout, key, 60).state == "missing"
    assert build(layout, FakePip()).outcome == "built"
    assert not (layout.env_dir(key) / "half-written").exists()


def test_a_queued_build_is_waited_for_until_it_is_presumed_lost(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    pyenvs.mark_requested(layout, "k", ("tabulate",))
    assert pyenvs.state_of(layout, "k", 60).state == "queued"
    old = time.time() - 120
    os.utime(layout.requested_file("k"), (old, old))
    assert pyenvs.state_of(layout, "k", 60).state == "missing"  # its worker died: ask again


def test_the_build_clears_its_request_whatever_happened(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    key = pyenvs.env_key(("nonexistent-pkg-zzz==9.9",), IDENTITY)
    pyenvs.mark_requested(layout, key, ("nonexistent-pkg-zzz==9.9",))
    build(layout, FakePip(fails_with="ERROR: nope"), ("nonexistent-pkg-zzz==9.9",))
    assert not layout.requested_file(key).exists()


def test_unused_environments_are_collected_after_a_while(tmp_path: Path) -> None:
    layout = pyenvs.Layout(tmp_path / "pyenvs")
    build(layout, FakePip(), ("tabulate",))
    build(layout, FakePip(), ("six",))
    used, unused = pyenvs.env_key(("tabulate",), IDENTITY), pyenvs.env_key(("six",), IDENTITY)
    assert pyenvs.collect_garbage(layout, {used}, 3600) == []  # recently used
    old = time.time() - 7200
    for key in (used, unused):
        os.utime(layout.env_dir(key) / pyenvs.BUILT_MARK, (old, old))
    assert pyenvs.collect_garbage(layout, {used}, 3600) == [
        f"removed the unused python environment {layout.env_dir(unused)}"]
    assert layout.env_dir(used).is_dir() and not layout.env_dir(unused).exists()
    pyenvs.touch(layout, used)
    assert pyenvs.collect_garbage(layout, set(), 3600) == []
