"""MLflow model registry imports (issue 35): `{"kind": "mlflow", "uri": "models:/<name>/<version>"}` or
`models:/<name>@<alias>`, fetched from the operator's tracking server (MLFLOW_TRACKING_URI) with the operator's
credentials only.

Why plain HTTP (urllib3, which the portal already has through botocore and the Kubernetes client) rather than
mlflow's client: every read here is bounded (a timeout per request, a size cap on JSON and on the MLmodel file,
every byte through `copy_counted` and the team's quota), whereas mlflow's artifact downloaders follow symlinks of a
local artifact root and have no size bound; and mlflow stays out of the portal's requirements (it is a test tool).

What the server is asked (MLflow 3's REST API, checked against mlflow 3.17.2):
- /api/2.0/mlflow/model-versions/get (or /registered-models/alias for `@alias`): the version, its run and source
  (`models:/m-<id>` for an MLflow 3 logged model, a run artifact path for older ones);
- /api/2.0/mlflow/model-versions/get-download-uri: where the artifacts are, whatever the source was;
- for `mlflow-artifacts:` locations (a server run with --serve-artifacts), the artifact proxy
  /api/2.0/mlflow-artifacts/artifacts (a listing per folder, then each file);
- for `file:` locations (an artifact root the worker can read), the folder is walked with lstat: a symbolic link,
  a device or a pipe anywhere in it is refused, naming it, and every file is opened with O_NOFOLLOW.

Nothing fetched is ever unpickled or imported here: MLmodel is read with yaml.safe_load, at most 1 MiB. A pyfunc
model (its python_model.pkl, cloudpickled) becomes a python-backend model whose generated model.py calls
mlflow.pyfunc.load_model inside Triton, that is, only in the sandbox (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse
from urllib.request import url2pathname

import urllib3
import yaml
from django.conf import settings

from modelport.core.signature import Signature, SignatureError, Tensor, parse_signature
from models_registry.sources import allowed
from models_registry.sources.base import (
    PIN_TIMEOUT_SECONDS,
    FetchContext,
    Fetched,
    SourceForbidden,
    SourceRefused,
    TransientFetchError,
    copy_counted,
    pack_tree,
    target_path,
)

log = logging.getLogger(__name__)

KIND = "mlflow"
# A registered model's name: MLflow accepts almost anything, but a name that goes into a URL path and into the
# version's record is kept to printable characters without '/', '@' or '%'.
_URI = re.compile(r"^models:/(?P<name>[^/@%\x00-\x1f\x7f]{1,256})"
                  r"(?:/(?P<version>[0-9]{1,12})|@(?P<alias>[A-Za-z0-9_\-]{1,255}))$")
_JSON_MAX_BYTES = 4 * 1024 * 1024
_MLMODEL_MAX_BYTES = 1024 * 1024
_REQUIREMENTS_MAX_BYTES = 256 * 1024
MODEL_DIR = "mlflow_model"  # the MLflow model's folder inside a generated python model


def parse_uri(uri: object) -> tuple[str, str | None, str | None]:
    """(name, version, alias) of a `models:/` URI; SourceRefused saying the accepted shapes for anything else."""
    match = _URI.match(uri) if isinstance(uri, str) else None
    if match is None:
        raise SourceRefused(f"source.uri must be models:/<registered model>/<version> or models:/<registered model>"
                            f"@<alias>, e.g. models:/fraud/3 or models:/fraud@champion; got {str(uri)[:200]!r}.")
    return match["name"], match["version"], match["alias"]


class MlflowFetcher:
    kind = KIND

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        unknown = sorted(str(key) for key in source if key not in ("kind", "uri"))
        if unknown:
            raise SourceRefused(f"An mlflow source has only kind and uri; leave out {unknown[:5]}.")
        name, _, _ = parse_uri(source.get("uri"))
        if not settings.MLFLOW_TRACKING_URI:
            raise SourceForbidden("MLflow imports are off on this portal: an operator turns them on by setting "
                                  "MLFLOW_TRACKING_URI to the tracking server.")
        if not allowed.matches(allowed.allowed_for(team_id).mlflow_models, name):
            raise SourceForbidden(f"Your team may not import the registered model {name!r}: an operator allows "
                                  "models by name in the team's Team sources (or IMPORT_MLFLOW_MODELS).")
        return {"kind": KIND, "uri": source["uri"]}

    def identity(self, source: dict[str, Any]) -> str | None:
        # A registry version's artifacts never change; an alias is moved from version to version.
        _, _, alias = parse_uri(source["uri"])
        return None if alias is not None else f"mlflow:{source['uri']}"

    def pinned(self, source: dict[str, Any], team_id: int) -> dict[str, Any] | None:
        name, _, alias = parse_uri(source["uri"])
        if alias is None or not settings.MLFLOW_TRACKING_URI:
            return None
        client = _Client(settings.MLFLOW_TRACKING_URI, timeout=PIN_TIMEOUT_SECONDS)
        found = client.get_json("/api/2.0/mlflow/registered-models/alias", {"name": name, "alias": alias},
                                f"alias {alias!r} of {name!r}")
        model_version = found.get("model_version")
        if not isinstance(model_version, dict) or not str(model_version.get("version", "")).isdigit():
            return None
        return {**source, "uri": f"models:/{name}/{int(model_version['version'])}"}

    def pinned_from(self, source: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
        name, _, alias = parse_uri(source["uri"])
        version = str(record.get("registry_version", ""))
        if alias is None or not version.isdigit():
            return None
        return {**source, "uri": f"models:/{name}/{int(version)}"}

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        name, version, alias = parse_uri(source.get("uri"))
        if not settings.MLFLOW_TRACKING_URI:
            raise SourceForbidden("MLflow imports are off on this portal (MLFLOW_TRACKING_URI is not set).")
        client = _Client(settings.MLFLOW_TRACKING_URI)
        if alias is not None:
            found = client.get_json("/api/2.0/mlflow/registered-models/alias", {"name": name, "alias": alias},
                                    f"alias {alias!r} of {name!r}")
        else:
            found = client.get_json("/api/2.0/mlflow/model-versions/get", {"name": name, "version": str(version)},
                                    f"version {version} of {name!r}")
        model_version = found.get("model_version")
        if not isinstance(model_version, dict) or not str(model_version.get("version", "")).isdigit():
            raise SourceRefused(f"The tracking server's answer for {source['uri']} has no model version.")
        version = str(model_version["version"])
        if model_version.get("status", "READY") != "READY":
            raise TransientFetchError(f"Version {version} of {name!r} is {model_version.get('status')} in MLflow, "
                                      "not READY yet.")
        location = client.get_json("/api/2.0/mlflow/model-versions/get-download-uri",
                                   {"name": name, "version": version}, f"version {version} of {name!r}")
        artifact_uri = location.get("artifact_uri")
        if not isinstance(artifact_uri, str) or not artifact_uri:
            raise SourceRefused(f"The tracking server gave no artifact location for version {version} of {name!r}.")
        store = _store_for(artifact_uri, client)

        staging = ctx.workdir / "staging"
        model_dir = staging / MODEL_DIR
        model_dir.mkdir(parents=True)
        listing = store.listing(ctx)
        total = sum(size for _, size in listing)
        ctx.progress(0, total)  # reserves the quota: a model larger than it is refused before any byte
        hashes: dict[str, str] = {}
        done = 0
        for relative, _ in listing:
            destination = target_path(model_dir, relative)
            with store.open(relative) as stream:
                written, digest = copy_counted(stream, destination, ctx, done, total)
            done += written
            hashes[relative] = digest
        if "MLmodel" not in hashes:
            raise SourceRefused(f"Version {version} of {name!r} has no MLmodel file among its artifacts: it is not "
                                "an MLflow model (log it with mlflow.<flavor>.log_model).")
        mlmodel = _read_mlmodel(model_dir / "MLmodel")
        run_id = str(model_version.get("run_id") or "")
        record: dict[str, Any] = {"uri": source["uri"], "registered_model": name, "registry_version": version,
                                  "run_id": run_id, "files": hashes}
        logged_from = shown_source(model_version.get("source"), run_id)
        if logged_from:
            record["source"] = logged_from
        return _convert(mlmodel, staging, model_dir, ctx, record)


fetcher = MlflowFetcher()


def shown_source(source: object, run_id: str) -> str:
    """What a version was registered from, as its team may see it: a `models:/` (an MLflow 3 logged model) or
    `runs:/` URI. A storage location (file:///srv/mlflow/..., s3://operator-bucket/..., mlflow-artifacts://host/...)
    is the operator's: one under the run's folder (MLflow lays a run's artifacts out as .../<run id>/artifacts/<path>)
    is shown as runs:/<run id>/<path>, any other is left out (""), never shown."""
    text = str(source or "")
    if re.fullmatch(r"(models|runs):/[^\x00-\x1f\x7f]{1,500}", text) and "://" not in text:
        return text
    marker = f"/{run_id}/artifacts/"
    if run_id and re.fullmatch(r"[0-9A-Za-z_-]{1,64}", run_id) and marker in text:
        path = text.split(marker, 1)[1].strip("/")
        if path and not re.search(r"[\x00-\x1f\x7f?#]", path) and ".." not in path.split("/"):
            return f"runs:/{run_id}/{path}"[:500]
    return ""


# --- The tracking server ----------------------------------------------------------------------------------------


class _Client:
    def __init__(self, base: str, timeout: float | None = None) -> None:
        self.base = base.rstrip("/")
        headers = {"User-Agent": "modelport-import"}
        if settings.MLFLOW_TRACKING_TOKEN:
            headers["Authorization"] = f"Bearer {settings.MLFLOW_TRACKING_TOKEN}"
        elif settings.MLFLOW_TRACKING_USERNAME:
            headers.update(urllib3.make_headers(
                basic_auth=f"{settings.MLFLOW_TRACKING_USERNAME}:{settings.MLFLOW_TRACKING_PASSWORD}"))
        self.headers = headers
        self.pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(settings.IMPORT_CONNECT_TIMEOUT_SECONDS, timeout or float("inf")),
                                    read=min(settings.IMPORT_READ_TIMEOUT_SECONDS, timeout or float("inf"))),
            retries=False)

    def request(self, path: str, query: dict[str, str] | None = None) -> urllib3.BaseHTTPResponse:
        url = self.base + path + (f"?{urlencode(query)}" if query else "")
        try:
            response = self.pool.request("GET", url, headers=self.headers, preload_content=False, redirect=False)
        except urllib3.exceptions.HTTPError as exc:
            raise TransientFetchError(f"The MLflow tracking server could not be reached ({type(exc).__name__}).") \
                from None
        if response.status >= 500 or response.status == 429:
            response.release_conn()
            raise TransientFetchError(f"The MLflow tracking server answered {response.status}.")
        if response.status in (401, 403):
            response.release_conn()
            raise SourceRefused(f"The MLflow tracking server refused the portal's credentials ({response.status}): "
                                "an operator checks MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD.")
        return response

    def get_json(self, path: str, query: dict[str, str], what: str) -> dict[str, Any]:
        response = self.request(path, query)
        try:
            body = response.read(_JSON_MAX_BYTES + 1)
        except urllib3.exceptions.HTTPError as exc:
            raise TransientFetchError(f"Reading the tracking server's answer failed ({type(exc).__name__}).") from None
        finally:
            response.release_conn()
        if len(body) > _JSON_MAX_BYTES:
            raise SourceRefused(f"The tracking server's answer about {what} is larger than {_JSON_MAX_BYTES} bytes.")
        try:
            data = json.loads(body)
        except ValueError:
            raise SourceRefused(f"The tracking server's answer about {what} is not JSON ({response.status}).") from None
        if response.status == 404 or (isinstance(data, dict) and data.get("error_code") in
                                      ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")):
            message = str(data.get("message", "")) if isinstance(data, dict) else ""
            raise SourceRefused(f"MLflow has no {what}: {message[:300]}")
        if response.status != 200 or not isinstance(data, dict):
            raise SourceRefused(f"The tracking server answered {response.status} about {what}.")
        return data


# --- Where the artifacts are: the artifact proxy, or a folder the worker reads --------------------------------


@dataclass
class _ProxyStore:
    client: _Client
    root: str  # the path under the proxy, e.g. "0/models/m-…/artifacts"

    def listing(self, ctx: FetchContext) -> list[tuple[str, int]]:
        files: list[tuple[str, int]] = []
        folders = [""]
        while folders:
            folder = folders.pop()
            path = f"{self.root}/{folder}".rstrip("/")
            data = self.client.get_json("/api/2.0/mlflow-artifacts/artifacts", {"path": path}, f"the folder {path!r}")
            entries = data.get("files", [])
            if not isinstance(entries, list):
                raise SourceRefused(f"The artifact listing of {path!r} is not a list.")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                    raise SourceRefused(f"The artifact listing of {path!r} holds an entry without a path.")
                leaf = entry["path"]
                # A listed name is one name inside the folder listed: '..', a '/' or an absolute path would make the
                # next request (or the file written) leave the model's folder.
                if leaf in ("", ".", "..") or "/" in leaf or "\\" in leaf:
                    raise SourceRefused(f"The artifact listing of {path!r} holds the name {leaf[:80]!r}, which is "
                                        "not a plain file or folder name: refused.")
                relative = f"{folder}/{leaf}".lstrip("/")
                target_path(Path("/nonexistent-root"), relative)  # the archive rules' name check, before any request
                if entry.get("is_dir"):
                    folders.append(relative)
                else:
                    size = entry.get("file_size")
                    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                        raise SourceRefused(f"The artifact listing gives {relative!r} no size.")
                    files.append((relative, size))
                if len(files) + len(folders) > settings.ARCHIVE_MAX_ENTRIES:
                    raise SourceRefused(f"The model holds more than {settings.ARCHIVE_MAX_ENTRIES} files "
                                        "(ARCHIVE_MAX_ENTRIES).")
            ctx.check_time()
        return sorted(files)

    def open(self, relative: str) -> Any:
        path = quote(f"{self.root}/{relative}")
        response = self.client.request(f"/api/2.0/mlflow-artifacts/artifacts/{path}")
        if response.status != 200:
            response.release_conn()
            raise SourceRefused(f"The artifact proxy answered {response.status} for {relative!r}.")
        return _Released(response)


class _Released:
    """A response as a context manager that hands its connection back."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self.response = response

    def read(self, size: int = -1) -> bytes:
        try:
            return self.response.read(size)
        except urllib3.exceptions.HTTPError as exc:
            raise TransientFetchError(f"Reading an artifact failed ({type(exc).__name__}).") from None

    def __enter__(self) -> _Released:
        return self

    def __exit__(self, *exc: object) -> None:
        self.response.release_conn()


@dataclass
class _LocalStore:
    root: Path

    def listing(self, ctx: FetchContext) -> list[tuple[str, int]]:
        try:
            mode = os.lstat(self.root).st_mode
        except OSError:
            log.warning("MLflow import: the artifact folder %s cannot be read", self.root)
            raise SourceRefused("The version's artifact folder cannot be read by the import worker: an operator "
                                "serves artifacts through the tracking server (--serve-artifacts) or mounts the "
                                "artifact root on the worker (the operator's log names the folder).") from None
        if not stat.S_ISDIR(mode):
            log.warning("MLflow import: the artifact location %s is not a folder", self.root)
            raise SourceRefused("The version's artifact location is not a folder (a link is refused).")
        files: list[tuple[str, int]] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            here = Path(dirpath)
            for leaf in sorted(dirnames) + sorted(filenames):
                path = here / leaf
                relative = path.relative_to(self.root).as_posix()
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    raise SourceRefused(f"The model's files hold a symbolic link, {relative!r} -> "
                                        f"{os.readlink(path)[:120]!r}: links are refused (they could point anywhere "
                                        "on the server). Replace it with the file itself.")
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    raise SourceRefused(f"The model's files hold {relative!r}, which is not a regular file (a device, "
                                        "a pipe or a socket): only files and folders are accepted.")
                files.append((relative, os.lstat(path).st_size))
                if len(files) > settings.ARCHIVE_MAX_ENTRIES:
                    raise SourceRefused(f"The model holds more than {settings.ARCHIVE_MAX_ENTRIES} files "
                                        "(ARCHIVE_MAX_ENTRIES).")
            ctx.check_time()
        return sorted(files)

    def open(self, relative: str) -> Any:
        # O_NOFOLLOW: a file swapped for a link between the listing and here is refused, not followed. A folder on
        # the way swapped for a link is caught by the resolved path check.
        path = self.root / relative
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise SourceRefused(f"The model's file {relative!r} now lies outside its folder (a link): refused.")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            raise SourceRefused(f"The model's file {relative!r} cannot be opened (it was removed, or is a link).") \
                from None
        return os.fdopen(fd, "rb")


def _store_for(artifact_uri: str, client: _Client) -> _ProxyStore | _LocalStore:
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "mlflow-artifacts":
        return _ProxyStore(client, parsed.path.strip("/"))
    if parsed.scheme == "file" or (parsed.scheme == "" and artifact_uri.startswith("/")):
        if parsed.netloc not in ("", "localhost"):
            log.warning("MLflow import: the artifact location %s is on another host", artifact_uri[:500])
            raise SourceRefused("The version's artifact location is a file: URI on another host, which the import "
                                "worker cannot read.")
        return _LocalStore(Path(url2pathname(parsed.path)))
    log.warning("MLflow import: the artifact location %s is in a store the portal does not read", artifact_uri[:500])
    scheme = re.sub(r"[^a-z0-9+.-]", "", parsed.scheme.lower())[:20]
    raise SourceRefused(f"The model's artifacts are in a store the portal does not read ({scheme}:): an operator "
                        "runs the tracking server with --serve-artifacts, so that artifacts come through it "
                        "(mlflow-artifacts:), or mounts a file: artifact root on the worker.")


# --- MLmodel, flavors and signatures -----------------------------------------------------------------------------


def _read_mlmodel(path: Path) -> dict[str, Any]:
    with open(path, "rb") as stream:
        raw = stream.read(_MLMODEL_MAX_BYTES + 1)
    if len(raw) > _MLMODEL_MAX_BYTES:
        raise SourceRefused(f"The model's MLmodel file is larger than {_MLMODEL_MAX_BYTES} bytes.")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SourceRefused(f"The model's MLmodel file is not valid YAML: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("flavors"), dict):
        raise SourceRefused("The model's MLmodel file has no flavors.")
    return data


# MLflow's numpy dtypes (tensor specs) and column types (column specs) as KServe datatypes.
_TENSOR_DTYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
                  "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
                  "float32": "FP32", "float64": "FP64", "str": "BYTES", "object": "BYTES", "bytes": "BYTES"}
_COLUMN_TYPES = {"boolean": "BOOL", "integer": "INT32", "long": "INT64", "float": "FP32", "double": "FP64",
                 "string": "BYTES", "binary": "BYTES"}


@dataclass(frozen=True)
class Converted:
    """A signature and how the generated model.py hands tensors to the model: "tensor" (numpy arrays, a dict when
    named) or "columns" (a pandas DataFrame, one tensor [-1, 1] a column)."""

    signature: Signature
    input_kind: str
    output_kind: str
    named_inputs: bool
    named_outputs: bool


def _specs(side: str, raw: object) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise SourceRefused(f"The MLmodel signature's {side} are not JSON.") from None
    if not isinstance(raw, list) or not raw or not all(isinstance(spec, dict) for spec in raw):
        raise SourceRefused(f"The MLmodel signature's {side} are empty or not a list of specs.")
    return raw


def _side(side: str, raw: object, default_name: str) -> tuple[tuple[Tensor, ...], str, bool]:
    specs = _specs(side, raw)
    kinds = {spec.get("type") for spec in specs}
    named = all(isinstance(spec.get("name"), str) and spec["name"] for spec in specs)
    if not named and len(specs) > 1:
        raise SourceRefused(f"The MLmodel signature's {side} are several and unnamed: log the model with a "
                            "signature naming each one.")
    tensors: list[Tensor] = []
    if kinds == {"tensor"}:
        for spec in specs:
            tensor_spec = spec.get("tensor-spec") or {}
            dtype = _TENSOR_DTYPES.get(str(tensor_spec.get("dtype")))
            shape = tensor_spec.get("shape")
            if dtype is None:
                raise SourceRefused(f"The MLmodel signature's {side} use the dtype {tensor_spec.get('dtype')!r}, "
                                    f"which Triton has no type for: use one of {', '.join(_TENSOR_DTYPES)}.")
            if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d != 0 for d in shape):
                raise SourceRefused(f"The MLmodel signature's {side} give the shape {shape!r}: a full shape is "
                                    "needed, -1 for a dynamic dimension.")
            tensors.append(Tensor(name=spec["name"] if named else default_name, datatype=dtype,
                                  dims=tuple(max(d, -1) for d in shape)))
        return tuple(tensors), "tensor", named
    if kinds <= {"boolean", "integer", "long", "float", "double", "string", "binary"}:
        for spec in specs:
            # [-1, 1]: a row a batch element, so that Triton batches rows of several requests together.
            tensors.append(Tensor(name=spec["name"] if named else default_name, datatype=_COLUMN_TYPES[spec["type"]],
                                  dims=(-1, 1)))
        return tuple(tensors), "columns", named
    raise SourceRefused(f"The MLmodel signature's {side} use {sorted(str(k) for k in kinds)[:5]}, which cannot be "
                        "mapped to Triton tensors: log the model with a tensor signature, or with columns of "
                        "boolean, integer, long, float, double, string or binary.")


def convert_signature(mlmodel: dict[str, Any]) -> Converted:
    """MLflow's signature (MLmodel `signature: inputs/outputs`) as a Modelport Signature; SourceRefused for what
    cannot be mapped (no signature, params, objects, arrays)."""
    signature = mlmodel.get("signature")
    if not isinstance(signature, dict) or not signature.get("inputs") or not signature.get("outputs"):
        raise SourceRefused("The MLflow model has no signature with inputs and outputs: log it with "
                            "signature=mlflow.models.infer_signature(example_input, example_output).")
    if signature.get("params") not in (None, "null", "[]"):
        raise SourceRefused("The MLflow model's signature has params, which a Triton model has no place for: log it "
                            "without params.")
    inputs, input_kind, named_inputs = _side("inputs", signature["inputs"], "input")
    outputs, output_kind, named_outputs = _side("outputs", signature["outputs"], "output")
    # Through the one signature parser, so that names and shapes meet the rules an uploaded signature meets.
    try:
        parsed = parse_signature({"inputs": [t.to_json() for t in inputs], "outputs": [t.to_json() for t in outputs]})
    except SignatureError as exc:
        raise SourceRefused(f"The MLflow model's signature cannot be used: {exc}") from None
    return Converted(parsed, input_kind, output_kind, named_inputs, named_outputs)


def _flavor_file(model_dir: Path, relative: object, what: str) -> Path:
    if not isinstance(relative, str) or not relative:
        raise SourceRefused(f"The MLmodel file names no {what}.")
    path = target_path(model_dir, relative)
    if not path.is_file():
        raise SourceRefused(f"The MLmodel file names {relative[:120]!r} as its {what}, which is not among its files.")
    return path


_NOT_TORCHSCRIPT = ("The MLflow pytorch model is not TorchScript (it is a pickled torch.save() or a pt2 export, which "
                    "the portal does not unpickle): log a scripted model, "
                    "mlflow.pytorch.log_model(torch.jit.script(model), ...).")


def _convert(mlmodel: dict[str, Any], staging: Path, model_dir: Path, ctx: FetchContext,
             record: dict[str, Any]) -> Fetched:
    flavors: dict[str, Any] = mlmodel["flavors"]
    limits = {"max_entries": settings.ARCHIVE_MAX_ENTRIES, "max_total_size": settings.ARCHIVE_MAX_TOTAL_SIZE}
    if isinstance(flavors.get("onnx"), dict):
        source = _flavor_file(model_dir, flavors["onnx"].get("data"), "ONNX file")
        out = ctx.workdir / "model.onnx"
        shutil.move(source, out)
        # The .onnx carries its own tensor names and types, which inspection reads; MLflow's unnamed specs would
        # only disagree with them.
        return Fetched(out, "model.onnx", "onnx", None, None, {**record, "flavor": "onnx"})
    if isinstance(flavors.get("pytorch"), dict):
        conf = flavors["pytorch"]
        data = conf.get("model_data", "data")
        # MLflow writes data/model.pth (TorchScript, or a pickled torch.save) or, for serialization_format="pt2",
        # data/model.pt2 (torch.export.save, whose weights and sample inputs are pickles too). Which one is told
        # from the file's name and its zip's central directory alone: nothing in either is ever unpickled here.
        if isinstance(data, str) and not target_path(model_dir, f"{data}/model.pth").is_file() and \
                target_path(model_dir, f"{data}/model.pt2").is_file():
            raise SourceRefused(_NOT_TORCHSCRIPT)
        source = _flavor_file(model_dir, f"{data}/model.pth" if isinstance(data, str) else None, "PyTorch model")
        if not _is_torchscript(source):
            raise SourceRefused(_NOT_TORCHSCRIPT)
        converted = convert_signature(mlmodel)
        out = ctx.workdir / "model.pt"
        shutil.move(source, out)
        return Fetched(out, "model.pt", "torchscript", converted.signature, None, {**record, "flavor": "pytorch"})
    if isinstance(flavors.get("tensorflow"), dict):
        conf = flavors["tensorflow"]
        saved = conf.get("saved_model_dir")
        if not isinstance(saved, str) or conf.get("model_type", "tf2-module") != "tf2-module":
            raise SourceRefused("The MLflow tensorflow model is a Keras file, not a SavedModel: log a tf.Module "
                                "(mlflow.tensorflow.log_model(tf_module, ...)) or export a SavedModel and upload it.")
        folder = target_path(model_dir, saved)
        if not (folder / "saved_model.pb").is_file():
            raise SourceRefused(f"The MLflow tensorflow model's {saved[:120]!r} holds no saved_model.pb.")
        out = ctx.workdir / "model.tar"
        pack_tree(folder, out, **limits)
        return Fetched(out, "model.tar", "tensorflow_savedmodel", None, None, {**record, "flavor": "tensorflow"})
    if isinstance(flavors.get("python_function"), dict):
        converted = convert_signature(mlmodel)
        requirements = _requirements(model_dir, flavors["python_function"])
        (staging / "model.py").write_text(_model_py(converted))
        (staging / "requirements.txt").write_text("".join(f"{line}\n" for line in requirements))
        out = ctx.workdir / "model.tar"
        pack_tree(staging, out, **limits)
        shutil.rmtree(staging)
        return Fetched(out, "model.tar", "python", converted.signature, None, {**record, "flavor": "python_function"})
    raise SourceRefused(f"The MLflow model's flavors ({', '.join(sorted(map(str, flavors))[:8])}) have none the "
                        "portal serves: onnx, pytorch (TorchScript), tensorflow (SavedModel) or python_function.")


def _is_torchscript(path: Path) -> bool:
    # The zip's central directory only: TorchScript writes code/ beside data.pkl, torch.save does not.
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any("/code/" in name for name in names) and any(name.endswith("/data.pkl") for name in names)


def _read_small(path: Path) -> str:
    with open(path, "rb") as stream:
        raw = stream.read(_REQUIREMENTS_MAX_BYTES + 1)
    if len(raw) > _REQUIREMENTS_MAX_BYTES:
        raise SourceRefused(f"The model's {path.name} is larger than {_REQUIREMENTS_MAX_BYTES} bytes.")
    return raw.decode("utf-8", errors="replace")


def _requirements(model_dir: Path, pyfunc: dict[str, Any]) -> list[str]:
    """The MLflow model's pip requirements (requirements.txt, else conda.yaml's pip list), for the environment the
    deployment builds (deployments/pyenvs.py). `mlflow==X` becomes `mlflow-skinny>=X`: skinny is the part of mlflow
    that loads and runs a pyfunc, without the tracking server's dependencies (Flask, SQLAlchemy, pyarrow, ...), so
    the environment builds in seconds (8 s here, against minutes); and "X or newer" because every package of the
    runtime env is a constraint of that build, and an exact old mlflow can pin below one of them (mlflow-skinny
    3.17.2 wants importlib-metadata<10, the runtime env has 10.2.0; 3.18.0 fits). pandas, which pyfunc needs and
    skinny does not pull, is added.

    An exact numpy pin (`numpy==2.4.6`, which MLflow writes by default: the logging machine's version) becomes
    `numpy`. Triton's python backend serves every python model with its own numpy, the runtime env's (numpy<2 on
    every runtime: the stub is built against it, docs/local-runtime.md), and an environment never replaces it (the
    runtime env's packages are constraints of its build); kept, the pin fails that build at deploy time with pip's
    ResolutionImpossible. model.py lets what numpy 2 pickled load on numpy 1 (_NUMPY_ALIAS). A numpy range the
    model states (`numpy>=2.1`) is kept: the deployment's plan check refuses it naming the runtime's numpy. The pins
    as logged stay in the model's own folder (mlflow_model/requirements.txt), whose sha256 the version records.

    The other lines are the model's own; inspection checks every line again (plain PEP 508 requirements only)."""
    lines: list[str] = []
    if (model_dir / "requirements.txt").is_file():
        lines = [line.strip() for line in _read_small(model_dir / "requirements.txt").splitlines()]
    else:
        env = pyfunc.get("env")
        conda = env.get("conda") if isinstance(env, dict) else env
        if isinstance(conda, str) and (model_dir / conda).is_file():
            try:
                data = yaml.safe_load(_read_small(target_path(model_dir, conda)))
            except yaml.YAMLError:
                data = None
            for dependency in (data or {}).get("dependencies", []) if isinstance(data, dict) else []:
                if isinstance(dependency, dict) and isinstance(dependency.get("pip"), list):
                    lines = [str(line).strip() for line in dependency["pip"]]
    kept: list[str] = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        full = re.match(r"^mlflow(?:\[[^\]]*\])?\s*(?:==\s*(?P<version>[0-9][0-9A-Za-z.]*))?\s*$", line)
        if full:
            line = f"mlflow-skinny>={full['version']}" if full["version"] else "mlflow-skinny"
        elif re.match(r"^mlflow\b(?![-_.])", line):
            line = "mlflow-skinny" + line[len("mlflow"):].split("]", 1)[-1].lstrip()  # other specifiers, kept
        elif re.match(r"^numpy\s*==\s*[0-9][0-9A-Za-z.*+!]*\s*(?:;.*)?$", line, re.IGNORECASE):
            line = "numpy"
        kept.append(line)
    if not any(re.match(r"^mlflow-skinny\b", line) for line in kept):
        kept.insert(0, "mlflow-skinny")
    if not any(re.match(r"^pandas\b", line) for line in kept):
        kept.append("pandas")
    return kept


# Part of model.py, run before the model is unpickled. A model logged under numpy 2 names numpy 2's modules in its
# pickle (an array cloudpickled is numpy._core.numeric._frombuffer), and numpy 1.26, the serving numpy, has only a
# few of those names (numpy._core.multiarray, ...): unpickled as it is, it fails with "No module named
# 'numpy._core.numeric'". numpy 2 answers numpy 1's names (numpy.core.X) with its numpy._core.X; this is the other
# way round, the numpy._core.X numpy 1 lacks answered with its numpy.core.X (the same functions and the same array
# layout under numpy 1's name). Inserted into _MODEL_PY by format(), which leaves what it inserts as it is.
_NUMPY_ALIAS = '''
def _numpy_2_names_on_numpy_1():
    import importlib
    import importlib.abc
    import importlib.util
    import sys

    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        return
    prefix = "numpy._core."

    class NumpyCoreAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        # Last on sys.meta_path: a numpy._core module numpy 1 has is its own, found before this.
        def find_spec(self, name, path=None, target=None):
            if not name.startswith(prefix):
                return None
            try:
                found = importlib.util.find_spec("numpy.core." + name[len(prefix):])
            except ImportError:
                return None
            return importlib.util.spec_from_loader(name, self) if found is not None else None

        own_specs = {}

        def create_module(self, spec):
            module = importlib.import_module("numpy.core." + spec.name[len(prefix):])
            self.own_specs[module.__name__] = module.__spec__
            return module

        def exec_module(self, module):
            # The import system set the alias' spec on numpy 1's module: it gets its own back.
            module.__spec__ = self.own_specs.get(module.__name__, module.__spec__)

    if not any(type(finder).__name__ == "NumpyCoreAlias" for finder in sys.meta_path):
        sys.meta_path.append(NumpyCoreAlias())
'''


_MODEL_PY = '''"""Generated by Modelport from an MLflow pyfunc model: loads ./mlflow_model with
mlflow.pyfunc.load_model (which unpickles it: this runs only in the deployment's sandbox) and calls predict."""

import json
import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils

SPEC = json.loads(r"""{spec}""")


def _as_input(request):
    arrays = {{}}
    for tensor in SPEC["inputs"]:
        value = pb_utils.get_input_tensor_by_name(request, tensor["name"]).as_numpy()
        if value.dtype == np.object_:
            value = np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(value)
        arrays[tensor["name"]] = value
    if SPEC["input_kind"] == "columns":
        import pandas as pd

        return pd.DataFrame({{name: np.asarray(value).reshape(-1) for name, value in arrays.items()}})
    if SPEC["named_inputs"]:
        return arrays
    return arrays[SPEC["inputs"][0]["name"]]


def _as_outputs(result):
    outputs = []
    if hasattr(result, "to_dict") and hasattr(result, "columns"):  # a DataFrame
        named = SPEC["named_outputs"]
        result = {{str(c): result[c].to_numpy() for c in result.columns}} if named else result.to_numpy()
    elif hasattr(result, "to_numpy"):  # a Series
        result = result.to_numpy()
    for tensor in SPEC["outputs"]:
        value = result[tensor["name"]] if SPEC["named_outputs"] else result
        value = np.asarray(value)
        if tensor["datatype"] == "BYTES":
            encode = np.vectorize(lambda v: v if isinstance(v, bytes) else str(v).encode("utf-8"), otypes=[object])
            value = encode(value)
        else:
            value = value.astype(pb_utils.triton_string_to_numpy("TYPE_" + tensor["datatype"]))
        if SPEC["output_kind"] == "columns":
            value = value.reshape(-1, 1)
        outputs.append(pb_utils.Tensor(tensor["name"], value))
    return outputs


{numpy_alias}

class TritonPythonModel:
    def initialize(self, args):
        _numpy_2_names_on_numpy_1()
        import mlflow.pyfunc

        self.model = mlflow.pyfunc.load_model(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlflow_model"))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                outputs = _as_outputs(self.model.predict(_as_input(request)))
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except Exception as exc:  # the model's error, as the caller's 400-type answer
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)[:2000])))
        return responses
'''


def _model_py(converted: Converted) -> str:
    spec = {"inputs": [t.to_json() for t in converted.signature.inputs],
            "outputs": [t.to_json() for t in converted.signature.outputs],
            "input_kind": converted.input_kind, "output_kind": converted.output_kind,
            "named_inputs": converted.named_inputs, "named_outputs": converted.named_outputs}
    # JSON escapes every quote, so the text can never close the raw string it is written into.
    return _MODEL_PY.format(spec=json.dumps(spec), numpy_alias=_NUMPY_ALIAS.strip())
