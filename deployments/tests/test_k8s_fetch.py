"""The init container's fetch-and-verify script (deployments/runtimes/kubernetes/fetch_repository.py), run as the
pod runs it (`python3 fetch.py manifest.json /models`) against a local HTTP server that plays S3's GET of presigned
URLs, including its answers to expired URLs, which moto does not check. test_k8s_s3.py runs the script against
moto's S3 server with URLs presigned by boto3."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deployments.runtimes.kubernetes import fetch_repository
from deployments.runtimes.kubernetes.manifests import FETCH_SCRIPT

EXPIRED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
           b"<Message>Request has expired</Message></Error>")


class FakeStore:
    """Objects by path; an answer can be replaced per path: (status, headers, body)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.answers: dict[str, list[tuple[int, dict[str, str], bytes]]] = {}
        self.requests: list[str] = []
        store = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                store.requests.append(path)
                queued = store.answers.get(path)
                status, headers, body = queued.pop(0) if queued else (
                    (200, {}, store.objects[path]) if path in store.objects else (404, {}, b"<Code>NoSuchKey</Code>"))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}?X-Amz-Signature=abc&X-Amz-Expires=60"


@pytest.fixture
def store() -> Iterator[FakeStore]:
    kube = FakeStore()
    yield kube
    kube.server.shutdown()
    kube.server.server_close()


FILES = {"digits/1/model.onnx": b"\x08\x07onnx bytes" * 1000, "digits/config.pbtxt": b'name: "digits"\n'}


def manifest(store: FakeStore, tmp_path: Path, files: dict[str, bytes] | None = None,
             recorded: dict[str, bytes] | None = None, directories: list[str] | None = None) -> Path:
    """Serve `files` and write a manifest recording `recorded` (default: the same bytes) for them."""
    files = FILES if files is None else files
    recorded = recorded or files
    entries = []
    for path, data in files.items():
        store.objects[f"/bucket/{path}"] = data
        truth = recorded[path]
        entries.append({"path": path, "size": len(truth), "sha256": hashlib.sha256(truth).hexdigest(),
                        "url": store.url(f"/bucket/{path}")})
    out = tmp_path / "manifest.json"
    out.write_text(json.dumps({"format": 1, "revision": 3, "expires_at": "2026-12-01T00:00:00Z", "files": entries,
                               "directories": directories or []}))
    return out


def run(manifest_path: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """As the init container runs it: the script file, a python3, nothing of the portal importable."""
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-I", str(FETCH_SCRIPT), str(manifest_path), str(target)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_it_fetches_every_file_and_creates_empty_version_directories(store: FakeStore, tmp_path: Path) -> None:
    result = run(manifest(store, tmp_path, directories=["pipeline/1"]), tmp_path / "models")
    assert result.returncode == 0, result.stdout + result.stderr
    assert tree(tmp_path / "models") == FILES
    assert (tmp_path / "models" / "pipeline" / "1").is_dir()
    assert "revision 3: 2 file(s) fetched, 0 already in place, 12015 bytes, every sha256 verified" in result.stdout
    assert "X-Amz-Signature" not in result.stdout + result.stderr  # the URLs are read credentials: never logged


def test_a_tampered_file_is_refused_and_never_put_in_place(store: FakeStore, tmp_path: Path) -> None:
    tampered = {**FILES, "digits/1/model.onnx": b"import os; os.system('curl evil')".ljust(12000, b"#")}
    result = run(manifest(store, tmp_path, files=tampered, recorded=FILES), tmp_path / "models")
    assert result.returncode == 2
    expected = hashlib.sha256(FILES["digits/1/model.onnx"]).hexdigest()
    got = hashlib.sha256(tampered["digits/1/model.onnx"]).hexdigest()
    assert (f"digits/1/model.onnx does not match what Modelport recorded: expected 12000 bytes, sha256 {expected}; "
            f"got 12000 bytes, sha256 {got}. Refusing to serve it.") in result.stdout
    assert not (tmp_path / "models" / "digits" / "1" / "model.onnx").exists()
    assert not list((tmp_path / "models").rglob("*.modelport-partial"))


def test_a_file_longer_than_recorded_is_cut_off_and_refused(store: FakeStore, tmp_path: Path) -> None:
    longer = {**FILES, "digits/config.pbtxt": FILES["digits/config.pbtxt"] + b"x" * 5_000_000}
    result = run(manifest(store, tmp_path, files=longer, recorded=FILES), tmp_path / "models")
    assert result.returncode == 2
    assert "digits/config.pbtxt does not match what Modelport recorded: expected 15 bytes" in result.stdout
    assert "got more than 15 bytes" in result.stdout
    assert not (tmp_path / "models" / "digits" / "config.pbtxt").exists()


def test_an_expired_url_exits_3_so_that_the_retried_container_reads_renewed_ones(store: FakeStore,
                                                                                  tmp_path: Path) -> None:
    path = manifest(store, tmp_path)
    store.answers["/bucket/digits/config.pbtxt"] = [(403, {"Content-Type": "application/xml"}, EXPIRED)]
    result = run(path, tmp_path / "models")
    assert result.returncode == 3
    assert "digits/config.pbtxt: S3 refused the download (expired): AccessDenied" in result.stdout
    assert "Modelport's worker renews them" in result.stdout
    # The kubelet runs the container again; by then the Secret holds renewed URLs (here: S3 answers again).
    result = run(path, tmp_path / "models")
    assert result.returncode == 0, result.stdout
    assert "1 file(s) fetched, 1 already in place" in result.stdout  # what was verified is kept
    assert tree(tmp_path / "models") == FILES


@pytest.mark.parametrize("bad_path", ["../escape", "/etc/passwd", "digits/../../escape", "a//b", "./a", "",
                                      "digits\\..\\x", "x.modelport-partial"])
def test_a_path_outside_the_repository_is_refused(store: FakeStore, tmp_path: Path, bad_path: str) -> None:
    path = manifest(store, tmp_path)
    raw = json.loads(path.read_text())
    raw["files"][0]["path"] = bad_path
    path.write_text(json.dumps(raw))
    result = run(path, tmp_path / "models")
    assert result.returncode == 1
    assert "the manifest has an invalid file path" in result.stdout
    assert not (tmp_path / "escape").exists() and store.requests == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("url", "file:///etc/passwd", "no http(s) URL"),
    ("sha256", "A" * 64, "an invalid sha256"),
    ("size", -1, "an invalid size"),
    ("size", True, "an invalid size"),
])
def test_a_malformed_manifest_entry_is_refused(store: FakeStore, tmp_path: Path, field: str, value: Any,
                                               message: str) -> None:
    path = manifest(store, tmp_path)
    raw = json.loads(path.read_text())
    raw["files"][0][field] = value
    path.write_text(json.dumps(raw))
    result = run(path, tmp_path / "models")
    assert result.returncode == 1 and message in result.stdout


def test_leftovers_of_an_earlier_try_are_removed(store: FakeStore, tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "digits" / "1").mkdir(parents=True)
    (root / "digits" / "1" / "model.onnx.modelport-partial").write_bytes(b"half")
    (root / "stray").mkdir()
    (root / "stray" / "model.py").write_text("print('not listed')")
    (root / "digits" / "config.pbtxt").symlink_to("/etc/hostname")
    result = run(manifest(store, tmp_path), root)
    assert result.returncode == 0, result.stdout
    assert tree(root) == FILES and not (root / "stray").exists()
    assert not (root / "digits" / "config.pbtxt").is_symlink()


def test_a_redirect_is_not_followed(store: FakeStore, tmp_path: Path) -> None:
    path = manifest(store, tmp_path)
    store.answers["/bucket/digits/config.pbtxt"] = [(307, {"Location": "http://elsewhere.example/x"}, b"")]
    result = run(path, tmp_path / "models")
    assert result.returncode == 1 and "refused redirect" in result.stdout


def test_a_server_error_is_retried(store: FakeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fetch_repository.time, "sleep", lambda seconds: None)
    path = manifest(store, tmp_path)
    store.answers["/bucket/digits/config.pbtxt"] = [(503, {}, b"<Code>SlowDown</Code>")] * 2
    assert fetch_repository.main(["fetch.py", str(path), str(tmp_path / "models")]) == 0
    assert "digits/config.pbtxt: HTTP 503; trying again" in capsys.readouterr().out
    assert store.requests.count("/bucket/digits/config.pbtxt") == 3
    assert tree(tmp_path / "models") == FILES


def test_it_runs_on_the_python_of_the_triton_image() -> None:
    """Triton 24.10's image has Python 3.10; the script keeps to Python 3.8 and the standard library."""
    source = FETCH_SCRIPT.read_text()
    tree_ = ast.parse(source, feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree_) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree_)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    calls = {node.attr for node in ast.walk(tree_) if isinstance(node, ast.Attribute)}
    assert not calls & {"removeprefix", "removesuffix", "is_relative_to"}  # 3.9+
