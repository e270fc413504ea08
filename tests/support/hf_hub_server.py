"""A small Hugging Face-compatible endpoint for the import tests (issue 35): HF_ENDPOINT points at it.

It speaks what huggingface_hub 2.4.0 calls (hf_api.py, file_download.py), read from its source:
- GET /api/models/{repo}[/revision/{rev}][?blobs=True] (HfApi.model_info): {"id", "sha", "siblings": [{"rfilename",
  "size", "blobId", "lfs": {"size", "sha256", "pointerSize"}}]}, sizes and blobs only with blobs=True;
- GET /api/models/{repo}/tree/{rev}[/{path}] (HfApi.list_repo_tree): [{"type": "file", "oid", "size", "path",
  "lfs": {"oid", "size", "pointerSize"}}];
- HEAD/GET /{repo}/resolve/{rev}/{file} (hf_hub_url, get_hf_file_metadata, hf_hub_download): X-Repo-Commit, ETag
  (the git blob id), and for LFS files X-Linked-Etag (the sha256), X-Linked-Size and a 302 to /cdn/{sha256} on
  another host name, as the hub redirects LFS files to its CDN; Content-Length on the body.
Errors answer as the hub does: 401 with X-Error-Code RepoNotFound or GatedRepo, 404 RevisionNotFound /
EntryNotFound, JSON {"error": ...}.

Every request is logged (method, path, headers) so a test can assert what was sent, the Authorization header above
all. A repo can lie: `lies` declares a size smaller than the bytes it serves, `names_listed` lists names it has no
file for (`../../etc/passwd`), `status` makes every request to it answer that code (a 503), the server's
`cdn_override` serves other bytes for a sha256, and its `cdn_hold` keeps the CDN's answers back until it is set.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class HubRepo:
    commit: str  # 40 hex digits: what every revision of this repo resolves to
    files: dict[str, bytes]
    lfs: frozenset[str] = frozenset()  # names stored in LFS (sha256 listed, served through the CDN redirect)
    token: str = ""  # non-empty: a gated repo, 401 unless "Authorization: Bearer <token>"
    revisions: frozenset[str] = frozenset({"main"})  # names besides the commit itself
    lies: dict[str, int] = field(default_factory=dict)  # name -> the size listed, whatever is served
    names_listed: tuple[str, ...] = ()  # extra names in the listing, with no file behind them
    status: int = 0  # non-zero: every request answers this
    metadata_in_info: bool = True  # False: model_info lists names only, as some mirrors do; the tree has the rest


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # A client that stops reading a body it refused (larger than listed) resets the connection: expected here.
        return


class HubServer:
    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.received: list[Received] = []
        self.cdn_override: dict[str, bytes] = {}  # sha256 -> the bytes the CDN serves instead (a tampered object)
        # Set to an Event: the CDN answers only once it is set (60 s at most), so that a test sees an import under
        # way, its total known and no byte fetched, for as long as it needs.
        self.cdn_hold: threading.Event | None = None
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # The CDN LFS files redirect to is another host name for the same server: huggingface_hub (and httpx) treat
        # it as the hub's CDN is treated, following it without the Authorization header.
        self.cdn_url = f"http://localhost:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="hf-hub-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def log(self, received: Received) -> None:
        with self._lock:
            self.received.append(received)

    def authorizations(self) -> list[str]:
        """The Authorization header of every request, "" where there was none."""
        with self._lock:
            return [item.headers.get("authorization", "") for item in self.received]

    def paths(self) -> list[str]:
        with self._lock:
            return [f"{item.method} {item.path}" for item in self.received]


@contextmanager
def running_hub(repos: dict[str, HubRepo]) -> Iterator[HubServer]:
    server = HubServer(repos)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            return

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            hub.log(Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            parts = [unquote(part) for part in url.path.strip("/").split("/")]
            query = parse_qs(url.query)
            if parts[:1] == ["cdn"] and len(parts) == 2:
                return self._cdn(parts[1], body)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(parts[2:], query, body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
            self._error(404, "EntryNotFound", "no such route", body)

        def _repo(self, name: str, revision: str, body: bool) -> HubRepo | None:
            repo = hub.repos.get(name)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found", body)
                return None
            if repo.status:
                self._error(repo.status, "", "unavailable", body)
                return None
            if repo.token and self.headers.get("Authorization", "") != f"Bearer {repo.token}":
                self._error(401, "GatedRepo", "Access to this repository is restricted", body)
                return None
            if revision not in repo.revisions and revision != repo.commit:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
                return None
            return repo

        def _api(self, parts: list[str], query: dict[str, list[str]], body: bool) -> None:
            name = f"{parts[0]}/{parts[1]}"
            rest = parts[2:]
            revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
            repo = self._repo(name, revision, body)
            if repo is None:
                return
            if rest[:1] == ["tree"]:
                prefix = "/".join(rest[2:])
                entries = [_tree_entry(repo, file) for file in _listed(repo)
                           if not prefix or file.startswith(prefix + "/")]
                return self._json(entries, body, repo)
            blobs = query.get("blobs", [""])[0].lower() == "true" and repo.metadata_in_info
            siblings = [_sibling(repo, file, blobs) for file in _listed(repo)]
            return self._json({"id": name, "modelId": name, "sha": repo.commit, "private": bool(repo.token),
                               "gated": "auto" if repo.token else False, "siblings": siblings}, body, repo)

        def _resolve(self, name: str, revision: str, file: str, body: bool) -> None:
            repo = self._repo(name, revision, body)
            if repo is None:
                return
            if file not in repo.files:
                return self._error(404, "EntryNotFound", f"{file} does not exist", body)
            data = repo.files[file]
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{git_blob_id(data)}"'}
            if file in repo.lfs:
                sha256 = hashlib.sha256(data).hexdigest()
                headers |= {"X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(_listed_size(repo, file)),
                            "Location": f"{hub.cdn_url}/cdn/{sha256}"}
                return self._send(302, b"", headers, body)
            self._send(200, data, headers | {"Content-Type": "application/octet-stream"}, body)

        def _cdn(self, sha256: str, body: bool) -> None:
            if hub.cdn_hold is not None:
                hub.cdn_hold.wait(60)
            if sha256 in hub.cdn_override:
                return self._send(200, hub.cdn_override[sha256], {"Content-Type": "application/octet-stream"}, body)
            for repo in hub.repos.values():
                for file, data in repo.files.items():
                    if file in repo.lfs and hashlib.sha256(data).hexdigest() == sha256:
                        return self._send(200, data, {"Content-Type": "application/octet-stream",
                                                      "ETag": f'"{sha256}"'}, body)
            self._error(404, "EntryNotFound", "no such object", body)

        def _json(self, value: object, body: bool, repo: HubRepo) -> None:
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json",
                                                         "X-Repo-Commit": repo.commit}, body)

        def _error(self, status: int, code: str, message: str, body: bool) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers, body)

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body and data:
                self.wfile.write(data)

    return Handler


def _listed(repo: HubRepo) -> list[str]:
    return sorted(repo.files) + list(repo.names_listed)


def _listed_size(repo: HubRepo, file: str) -> int:
    return repo.lies.get(file, len(repo.files.get(file, b"")))


def _sibling(repo: HubRepo, file: str, blobs: bool) -> dict[str, object]:
    if not blobs:
        return {"rfilename": file}
    data = repo.files.get(file, b"")
    sibling: dict[str, object] = {"rfilename": file, "size": _listed_size(repo, file), "blobId": git_blob_id(data)}
    if file in repo.lfs:
        sibling["lfs"] = {"size": _listed_size(repo, file), "sha256": hashlib.sha256(data).hexdigest(),
                          "pointerSize": 134}
    return sibling


def _tree_entry(repo: HubRepo, file: str) -> dict[str, object]:
    data = repo.files.get(file, b"")
    entry: dict[str, object] = {"type": "file", "oid": git_blob_id(data), "size": _listed_size(repo, file),
                                "path": file}
    if file in repo.lfs:
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": _listed_size(repo, file), "pointerSize": 134}
    return entry


# --- The repositories the tests serve --------------------------------------------------------------------------

ONNX_COMMIT = "1" * 40
PYTHON_COMMIT = "2" * 40
GATED_COMMIT = "3" * 40


@functools.cache
def tiny_onnx() -> bytes:
    """A real ONNX model, y = x * 2 + 1, x and y FP32 [batch, 4] (opset 13, IR 8: what the installed onnxruntime
    and Triton's read)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]), helper.make_node("Add", ["doubled", "one"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
                     numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def safetensors_of(tensors: dict[str, Any]) -> bytes:
    """numpy float32 arrays in the safetensors layout (a little-endian u64 header length, the JSON header, the raw
    bytes), written by hand: the safetensors package is not installed here, and the layout is four lines."""
    header: dict[str, object] = {}
    data = b""
    for name, array in tensors.items():
        raw = array.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


# A python-backend model that loads its safetensors weights with numpy alone (a real one would list `safetensors`
# in requirements.txt; this one needs no environment, so inspection's trial run runs it): y = x * scale + bias.
PYTHON_MODEL_PY = b'''import json
import struct
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def load_safetensors(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    body = raw[8 + length:]
    return {name: np.frombuffer(body[meta["data_offsets"][0]:meta["data_offsets"][1]], dtype="<f4")
            .reshape(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


class TritonPythonModel:
    def initialize(self, args):
        weights = load_safetensors(Path(__file__).parent / "model.safetensors")
        self.scale = weights["scale"]
        self.bias = weights["bias"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = (x * self.scale + self.bias).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
'''

PYTHON_SIGNATURE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}


def python_weights() -> bytes:
    import numpy as np

    return safetensors_of({"scale": np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32),
                           "bias": np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)})


DIGITS_COMMIT = "5" * 40


def digits_repo() -> HubRepo:
    """What docs/importing-hf.md's walkthrough imports as acme/digits-onnx: the digits sample's ONNX export
    (models_registry/samples.py; input `input`, FP32 [batch, 64]) as `model.onnx` in LFS, at `main` and `v1`."""
    from models_registry.samples import build_digits_onnx

    return HubRepo(commit=DIGITS_COMMIT, files={"model.onnx": build_digits_onnx().SerializeToString(),
                                                "README.md": b"# digits\n"},
                   lfs=frozenset({"model.onnx"}), revisions=frozenset({"main", "v1"}))


def standard_repos(*, gated_token: str = "hf_operator_token") -> dict[str, HubRepo]:
    """The repos most tests serve: an ONNX export, a python model with safetensors, the same export gated, and
    safetensors alone."""
    onnx_bytes = tiny_onnx()
    readme = b"# tiny\n"
    return {
        "acme/tiny-onnx": HubRepo(commit=ONNX_COMMIT, files={"model.onnx": onnx_bytes, "README.md": readme,
                                                             "config.json": b"{}"},
                                  lfs=frozenset({"model.onnx"}), revisions=frozenset({"main", "v1"})),
        "acme/tiny-python": HubRepo(commit=PYTHON_COMMIT, files={
            "model.py": PYTHON_MODEL_PY, "model.safetensors": python_weights(),
            "signature.json": json.dumps(PYTHON_SIGNATURE).encode(), "config.json": b"{}", "README.md": readme,
            "pytorch_model.bin": b"\x80\x02not needed"}, lfs=frozenset({"model.safetensors", "pytorch_model.bin"})),
        "acme/gated-onnx": HubRepo(commit=GATED_COMMIT, files={"model.onnx": onnx_bytes},
                                   lfs=frozenset({"model.onnx"}), token=gated_token),
        "acme/weights-only": HubRepo(commit="4" * 40, files={"model.safetensors": python_weights(),
                                                             "config.json": b"{}"},
                                     lfs=frozenset({"model.safetensors"})),
    }
