"""Which frameworks the runtime env has, and the limited subprocess that runs scripts in it.

Detection is tested on site-packages directories laid out as pip leaves them. run_in_runtime_env is tested with a
stand-in runtime env whose bin/python is this interpreter: the limits and the clean-up are what is under test,
not the frameworks; confined, with the real runtime env in a real sandbox (what it sees, what it may not do).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from modelport.core import frameworks
from modelport.core.runtime_env import RuntimeEnv


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
def fake_env(tmp_path: Path) -> RuntimeEnv:
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    return RuntimeEnv(root=root, python_version="3.11", site_packages=root / "lib",
                                   tritonserver=root / "bin" / "tritonserver")


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text("import json, os, sys, time\nresult = sys.argv[sys.argv.index('--result') + 1]\n" + body)
    return path


def test_it_returns_what_the_script_wrote_to_its_result_file(fake_env: RuntimeEnv, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "do-not-leak")
    body = ("print('noise on stdout'); "
            "open(result, 'w').write(json.dumps({'args': sys.argv[1:-2], 'env': dict(os.environ)}))")
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), ["a", "b"], timeout=30,
                                            memory_bytes=2**30)
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.result["args"] == ["a", "b"]
    env = outcome.result["env"]
    assert "DJANGO_SECRET_KEY" not in env
    assert env["PATH"].split(os.pathsep)[0] == str(fake_env.bin_dir)


def test_a_script_past_its_time_is_killed_with_everything_it_started(fake_env: RuntimeEnv,
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


def test_a_script_that_allocates_past_its_memory_limit_fails_and_says_so(fake_env: RuntimeEnv,
                                                                          tmp_path: Path) -> None:
    body = "block = bytearray(2 * 1024**3)\nopen(result, 'w').write('{}')\n"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), [], timeout=30, memory_bytes=512 * 2**20)
    assert outcome.returncode != 0 and outcome.result is None
    assert outcome.out_of_memory, outcome.stderr


def test_an_oversized_or_broken_result_is_not_read(fake_env: RuntimeEnv, tmp_path: Path) -> None:
    huge = "open(result, 'w').write(json.dumps(['x' * 1024] * 1024))"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, huge), [], timeout=30, memory_bytes=2**30)
    assert outcome.returncode == 0 and outcome.result is None
    broken = "open(result, 'w').write('{not json')"
    assert frameworks.run_in_runtime_env(fake_env, script(tmp_path, broken), [], timeout=30,
                                         memory_bytes=2**30).result is None


def test_stderr_comes_back_bounded(fake_env: RuntimeEnv, tmp_path: Path) -> None:
    body = "sys.stderr.write('x' * 100_000 + 'the end')\nsys.exit(3)"
    outcome = frameworks.run_in_runtime_env(fake_env, script(tmp_path, body), [], timeout=30, memory_bytes=2**30)
    assert outcome.returncode == 3
    assert len(outcome.stderr) == frameworks.STDERR_TAIL_BYTES and outcome.stderr.endswith("the end")


# --- run_in_runtime_env in the sandbox ------------------------------------------------------------------------------

CONFINED = """
import json, os, socket, sys
artifact, listen_port, secret, var_dir = sys.argv[1:5]
result = sys.argv[sys.argv.index('--result') + 1]
seen = {"uid": os.getuid(), "artifact": open(artifact).read(), "env": sorted(os.environ)}
for name, attempt in (("secret", lambda: open(secret).read()), ("var", lambda: os.listdir(var_dir)),
                      ("plant", lambda: open(os.path.join(var_dir, "planted"), "w").write("x")),
                      ("artifact_write", lambda: open(artifact, "a").write("x")),
                      ("tcp", lambda: socket.create_connection(("127.0.0.1", int(listen_port)), timeout=2))):
    try:
        attempt()
        seen[name] = "allowed"
    except OSError as exc:
        seen[name] = exc.strerror
# The result file is the script's to write; replacing it with a link to a file of the worker's must fail (it is a
# mount point), and the link must not be read if it did not.
if sys.argv[5] == "link":
    for replace in (lambda: os.unlink(result), lambda: os.symlink(secret, result + ".new"),
                    lambda: os.rename(result + ".new", result)):
        try:
            replace()
        except OSError:
            pass
else:
    open(result, "w").write(json.dumps(seen))
"""


def confined_run(tmp_path: Path, mode: str) -> tuple[frameworks.ScriptResult, Path]:
    import socket

    from deployments.tests.local_triton import runtime_env
    from modelport.core import sandbox

    options = sandbox.Options()
    caps = sandbox.check(options)
    if not caps.available:
        pytest.skip(f"this machine cannot build the sandbox: {caps.reason}")
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    secret = var_dir / "secret_key"
    secret.write_text('{"error": "the secret key"}')  # JSON, so that reading it through a link would show
    secret.chmod(0o600)
    artifact = tmp_path / "upload.bin"
    artifact.write_text("the artifact")
    artifact.chmod(0o600)  # as the store keeps uploads
    confinement = frameworks.Confinement(caps, options, name=f"mp-test-{os.getpid()}-{mode}", pids_max=64)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        outcome = frameworks.run_in_runtime_env(
            runtime_env(), script(tmp_path, CONFINED),
            [str(listener.getsockname()[1]), str(secret), str(var_dir), mode],
            artifact=artifact, timeout=60, memory_bytes=2**30, confinement=confinement)
    return outcome, var_dir


def test_a_confined_script_sees_its_artifact_and_nothing_of_the_worker(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "do-not-leak")
    outcome, var_dir = confined_run(tmp_path, "json")
    assert outcome.sandboxed and outcome.returncode == 0, outcome.stderr
    seen = outcome.result
    assert seen["uid"] == 1000 and seen["artifact"] == "the artifact"
    assert "DJANGO_SECRET_KEY" not in seen["env"]
    # var/ is not in the sandbox at all; the artifact is a read-only copy; Landlock refuses the connection.
    assert (seen["secret"], seen["var"], seen["plant"]) == ("No such file or directory",) * 3
    assert seen["artifact_write"] in ("Permission denied", "Read-only file system")  # by mode, Landlock or mount
    assert seen["tcp"] == "Permission denied"
    assert sorted(os.listdir(var_dir)) == ["secret_key"]


def test_a_result_file_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    outcome, _ = confined_run(tmp_path, "link")
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.result is None


FILLER = """
import json, os, sys
result = sys.argv[sys.argv.index('--result') + 1]
written, error = 0, None
chunk = b"x" * (4 * 2**20)
try:
    for n in range(64):  # 256 MiB, in files each under RLIMIT_FSIZE
        with open(os.path.join(os.environ["TMPDIR"], f"fill-{n}"), "wb") as f:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        written += len(chunk)
except OSError as exc:
    error = exc.errno
try:  # nor beside the result file, on the worker's disk
    open(os.path.join(os.path.dirname(result), "more"), "wb").write(chunk)
    beside = "allowed"
except OSError as exc:
    beside = exc.strerror
open(result, "w").write(json.dumps({"written": written, "errno": error, "beside": beside}))
"""


def test_a_one_shot_run_writing_past_its_scratch_bound_gets_enospc_and_the_workers_disk_stays_small(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21 (9): the trial run's scratch was the worker's disk; files of 16 MiB each (under RLIMIT_FSIZE)
    filled it for as long as the run lasted. Now it is a tmpfs of SANDBOX_SCRATCH_SIZE, as a Triton's is."""
    import errno

    from deployments.tests.local_triton import runtime_env
    from modelport.core import sandbox

    options = sandbox.Options(scratch_bytes=16 * 2**20)
    caps = sandbox.check(options)
    if not caps.available:
        pytest.skip(f"this machine cannot build the sandbox: {caps.reason}")
    on_host: list[int] = []
    real_run = sandbox.run

    def measured(spec: sandbox.Spec, *args: Any, **kwargs: Any) -> Any:
        finished = real_run(spec, *args, **kwargs)
        # What the run left in its work directory on the worker's disk, before it is removed.
        on_host.append(sum(p.stat().st_size for p in spec.scratch.parent.rglob("*") if p.is_file()))
        return finished

    monkeypatch.setattr(sandbox, "run", measured)
    confinement = frameworks.Confinement(caps, options, name=f"mp-test-{os.getpid()}-fill", pids_max=64)
    outcome = frameworks.run_in_runtime_env(runtime_env(), script(tmp_path, FILLER), [], timeout=60,
                                            memory_bytes=2**30, confinement=confinement)
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.result["errno"] == errno.ENOSPC
    assert outcome.result["written"] <= 16 * 2**20  # 4 files fit, the fifth does not
    assert outcome.result["beside"] != "allowed"
    [left] = on_host
    assert left < 2**20  # the copies of the script, the empty result's few bytes, stderr
