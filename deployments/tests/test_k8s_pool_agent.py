"""The pool agent (deployments/runtimes/kubernetes/pool_agent.py) for real: files from a local HTTP server (as S3's
presigned URLs serve them), Triton's repository API played by a local HTTP server that records the loads and
unloads and checks the admin key (no Triton image is needed to prove what the agent asks of it). Plain tests: no
database."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deployments.runtimes.kubernetes import pool_agent

KEY = "secret-admin-key"


class _Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_load: dict[str, str] = {}
        self.ready: set[str] = set()
        self.stats: dict[str, dict[str, Any]] = {}  # Triton's model_stats rows by model name (404 when empty)
        s3_stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v2/models/stats" and s3_stub.stats:
                    return self._json(200, {"model_stats": [{"name": name, **row} for name, row in
                                                            s3_stub.stats.items() if name in s3_stub.ready]})
                body = s3_stub.files.get(self.path.split("?")[0])
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get(pool_agent.ADMIN_HEADER) != KEY:
                    return self._json(403, {"error": "This API is restricted"})
                if self.path == "/v2/repository/index":
                    return self._json(200, [{"name": n, "state": "READY"} for n in sorted(s3_stub.ready)])
                parts = self.path.split("/")  # /v2/repository/models/NAME/ACTION
                name, action = parts[4], parts[5]
                s3_stub.calls.append((action, name))
                if action == "load" and name in s3_stub.fail_load:
                    return self._json(400, {"error": s3_stub.fail_load[name]})
                (s3_stub.ready.add if action == "load" else s3_stub.ready.discard)(name)
                return self._json(200, {})

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def s3_stub() -> Iterator[_Server]:
    found = _Server()
    yield found
    found.httpd.shutdown()
    found.httpd.server_close()


def _entry(s3_stub: _Server, key: str, files: dict[str, bytes], *, models: list[str] | None = None,
           lie: dict[str, Any] | None = None) -> dict[str, Any]:
    listed = []
    for path, data in files.items():
        s3_stub.files[f"/bucket/{path}"] = data
        item = {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "url": f"{s3_stub.url}/bucket/{path}?X-Amz-Signature=x"}
        item.update((lie or {}).get(path, {}))
        listed.append(item)
    return {"format": 1, "revision": key, "models": models or [f"{key}-digits"], "files": listed,
            "directories": []}


def _agent(tmp_path: Path, s3_stub: _Server, **limits: int) -> pool_agent.Agent:
    return pool_agent.Agent(tmp_path / "desired", tmp_path / "models", pool_agent.Triton(s3_stub.url, KEY),
                            max_file_bytes=limits.get("max_file_bytes", 1024 * 1024),
                            max_revision_bytes=limits.get("max_revision_bytes", 2 * 1024 * 1024))


def _write(tmp_path: Path, entry: dict[str, Any]) -> None:
    desired = tmp_path / "desired"
    desired.mkdir(exist_ok=True)
    (desired / f"{entry['revision']}.json").write_text(json.dumps(entry))


MODEL = b"\x08\x07onnx model bytes" * 100
CONFIG = b'name: "d3-r1-digits"\nbackend: "onnxruntime"\n'


def test_it_fetches_good_files_checks_them_and_loads_the_models(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/config.pbtxt": CONFIG,
                                              "d3-r1-digits/1/model.onnx": MODEL}))
    agent = _agent(tmp_path, s3_stub)
    assert agent.converge()
    assert agent.status() == {"loaded": ["d3-r1"], "failed": {}, "sha256": {}, "last_used": {},
                              "memory": {}}
    assert (tmp_path / "models/d3-r1-digits/1/model.onnx").read_bytes() == MODEL
    assert s3_stub.calls == [("load", "d3-r1-digits")]
    assert not agent.converge()  # nothing changed: nothing fetched or loaded again
    assert s3_stub.calls == [("load", "d3-r1-digits")]


def test_an_entry_marked_unloaded_is_unloaded_with_its_files_and_loaded_again_once_cleared(
        tmp_path: Path, s3_stub: _Server) -> None:
    entry = _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL})
    _write(tmp_path, entry)
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    _write(tmp_path, {**entry, "unloaded": True})  # the worker found it idle
    assert agent.converge()
    assert agent.status()["loaded"] == [] and agent.status()["failed"] == {}
    assert s3_stub.calls[-1] == ("unload", "d3-r1-digits")
    assert not (tmp_path / "models/d3-r1-digits").exists()  # fetched again (sha256 checked again) at the next load
    assert not agent.converge()
    _write(tmp_path, {**entry, "unloaded": "yes"})  # only `true` marks it: anything else is an entry to load
    assert agent.converge()
    assert agent.status()["loaded"] == ["d3-r1"]
    assert (tmp_path / "models/d3-r1-digits/1/model.onnx").read_bytes() == MODEL


def test_it_reports_last_use_and_measured_memory_from_tritons_statistics_and_ignores_odd_figures(
        tmp_path: Path, s3_stub: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL},
                            models=["d3-r1-digits", "d3-r1-head"]))
    s3_stub.stats = {"d3-r1-digits": {"last_inference": 0, "memory_usage": [
                        {"type": "GPU", "id": 0, "byte_size": 3 * 2**20}, {"type": "CPU", "id": 0, "byte_size": 5}]},
                    "d3-r1-head": {"last_inference": True, "memory_usage": [{"byte_size": -4}, "x"]}}
    agent = _agent(tmp_path, s3_stub)
    assert agent.converge()
    assert agent.status()["memory"] == {"d3-r1": {"digits": 3 * 2**20 + 5}}  # head reported nothing usable
    assert agent.status()["last_used"] == {}
    capsys.readouterr()
    s3_stub.stats["d3-r1-digits"]["last_inference"] = 1_764_600_000_000
    assert agent.converge()  # a use: reported
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert pool_agent.parse_status(line)["last_used"] == {"d3-r1": 1_764_600_000_000}  # type: ignore[index]
    s3_stub.stats["d3-r1-digits"]["last_inference"] = 1_764_600_005_000
    assert not agent.converge()  # 5 s later: not a line per request
    s3_stub.stats["d3-r1-digits"]["last_inference"] = 1_764_600_011_000
    assert agent.converge()
    assert agent.status()["last_used"] == {"d3-r1": 1_764_600_011_000}


def test_it_unloads_and_removes_a_revision_no_longer_listed(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    _write(tmp_path, _entry(s3_stub, "d3-r2", {"d3-r2-digits/1/model.onnx": MODEL}))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    (tmp_path / "desired/d3-r1.json").unlink()  # the rollout's retire: the old revision goes
    agent.converge()
    assert agent.status()["loaded"] == ["d3-r2"]
    assert ("unload", "d3-r1-digits") in s3_stub.calls
    assert not (tmp_path / "models/d3-r1-digits").exists()
    assert (tmp_path / "models/d3-r2-digits/1/model.onnx").exists()


def test_it_refuses_a_file_whose_sha256_does_not_match(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL},
                            lie={"d3-r1-digits/1/model.onnx": {"sha256": "0" * 64}}))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    assert "does not match what Modelport recorded" in agent.status()["failed"]["d3-r1"]
    assert s3_stub.calls == []  # Triton was never asked to load it
    assert not (tmp_path / "models/d3-r1-digits/1/model.onnx").exists()


@pytest.mark.parametrize("path", ["../escape/model.onnx", "/etc/passwd", "d3-r1-digits/../../x",
                                  "d9-r9-theirs/1/model.onnx", "other/1/model.onnx"])
def test_it_refuses_a_path_outside_the_revisions_own_directories(tmp_path: Path, s3_stub: _Server, path: str) -> None:
    entry = _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL})
    entry["files"][0]["path"] = path
    _write(tmp_path, entry)
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    assert "d3-r1" in agent.status()["failed"]
    assert s3_stub.calls == []
    assert not (tmp_path / "escape").exists() and not (tmp_path / "models/d9-r9-theirs").exists()


def test_it_refuses_an_oversize_file_before_downloading_it(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    agent = _agent(tmp_path, s3_stub, max_file_bytes=len(MODEL) - 1)
    agent.converge()
    assert f"over the pool's {len(MODEL) - 1} per file" in agent.status()["failed"]["d3-r1"]
    assert s3_stub.calls == []


def test_it_never_reads_past_the_recorded_size(tmp_path: Path, s3_stub: _Server) -> None:
    """The entry understates the size (within the bounds); the server sends more: refused, never written."""
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL},
                            lie={"d3-r1-digits/1/model.onnx": {"size": 10}}))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    assert "more than 10 bytes" in agent.status()["failed"]["d3-r1"]
    assert s3_stub.calls == []


def test_it_refuses_model_names_of_another_revision(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}, models=["d9-r9-theirs"]))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    assert "is not one of this revision's" in agent.status()["failed"]["d3-r1"]
    assert s3_stub.calls == []


def test_a_model_that_fails_to_load_fails_only_its_revision(tmp_path: Path, s3_stub: _Server) -> None:
    s3_stub.fail_load["d4-r1-bad"] = "failed to load 'd4-r1-bad': onnx runtime error"
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    _write(tmp_path, _entry(s3_stub, "d4-r1", {"d4-r1-bad/1/model.onnx": b"junk"}, models=["d4-r1-bad"]))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    status = agent.status()
    assert status["loaded"] == ["d3-r1"]
    assert status["failed"] == {"d4-r1": "model 'bad' failed to load: failed to load 'bad': onnx runtime error"}
    # beside it, the sha256 of the entry it refused (as mounted): the worker counts the refusal against that one
    assert status["sha256"] == {"d4-r1": hashlib.sha256((tmp_path / "desired/d4-r1.json").read_bytes()).hexdigest()}


def test_a_failed_entry_is_tried_again_once_the_worker_changes_it(tmp_path: Path, s3_stub: _Server) -> None:
    entry = _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL})
    good_url = entry["files"][0]["url"]
    entry["files"][0]["url"] = f"{s3_stub.url}/expired"
    _write(tmp_path, entry)
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    assert "d3-r1" in agent.status()["failed"]
    assert not agent.converge()  # the same entry is not hammered
    entry["files"][0]["url"] = good_url  # renewed URLs
    _write(tmp_path, entry)
    agent.converge()
    assert agent.status() == {"loaded": ["d3-r1"], "failed": {}, "sha256": {}, "last_used": {},
                              "memory": {}}


def test_a_restarted_agent_adopts_what_triton_has_loaded(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    _agent(tmp_path, s3_stub).converge()
    again = _agent(tmp_path, s3_stub)
    again.adopt()
    assert not again.converge()
    assert s3_stub.calls == [("load", "d3-r1-digits")]


def test_a_restarted_triton_that_forgot_its_models_gets_them_loaded_again(tmp_path: Path, s3_stub: _Server) -> None:
    """Only the triton container restarted (OOM, liveness): it comes back with nothing loaded; the agent's next
    pass sees it and loads the revision again rather than reporting it loaded."""
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    s3_stub.ready.clear()  # the restarted Triton has nothing loaded
    assert agent.converge()
    assert agent.status()["loaded"] == ["d3-r1"]
    assert s3_stub.calls == [("load", "d3-r1-digits"), ("load", "d3-r1-digits")]
    assert s3_stub.ready == {"d3-r1-digits"}


def test_while_triton_does_not_answer_nothing_is_reported_loaded(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    agent = _agent(tmp_path, s3_stub)
    agent.converge()
    agent.triton = pool_agent.Triton("http://127.0.0.1:9", KEY)  # nothing listens: Triton is restarting
    assert agent.converge()
    assert agent.status()["loaded"] == []
    assert not agent.converge()  # said once, not at every pass
    agent.triton = pool_agent.Triton(s3_stub.url, KEY)
    s3_stub.ready.clear()
    agent.converge()
    assert agent.status()["loaded"] == ["d3-r1"]


def test_it_calls_triton_on_localhost_directly_whatever_proxy_the_environment_names(
        tmp_path: Path, s3_stub: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    triton = pool_agent.Triton(s3_stub.url, KEY)
    assert triton.ready_models() == []
    assert triton.action("d3-r1-digits", "load") is None
    assert s3_stub.calls == [("load", "d3-r1-digits")]


def test_it_runs_as_a_module_and_prints_the_status_the_worker_reads(tmp_path: Path, s3_stub: _Server) -> None:
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    done = subprocess.run(
        [sys.executable, "-m", "deployments.runtimes.kubernetes.pool_agent", "--desired", str(tmp_path / "desired"),
         "--repository", str(tmp_path / "models"), "--triton", s3_stub.url, "--once",
         "--ready-file", str(tmp_path / "ready")],
        capture_output=True, text=True, timeout=60, env={"MODELPORT_ADMIN_KEY": KEY, "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    assert pool_agent.parse_status(done.stdout) == {"loaded": ["d3-r1"], "failed": {}, "sha256": {}, "last_used": {},
                              "memory": {}}
    assert (tmp_path / "ready").read_text() == "ready\n"  # the readiness probe's file, once the first pass is done


def test_it_runs_as_a_plain_script_beside_fetch_repository(tmp_path: Path, s3_stub: _Server) -> None:
    """In the pod, the agent and fetch_repository.py are two files of a ConfigMap, outside any package."""
    scripts = tmp_path / "agent"
    scripts.mkdir()
    source = Path(pool_agent.__file__).parent
    for name in ("pool_agent.py", "fetch_repository.py"):
        (scripts / name).write_text((source / name).read_text())
    _write(tmp_path, _entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}))
    done = subprocess.run(
        [sys.executable, "-I", str(scripts / "pool_agent.py"), "--desired", str(tmp_path / "desired"),
         "--repository", str(tmp_path / "models"), "--triton", s3_stub.url, "--once"],
        capture_output=True, text=True, timeout=60, env={"MODELPORT_ADMIN_KEY": KEY, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pool_agent.parse_status(done.stdout) == {"loaded": ["d3-r1"], "failed": {}, "sha256": {}, "last_used": {},
                              "memory": {}}


# --- Confinement: each model's limit for the stub wrapper, each model's own figure -----------------------------------


def _confined_agent(tmp_path: Path, s3_stub: _Server) -> pool_agent.Agent:
    return pool_agent.Agent(tmp_path / "desired", tmp_path / "models", pool_agent.Triton(s3_stub.url, KEY),
                            max_file_bytes=2**20, max_revision_bytes=2**30, limits_dir=tmp_path / "limits",
                            usage_dir=tmp_path / "usage")


def test_each_models_limit_is_written_before_its_load_and_removed_with_it(
        tmp_path: Path, s3_stub: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub wrapper of Triton's container (pool_stub.py) reads the limit when Triton starts the model's process,
    during the load: the file is there before the load is asked, and goes with the revision."""
    seen: dict[str, str] = {}
    original = pool_agent.Triton.action

    def action(triton: pool_agent.Triton, name: str, what: str) -> str | None:
        if what == "load":
            path = tmp_path / "limits" / name
            seen[name] = path.read_text() if path.is_file() else "missing"
        return original(triton, name, what)

    entry = {**_entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}, models=["d3-r1-digits", "d3-r1-head"]),
             "memory_limits": {"d3-r1-digits": 200 * 2**20, "d3-r1-head": 128 * 2**20}}
    _write(tmp_path, entry)
    agent = _confined_agent(tmp_path, s3_stub)
    monkeypatch.setattr(pool_agent.Triton, "action", action)
    agent.converge()
    assert agent.status()["loaded"] == ["d3-r1"]
    assert seen == {"d3-r1-digits": f"{200 * 2**20}\n", "d3-r1-head": f"{128 * 2**20}\n"}
    (tmp_path / "desired" / "d3-r1.json").unlink()
    agent.converge()
    assert list((tmp_path / "limits").iterdir()) == []


def test_a_python_backend_model_its_entry_gives_no_limit_is_refused_before_triton_is_asked(
        tmp_path: Path, s3_stub: _Server) -> None:
    """The wrapper would refuse to start its process (never unconfined), and Triton wait for the dead stub until the
    load times out, holding every other load of the agent: the agent refuses it first. A model in Triton's own
    process (a pipeline, a GPU model's native backend) needs none."""
    python = b'name: "d3-r1-digits"\nbackend: "python"\n'
    _write(tmp_path, _entry(s3_stub, "d3-r1",
                            {"d3-r1-digits/config.pbtxt": python, "d3-r1-digits/1/model.onnx": MODEL}))
    _write(tmp_path, _entry(s3_stub, "d4-r1", {"d4-r1-digits/config.pbtxt": CONFIG, "d4-r1-digits/1/model.onnx": MODEL},
                            models=["d4-r1-digits"]))
    agent = _confined_agent(tmp_path, s3_stub)
    agent.converge()
    assert "gives it no memory limit" in agent.status()["failed"]["d3-r1"]
    assert agent.status()["loaded"] == ["d4-r1"]
    assert s3_stub.calls == [("load", "d4-r1-digits")]  # Triton was never asked for d3-r1's model
    assert not (tmp_path / "models" / "d3-r1-digits").exists()


@pytest.mark.parametrize(("limits", "words"), [
    ({"d3-r1-digits": 2**31}, "within the pool's"),  # past the pool's budget
    ({"d3-r1-digits": 0}, "not a number of bytes"),
    ({"d3-r1-digits": -5}, "not a number of bytes"),
    ({"d3-r1-digits": True}, "not a number of bytes"),
    ({"d3-r1-digits": "100"}, "not a number of bytes"),
    ({"d4-r1-theirs": 100}, "not one of its models"),  # another revision's model: never its limit to set
    (["d3-r1-digits"], "not an object"),
])
def test_an_entrys_odd_memory_limits_are_refused_before_anything_is_written(
        tmp_path: Path, s3_stub: _Server, limits: Any, words: str) -> None:
    _write(tmp_path, {**_entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}), "memory_limits": limits})
    agent = _confined_agent(tmp_path, s3_stub)
    agent.converge()
    assert words in agent.status()["failed"]["d3-r1"]
    assert s3_stub.calls == [] and not (tmp_path / "limits").exists()


def test_a_models_figure_is_its_own_processes_peak_and_follows_its_use(
        tmp_path: Path, s3_stub: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    """What the generated models write (triton_batching.report_usage: each instance's VmHWM) is the figure, summed
    over the model's instances, in place of Triton's statistic; it is read again at each pass and reported when it
    grew by a tenth, and another model's files never count in it."""
    entry = {**_entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}, models=["d3-r1-digits", "d3-r1-head"]),
             "memory_limits": {"d3-r1-digits": 2**29, "d3-r1-head": 2**29}}
    _write(tmp_path, entry)
    s3_stub.stats = {"d3-r1-digits": {"memory_usage": [{"byte_size": 999}]},
                    "d3-r1-head": {"memory_usage": [{"byte_size": 5 * 2**20}]}}
    usage = tmp_path / "usage"
    (usage / "d3-r1-digits").mkdir(parents=True)
    (usage / "d3-r1-digits" / "d3-r1-digits_0").write_text(str(70 * 2**20))
    (usage / "d3-r1-digits" / "d3-r1-digits_1").write_text(str(72 * 2**20))
    (usage / "d3-r1-digits" / ".d3-r1-digits_2.tmp").write_text(str(2**40))  # half written: never read
    agent = _confined_agent(tmp_path, s3_stub)
    agent.converge()
    # The head writes nothing (it runs in Triton's process): Triton's figure for it.
    assert agent.status()["memory"] == {"d3-r1": {"digits": 142 * 2**20, "head": 5 * 2**20}}
    capsys.readouterr()
    (usage / "d3-r1-digits" / "d3-r1-digits_0").write_text(str(75 * 2**20))
    assert not agent.converge()  # 5 MiB more of 142: not worth a line
    (usage / "d3-r1-digits" / "d3-r1-digits_0").write_text(str(400 * 2**20))  # its arena grew under use
    assert agent.converge()
    status = pool_agent.parse_status(capsys.readouterr().out)
    assert status is not None and status["memory"]["d3-r1"]["digits"] == 472 * 2**20
    (usage / "d3-r1-digits" / "d3-r1-digits_0").write_text(str(10 * 2**20))  # a restarted instance: the peak stays
    agent.converge()
    assert agent.status()["memory"]["d3-r1"]["digits"] == 472 * 2**20


@pytest.mark.parametrize("junk", ["", "-1", "12x", "9" * 40, "\x00\xff"])
def test_a_usage_file_that_is_no_figure_is_not_believed(tmp_path: Path, s3_stub: _Server, junk: str) -> None:
    """The usage directory is writable from Triton's container (where a team's own pool runs its code): each file is
    read bounded, and what is not a non-negative integer counts nothing."""
    _write(tmp_path, {**_entry(s3_stub, "d3-r1", {"d3-r1-digits/1/model.onnx": MODEL}),
                      "memory_limits": {"d3-r1-digits": 2**29}})
    folder = tmp_path / "usage" / "d3-r1-digits"
    folder.mkdir(parents=True)
    (folder / "bad").write_text(junk)
    (folder / "good").write_text(str(80 * 2**20))
    agent = _confined_agent(tmp_path, s3_stub)
    agent.converge()
    assert agent.status()["memory"] == {"d3-r1": {"digits": 80 * 2**20}}
    assert agent.usage_bytes("d3-r1-nothing") is None


def test_the_worker_reads_only_a_well_formed_last_status_line() -> None:
    text = (pool_agent.STATUS_PREFIX + '{"loaded": ["d1-r1"], "failed": {}}\n'
            "modelport-pool-agent: d1-r1: unloaded\n"
            + pool_agent.STATUS_PREFIX + '{"loaded": [], "failed": {}}\n')
    assert pool_agent.parse_status(text) == {"loaded": [], "failed": {}}
    assert pool_agent.parse_status(pool_agent.STATUS_PREFIX + "not json") is None
    assert pool_agent.parse_status("nothing") is None


@pytest.mark.triton
def test_a_real_triton_serves_what_the_agent_fetched_and_unloads_it_when_told(tmp_path: Path, s3_stub: _Server) -> None:
    """The agent against a real tritonserver in explicit mode with its repository API restricted to the key (the
    pool pod's flags): an ONNX model rendered under its pool name is fetched, checked, loaded and answers; the key
    is needed; removing the entry unloads it and removes its files."""
    import time
    import urllib.error
    import urllib.request

    import numpy as np

    from deployments.render import render_repository
    from deployments.runtimes.local import backends
    from deployments.runtimes.local import triton as lt
    from deployments.spec import RepositorySpec
    from deployments.tests import local_triton

    env = local_triton.runtime_env()
    artifact = local_triton.matmul_onnx(tmp_path / "m.onnx")
    rendered = tmp_path / "rendered"
    render_repository(RepositorySpec(models=(local_triton.onnx_model("d3-r1-digits", artifact),)), "local", rendered)
    files = {p.relative_to(rendered).as_posix(): p.read_bytes() for p in sorted(rendered.rglob("*")) if p.is_file()}
    _write(tmp_path, _entry(s3_stub, "d3-r1", files))
    (tmp_path / "models").mkdir()
    process = lt.start_server(tmp_path / "models", tmp_path / "var" / "triton.log", env,
                              backends.build_backend_dir(env, tmp_path / "var"), model_control="explicit",
                              admin_key=KEY)
    url = f"http://127.0.0.1:{process.http_port}"
    try:
        deadline = time.monotonic() + 60
        while pool_agent.Triton(url, KEY).ready_models() is None:
            assert time.monotonic() < deadline, (tmp_path / "var" / "triton.log").read_text()[-2000:]
            time.sleep(0.2)
        assert pool_agent.Triton(url, "").ready_models() is None  # the repository API wants the key
        agent = pool_agent.Agent(tmp_path / "desired", tmp_path / "models", pool_agent.Triton(url, KEY),
                                 max_file_bytes=2**20, max_revision_bytes=2**22)
        agent.converge()
        assert agent.status()["loaded"] == ["d3-r1"], (tmp_path / "var/triton.log").read_text()[-2000:]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        assert np.allclose(local_triton.infer(process, "d3-r1-digits", {"x": x}, "y"), x @ local_triton.W, atol=1e-5)
        # Its statistics (not a restricted API) give the last inference the worker unloads an idle revision by.
        # Triton counts an inference after it has sent the answer: on a loaded machine the first read may not
        # have it yet, so the pass is repeated until it does.
        deadline = time.monotonic() + 30
        while not agent.converge():
            assert time.monotonic() < deadline, "the inference never showed in Triton's statistics"
            time.sleep(0.2)
        used = agent.status()["last_used"]["d3-r1"]
        # This binary's python backend (ONNX run by onnxruntime in it) reports no memory_usage: no figure, and the
        # worker keeps counting the revision at its estimate (docs/pools.md).
        assert agent.status()["memory"] == {}
        assert abs(used / 1000 - time.time()) < 60
        entry = json.loads((tmp_path / "desired" / "d3-r1.json").read_text())
        _write(tmp_path, {**entry, "unloaded": True})  # found idle: unloaded, its files removed
        agent.converge()
        assert agent.status()["loaded"] == [] and not (tmp_path / "models" / "d3-r1-digits").exists()
        assert "d3-r1-digits" not in (pool_agent.Triton(url, KEY).ready_models() or [])
        _write(tmp_path, entry)  # a request woke it: fetched again, checked again, loaded again
        agent.converge()
        assert agent.status()["loaded"] == ["d3-r1"]
        assert np.allclose(local_triton.infer(process, "d3-r1-digits", {"x": x}, "y"), x @ local_triton.W, atol=1e-5)
        (tmp_path / "desired" / "d3-r1.json").unlink()
        agent.converge()
        assert agent.status()["loaded"] == []
        assert "d3-r1-digits" not in (pool_agent.Triton(url, KEY).ready_models() or [])
        assert not (tmp_path / "models" / "d3-r1-digits").exists()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{url}/v2/models/d3-r1-digits/ready", timeout=5)
    finally:
        lt.stop_server(process.pid, grace_seconds=10)


def test_a_message_quoting_line_breaks_is_written_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Triton's error for a team's model is the team's words: no newline, U+2028, U+2029 or NEL in it may start a
    line that reads as the agent's about another revision (a shared deployment's log takes the agent's lines)."""
    pool_agent.log("d3-r1: refused: a\nmodelport-pool-agent: d4-r1: b\u2028c\u2029d\x85e\x1bf")
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.splitlines() == [out.rstrip("\n")]
    assert out == ("modelport-pool-agent: d3-r1: refused: a\\u000amodelport-pool-agent: d4-r1: b\\u2028c\\u2029d"
                   "\\u0085e\\u001bf\n")
