"""Which frameworks the runtime env has, and the limited subprocess that runs scripts in it.

Detection is tested on site-packages directories laid out as pip leaves them. run_in_runtime_env is tested with a
stand-in runtime env whose bin/python is this interpreter: the limits and the clean-up are what is under test,
not the frameworks.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from deployments import frameworks
from deployments.runtimes.local import triton as local_triton


def site_packages(tmp_path: Path, *entries: str) -> Path:
    root = tmp_path / "lib" / "python3.11" / "site-packages"
    root.mkdir(parents=True)
    for entry in entries:
        if entry.endswith(".dist-info"):
            (root / entry).mkdir()
        else:
            (root / entry).mkdir()
            (root / entry / "__init__.py").write_text("")
    return root


def test_it_finds_torch_and_tensorflow_cpu_with_their_versions(tmp_path: Path) -> None:
    root = site_packages(tmp_path, "torch", "torch-2.13.0+cpu.dist-info", "tensorflow",
                         "tensorflow_cpu-2.21.0.dist-info", "numpy", "numpy-1.26.4.dist-info")
    assert frameworks.detect(root) == {"torch": "2.13.0+cpu", "tensorflow": "2.21.0"}


def test_an_env_without_the_frameworks_has_none(tmp_path: Path) -> None:
    assert frameworks.detect(site_packages(tmp_path, "onnxruntime", "onnxruntime-1.32.0.dist-info")) == {}
    assert frameworks.detect(tmp_path / "missing") == {}


def test_a_dist_info_left_without_its_package_does_not_count(tmp_path: Path) -> None:
    root = site_packages(tmp_path, "torch-2.13.0.dist-info")
    (root / "torch").mkdir()  # a directory without __init__.py: what a broken uninstall leaves
    assert frameworks.detect(root) == {}


def test_detection_is_cached_until_site_packages_changes(tmp_path: Path) -> None:
    root = site_packages(tmp_path, "onnxruntime")
    assert frameworks.detect(root) == {}
    # Same mtime: the cached answer stands, even if something inside a package changed.
    (root / "onnxruntime" / "extra.py").write_text("")
    assert frameworks.detect(root) == {}
    # pip adds a package and its dist-info: site-packages' mtime moves, and detection runs again.
    before = root.stat().st_mtime_ns
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch-2.13.0.dist-info").mkdir()
    os.utime(root, ns=(before + 1_000_000, before + 1_000_000))
    assert frameworks.detect(root) == {"torch": "2.13.0"}


def test_the_missing_framework_message_names_the_command_that_adds_it() -> None:
    message = frameworks.missing_framework_message("tensorflow_savedmodel", {"torch": "2.13.0"})
    assert message == ("the local runtime env has no TensorFlow, which serves this format: an operator adds it with "
                       "`make runtime-env RUNTIME_EXTRAS=tensorflow` (a 310 MB download, 1.3 GB installed); or deploy "
                       "to Kubernetes")
    assert frameworks.missing_framework_message("tensorflow_savedmodel", {"tensorflow": "2.21.0"}) is None
    assert frameworks.missing_framework_message("onnx", {}) is None


def test_configured_extras_are_checked_against_the_env() -> None:
    unknown, missing = frameworks.check_configured_extras(["torch", "jax", "tensorflow"], {"torch": "2.13.0"})
    assert unknown == ["jax"]
    assert [f.name for f in missing] == ["tensorflow"]


def test_the_system_check_warns_about_a_configured_extra_the_env_lacks(settings: object, tmp_path: Path) -> None:
    from django.core.checks import Error, Warning

    from deployments.checks import runtime_extras

    settings.MODELPORT_RUNTIME_ENV = tmp_path / "no-env"  # type: ignore[attr-defined]
    settings.MODELPORT_RUNTIME_EXTRAS = ["torch", "pytorch"]  # type: ignore[attr-defined]
    messages = runtime_extras(None)
    assert [type(m) for m in messages] == [Error, Warning]
    assert messages[0].id == "modelport.E010" and "'pytorch'" in messages[0].msg
    assert messages[1].id == "modelport.W010"
    assert messages[1].hint == "Run `make runtime-env RUNTIME_EXTRAS=torch` (a 200 MB download, 0.9 GB installed)."
    settings.MODELPORT_RUNTIME_EXTRAS = []  # type: ignore[attr-defined]
    assert runtime_extras(None) == []


# --- run_in_runtime_env ----------------------------------------------------------------------------------------


@pytest.fixture
def fake_env(tmp_path: Path) -> local_triton.RuntimeEnv:
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    return local_triton.RuntimeEnv(root=root, python_version="3.11", site_packages=root / "lib",
                                   tritonserver=root / "bin" / "tritonserver")


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text("import json, os, sys, time\nresult = sys.argv[sys.argv.index('--result') + 1]\n" + body)
    return path


def test_it_returns_what_the_script_wrote_to_its_result_file(fake_env: local_triton.RuntimeEnv, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "do-not-leak")
    body = "print('noise on stdout'); open(result, 'w').write(json.dumps({'args': sys.argv[1:-2], 'env': dict(os.environ)}))"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), ["a", "b"], timeout=30,
                                            memory_bytes=2**30)
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.result["args"] == ["a", "b"]
    env = outcome.result["env"]
    assert "DJANGO_SECRET_KEY" not in env
    assert env["PATH"].split(os.pathsep)[0] == str(fake_env.bin_dir)


def test_a_script_past_its_time_is_killed_with_everything_it_started(fake_env: local_triton.RuntimeEnv,
                                                                     tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    body = (f"import subprocess\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\ntime.sleep(600)\n")
    started = time.monotonic()
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), [], timeout=2, memory_bytes=2**30)
    assert outcome.timed_out and outcome.returncode is None and outcome.result is None
    assert time.monotonic() - started < 20
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5  # the kill is sent at once; whoever adopts the orphan reaps it a moment later
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # dead, not yet reaped


def test_a_script_that_allocates_past_its_memory_limit_fails_and_says_so(fake_env: local_triton.RuntimeEnv,
                                                                          tmp_path: Path) -> None:
    body = "block = bytearray(2 * 1024**3)\nopen(result, 'w').write('{}')\n"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), [], timeout=30, memory_bytes=512 * 2**20)
    assert outcome.returncode != 0 and outcome.result is None
    assert outcome.out_of_memory, outcome.stderr


def test_an_oversized_or_broken_result_is_not_read(fake_env: local_triton.RuntimeEnv, tmp_path: Path) -> None:
    huge = "open(result, 'w').write(json.dumps(['x' * 1024] * 1024))"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, huge), [], timeout=30, memory_bytes=2**30)
    assert outcome.returncode == 0 and outcome.result is None
    broken = "open(result, 'w').write('{not json')"
    assert frameworks.run_in_runtime_env(fake_env, script(tmp_path, broken), [], timeout=30,
                                         memory_bytes=2**30).result is None


def test_stderr_comes_back_bounded(fake_env: local_triton.RuntimeEnv, tmp_path: Path) -> None:
    body = "sys.stderr.write('x' * 100_000 + 'the end')\nsys.exit(3)"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), [], timeout=30, memory_bytes=2**30)
    assert outcome.returncode == 3
    assert len(outcome.stderr) == frameworks.STDERR_TAIL_BYTES and outcome.stderr.endswith("the end")
