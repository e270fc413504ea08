"""Fetching MLflow model versions (issue 35) from a real tracking server (tests/support/mlflow_server.py): models
logged and registered with MLflow's own API, fetched with models_registry/sources/mlflow.py as the import worker
calls it, and what comes out checked by the inspection an upload goes through. The hostile cases: a link to /etc
planted in a local artifact tree, a pickle that would read the portal's secret when unpickled, '..' in a listing."""

from __future__ import annotations

import ast
import json
import pickle
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mlflow
import onnx
import pytest
import yaml

from modelport.core.formats.python import inspect_python_archive
from models_registry.sources.base import FetchContext, Fetched, SourceRefused
from models_registry.sources.mlflow import fetcher
from models_registry.tests.format_artifacts import torchscript_entries
from tests.support import mlflow_server as support
from tests.support.mlflow_server import MlflowServer


class Progress:
    def __init__(self, limit: int | None = None) -> None:
        self.calls: list[tuple[int, int | None]] = []
        self.limit = limit

    def __call__(self, done: int, total: int | None) -> None:
        if self.limit is not None and total is not None and total > self.limit:
            raise SourceRefused(f"{total} bytes do not fit the team's quota")
        self.calls.append((done, total))


@pytest.fixture
def tracking(settings: Any, mlflow_server: MlflowServer) -> MlflowServer:
    settings.MLFLOW_TRACKING_URI = mlflow_server.url
    return mlflow_server


def fetch(uri: str, workdir: Path, progress: Progress | None = None) -> tuple[Fetched, Progress]:
    progress = progress or Progress()
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = FetchContext(team_id=1, team_name="acme", workdir=workdir, max_bytes=10**9, progress=progress,
                       deadline=time.monotonic() + 60)
    return fetcher.fetch({"kind": "mlflow", "uri": uri}, ctx), progress


def test_an_onnx_version_comes_through_the_artifact_proxy_as_its_onnx_file(tracking: MlflowServer,
                                                                            tmp_path: Path) -> None:
    version = support.log_onnx(tracking, "onnx-double")
    fetched, progress = fetch(f"models:/onnx-double/{version}", tmp_path / "work")
    assert (fetched.filename, fetched.declared_format) == ("model.onnx", "onnx")
    assert onnx.load(str(fetched.path)).graph.node[0].op_type == "Mul"
    assert fetched.path.parent == tmp_path / "work"
    # The listed total first (the quota is reserved for it before any byte), then every byte counted.
    total = progress.calls[0][1]
    assert progress.calls[0] == (0, total) and progress.calls[-1] == (total, total)
    record = fetched.record
    assert record["registered_model"] == "onnx-double" and record["registry_version"] == version
    assert record["flavor"] == "onnx" and record["source"].startswith("models:/m-")  # an MLflow 3 logged model
    assert set(record["files"]) >= {"MLmodel", "model.onnx"} and record["run_id"]


def test_an_alias_is_resolved_to_its_version(tracking: MlflowServer, tmp_path: Path) -> None:
    support.log_onnx(tracking, "onnx-aliased")
    second = support.log_onnx(tracking, "onnx-aliased")
    support.set_alias(tracking, "onnx-aliased", "champion", second)
    fetched, _ = fetch("models:/onnx-aliased@champion", tmp_path / "work")
    assert fetched.record["registry_version"] == second


def test_an_alias_is_pinned_to_the_version_it_names_now_and_a_version_needs_no_pin(tracking: MlflowServer) -> None:
    first = support.log_onnx(tracking, "onnx-pinned")
    second = support.log_onnx(tracking, "onnx-pinned")
    support.set_alias(tracking, "onnx-pinned", "champion", first)
    alias = {"uri": "models:/onnx-pinned@champion"}
    assert fetcher.pinned(alias, 1) == {"uri": f"models:/onnx-pinned/{first}"}
    support.set_alias(tracking, "onnx-pinned", "champion", second)
    assert fetcher.pinned(alias, 1) == {"uri": f"models:/onnx-pinned/{second}"}
    assert fetcher.pinned({"uri": f"models:/onnx-pinned/{first}"}, 1) is None
    # On the worker: what the fetch found.
    assert fetcher.pinned_from(alias, {"registry_version": second}) == {"uri": f"models:/onnx-pinned/{second}"}
    assert fetcher.pinned_from({"uri": f"models:/onnx-pinned/{first}"}, {"registry_version": first}) is None
    with pytest.raises(SourceRefused, match="MLflow has no alias 'nope'"):
        fetcher.pinned({"uri": "models:/onnx-pinned@nope"}, 1)


@pytest.mark.django_db
def test_an_alias_imported_again_is_one_version_until_it_moves(tracking: MlflowServer, alice: Any,
                                                               settings: Any,
                                                               django_capture_on_commit_callbacks: Any) -> None:
    """A CI job that imports models:/fraud@champion at every run makes one version while the alias stays, and a new one
    once it moved; the registry version the alias named is the same import as the alias."""
    settings.IMPORT_MLFLOW_MODELS = "*"
    first = support.log_onnx(tracking, "onnx-ci")
    second = support.log_onnx(tracking, "onnx-ci")
    support.set_alias(tracking, "onnx-ci", "champion", first)

    def imported(uri: str) -> tuple[int, int]:
        with django_capture_on_commit_callbacks(execute=False):  # the worker's part is not run: keys from the API
            answer = alice.client().post("/api/v1/models/ci/versions/", {
                "source": {"kind": "mlflow", "uri": uri}, "create_model": True}, format="json")
        return answer.status_code, answer.json().get("number", answer.json())

    created = imported("models:/onnx-ci@champion")
    assert created[0] == 201
    assert imported("models:/onnx-ci@champion") == (200, created[1])
    assert imported(f"models:/onnx-ci/{first}") == (200, created[1])
    support.set_alias(tracking, "onnx-ci", "champion", second)
    moved = imported("models:/onnx-ci@champion")
    assert moved == (201, created[1] + 1)
    assert imported(f"models:/onnx-ci/{second}") == (200, moved[1])


@pytest.mark.django_db
def test_an_alias_moved_before_the_worker_fetched_keys_the_version_by_what_it_fetched(
        tracking: MlflowServer, alice: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    from models_registry import import_worker
    from models_registry.import_identity import identity_of
    from models_registry.models import ModelVersion

    settings.IMPORT_MLFLOW_MODELS = "*"
    first = support.log_onnx(tracking, "onnx-raced")
    second = support.log_onnx(tracking, "onnx-raced")
    support.set_alias(tracking, "onnx-raced", "champion", first)
    with django_capture_on_commit_callbacks(execute=False):
        answer = alice.client().post("/api/v1/models/raced/versions/", {
            "source": {"kind": "mlflow", "uri": "models:/onnx-raced@champion"}, "create_model": True}, format="json")
    version = ModelVersion.objects.get(model__name="raced", number=answer.json()["number"])
    assert version.source_identity == identity_of("mlflow", {"uri": f"models:/onnx-raced/{first}"})
    support.set_alias(tracking, "onnx-raced", "champion", second)  # moved before a worker took the import
    import_worker.run_import(version.pk)
    version.refresh_from_db()
    assert version.source is not None and version.source["fetched"]["registry_version"] == second
    assert version.source_identity == identity_of("mlflow", {"uri": f"models:/onnx-raced/{second}"})
    # So the version the alias first named is not this one.
    with django_capture_on_commit_callbacks(execute=False):
        again = alice.client().post("/api/v1/models/raced/versions/", {
            "source": {"kind": "mlflow", "uri": f"models:/onnx-raced/{first}"}}, format="json")
    assert again.status_code == 201 and again.json()["number"] == version.number + 1


@pytest.mark.django_db
def test_a_tracking_server_that_never_answers_makes_the_alias_a_version_of_its_own(
        alice: Any, settings: Any, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    """The API's lookup is bounded (PIN_TIMEOUT_SECONDS): a server that accepts and says nothing leaves the import
    unpinned, a new version whose worker will say what went wrong, never an answer that hangs."""
    import socket

    from models_registry.sources import mlflow as mlflow_source

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setattr(mlflow_source, "PIN_TIMEOUT_SECONDS", 0.3)
    settings.MLFLOW_TRACKING_URI = f"http://127.0.0.1:{silent.getsockname()[1]}"
    settings.IMPORT_MLFLOW_MODELS = "*"
    try:
        numbers = []
        for _ in range(2):
            with django_capture_on_commit_callbacks(execute=False):
                answer = alice.client().post("/api/v1/models/silent/versions/", {
                    "source": {"kind": "mlflow", "uri": "models:/fraud@champion"}, "create_model": True},
                    format="json")
            assert answer.status_code == 201, answer.json()
            numbers.append(answer.json()["number"])
        assert numbers == [numbers[0], numbers[0] + 1]
    finally:
        silent.close()


def test_a_missing_version_or_alias_is_refused_naming_it(tracking: MlflowServer, tmp_path: Path) -> None:
    support.log_onnx(tracking, "onnx-few")
    with pytest.raises(SourceRefused, match="MLflow has no version 99 of 'onnx-few'"):
        fetch("models:/onnx-few/99", tmp_path / "a")
    with pytest.raises(SourceRefused, match="MLflow has no alias 'nope'"):
        fetch("models:/onnx-few@nope", tmp_path / "b")


def test_a_model_larger_than_the_quota_is_refused_before_any_byte(tracking: MlflowServer, tmp_path: Path) -> None:
    version = support.log_onnx(tracking, "onnx-big")
    with pytest.raises(SourceRefused, match="quota"):
        fetch(f"models:/onnx-big/{version}", tmp_path / "work", Progress(limit=100))
    assert not [p for p in (tmp_path / "work").rglob("*") if p.is_file()]


def test_a_pyfunc_becomes_a_python_model_that_loads_it_in_triton(tracking: MlflowServer, tmp_path: Path) -> None:
    version = support.log_pyfunc(tracking, "pyfunc-triple", support.Tripler())
    fetched, _ = fetch(f"models:/pyfunc-triple/{version}", tmp_path / "work")
    assert (fetched.filename, fetched.declared_format) == ("model.tar", "python")
    assert fetched.signature is not None and fetched.signature.to_json() == {
        "inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 3]}],
        "outputs": [{"name": "output", "datatype": "FP32", "dims": [-1, 3]}]}
    info = inspect_python_archive(fetched.path)  # what an upload's inspection reads
    assert {"model.py", "requirements.txt", "mlflow_model/MLmodel", "mlflow_model/python_model.pkl"} <= set(info.files)
    # mlflow itself as its serving part, the model's own pins kept.
    assert info.requirements[0] == f"mlflow-skinny>={mlflow.__version__}" and "pandas" in info.requirements
    assert any(line.startswith("cloudpickle==") for line in info.requirements)
    with tarfile.open(fetched.path) as tar:
        model_py = tar.extractfile("model.py").read().decode()  # type: ignore[union-attr]
    assert "mlflow.pyfunc.load_model" in model_py and fetched.record["flavor"] == "python_function"


def test_a_pickle_is_never_unpickled_by_the_fetch_or_the_inspection(tracking: MlflowServer, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    version = support.log_pyfunc(tracking, "pyfunc-snoop", support.HostilePickle(marker, tmp_path / "secret_key"))
    marker.unlink(missing_ok=True)  # logging may load the model in this process: what follows must not
    fetched, _ = fetch(f"models:/pyfunc-snoop/{version}", tmp_path / "work")
    inspect_python_archive(fetched.path)
    with tarfile.open(fetched.path) as tar:
        pickled = tar.extractfile("mlflow_model/python_model.pkl").read()  # type: ignore[union-attr]
    assert b"_snoop" in pickled  # the hostile pickle came through intact, unopened
    assert not marker.exists()


def test_a_link_to_etc_in_a_local_artifact_root_is_refused_naming_it(tracking: MlflowServer,
                                                                    tmp_path: Path) -> None:
    experiment = support.local_experiment(tracking, "local-links")
    version = support.log_onnx(tracking, "onnx-linked", experiment_id=experiment)
    folder = support.artifact_folder(tracking, "onnx-linked", version)
    assert folder.is_dir()  # the worker reads this folder itself
    (folder / "config").symlink_to("/etc")
    with pytest.raises(SourceRefused, match=r"symbolic link, 'config' -> '/etc'"):
        fetch(f"models:/onnx-linked/{version}", tmp_path / "work")
    assert not [p for p in (tmp_path / "work").rglob("*") if p.is_file()]


def test_a_local_artifact_root_is_fetched_without_the_proxy(tracking: MlflowServer, tmp_path: Path) -> None:
    experiment = support.local_experiment(tracking, "local-plain")
    version = support.log_pyfunc(tracking, "pyfunc-local", support.Tripler(), experiment_id=experiment)
    fetched, progress = fetch(f"models:/pyfunc-local/{version}", tmp_path / "work")
    assert fetched.declared_format == "python" and progress.calls[0][0] == 0


def _run_artifacts(tracking: MlflowServer, name: str, files: dict[str, bytes], tmp_path: Path,
                   experiment_id: str | None = None) -> str:
    """A version registered from a run's artifact path (the pre-MLflow-3 way), with files laid out by hand."""
    return support.register_artifacts(tracking, name, files, tmp_path / "logged", experiment_id)


PYTORCH_MLMODEL = yaml.safe_dump({
    "flavors": {"pytorch": {"model_data": "data", "pytorch_version": "2.13.0"},
                "python_function": {"loader_module": "mlflow.pytorch", "data": "data"}},
    "signature": {"inputs": '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 3]}}]',
                  "outputs": '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 3]}}]'},
}).encode()


def test_a_torchscript_pytorch_model_comes_as_its_pt_file(tracking: MlflowServer, tmp_path: Path) -> None:
    version = _run_artifacts(tracking, "torch-scripted", {
        "MLmodel": PYTORCH_MLMODEL, "data/model.pth": support.zip_of(torchscript_entries())}, tmp_path)
    fetched, _ = fetch(f"models:/torch-scripted/{version}", tmp_path / "work")
    assert (fetched.filename, fetched.declared_format) == ("model.pt", "torchscript")
    assert fetched.signature is not None and fetched.signature.inputs[0].dims == (-1, 3)
    # Registered from the run's artifact path: shown as the run's, never as where the operator stores it.
    assert fetched.record["source"] == f"runs:/{fetched.record['run_id']}/model"


@pytest.mark.parametrize("layout", ["pickle", "pt2"])
def test_a_pytorch_model_that_is_not_torchscript_is_refused_and_never_unpickled(
    tracking: MlflowServer, tmp_path: Path, layout: str,
) -> None:
    """mlflow.pytorch.log_model(nn.Module) pickles the module (torch.save), and its pt2 export pickles weights and
    sample inputs: either is refused from its file names and zip directory, with the message saying what to log, and
    its pickle (one that leaves a mark when unpickled) is never opened; nor is the python_function flavor beside it
    taken instead, which would load the same pickle."""
    marker = tmp_path / "unpickled"
    pickle.loads(support.marker_pickle(tmp_path / "control"))  # the attempt is real: unpickled, it leaves its mark
    assert (tmp_path / "control").exists()
    files = support.pickled_pytorch_files(marker) if layout == "pickle" else support.pt2_pytorch_files(marker)
    version = _run_artifacts(tracking, f"torch-{layout}", files, tmp_path)
    with pytest.raises(SourceRefused) as refused:
        fetch(f"models:/torch-{layout}/{version}", tmp_path / "work")
    assert str(refused.value) == (
        "The MLflow pytorch model is not TorchScript (it is a pickled torch.save() or a pt2 export, which the portal "
        "does not unpickle): log a scripted model, mlflow.pytorch.log_model(torch.jit.script(model), ...).")
    assert not marker.exists()


def test_a_keras_tensorflow_model_is_refused_and_a_saved_model_is_packed(tracking: MlflowServer,
                                                                         tmp_path: Path) -> None:
    keras = _run_artifacts(tracking, "tf-keras", {"MLmodel": yaml.safe_dump({"flavors": {"tensorflow": {
        "model_type": "keras", "data": "data"}}}).encode(), "data/model.keras": b"x"}, tmp_path / "k")
    with pytest.raises(SourceRefused, match="not a SavedModel"):
        fetch(f"models:/tf-keras/{keras}", tmp_path / "w1")
    module = _run_artifacts(tracking, "tf-module", {"MLmodel": yaml.safe_dump({"flavors": {"tensorflow": {
        "model_type": "tf2-module", "saved_model_dir": "tf2model"}}}).encode(),
        "tf2model/saved_model.pb": b"pb", "tf2model/variables/variables.index": b"i"}, tmp_path / "m")
    fetched, _ = fetch(f"models:/tf-module/{module}", tmp_path / "w2")
    assert fetched.declared_format == "tensorflow_savedmodel"
    with tarfile.open(fetched.path) as tar:
        assert sorted(tar.getnames()) == ["saved_model.pb", "variables", "variables/variables.index"]


def test_a_flavor_the_portal_cannot_serve_is_refused_naming_the_ones_it_can(tracking: MlflowServer,
                                                                           tmp_path: Path) -> None:
    version = _run_artifacts(tracking, "spark-only", {"MLmodel": yaml.safe_dump(
        {"flavors": {"spark": {"pyspark_version": "3"}}}).encode()}, tmp_path)
    with pytest.raises(SourceRefused, match="onnx, pytorch .TorchScript., tensorflow .SavedModel. or python_function"):
        fetch(f"models:/spark-only/{version}", tmp_path / "work")


class _HostileRegistry(BaseHTTPRequestHandler):
    """Answers as a tracking server whose artifact listing names '../../etc/passwd'-like entries."""

    listing: list[dict[str, Any]] = []
    requested: list[str] = []
    download_uri = "mlflow-artifacts:/0/models/m-1/artifacts"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.requested.append(self.path)
        if self.path.startswith("/api/2.0/mlflow/model-versions/get-download-uri"):
            body: dict[str, Any] = {"artifact_uri": self.download_uri}
        elif self.path.startswith("/api/2.0/mlflow/model-versions/get"):
            body = {"model_version": {"name": "evil", "version": "1", "status": "READY", "run_id": "r",
                                      "source": "models:/m-1"}}
        elif self.path.startswith("/api/2.0/mlflow-artifacts/artifacts?"):
            body = {"files": self.listing}
        else:
            body = {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}
        data = json.dumps(body).encode()
        self.send_response(200 if "error_code" not in body else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile_registry(settings: Any) -> Iterator[type[_HostileRegistry]]:
    """A stand-in for a compromised tracking server: a real MLflow server refuses to list '..' itself, so the
    hostile listing can only come from a server that is not MLflow's."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HostileRegistry)
    # A short poll: shutdown() waits for one, 0.5 s by default, in every test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    settings.MLFLOW_TRACKING_URI = f"http://127.0.0.1:{server.server_address[1]}"
    _HostileRegistry.requested = []
    _HostileRegistry.download_uri = "mlflow-artifacts:/0/models/m-1/artifacts"
    try:
        yield _HostileRegistry
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("name", ["..", "../../etc/passwd", "/etc/passwd", "a/../../b"])
def test_a_listing_that_climbs_out_is_refused_before_any_download(hostile_registry: type[_HostileRegistry],
                                                                  tmp_path: Path, name: str) -> None:
    hostile_registry.listing = [{"path": "MLmodel", "is_dir": False, "file_size": 10},
                                {"path": name, "is_dir": False, "file_size": 10}]
    with pytest.raises(SourceRefused, match="not a plain file or folder name"):
        fetch("models:/evil/1", tmp_path / "work")
    assert not any("/mlflow-artifacts/artifacts/" in path for path in hostile_registry.requested)
    assert not [p for p in (tmp_path / "work").rglob("*") if p.is_file()]


def test_the_portal_never_imports_mlflow() -> None:
    """mlflow is a test tool here (requirements-dev): the fetcher speaks REST, so the portal runs without it (the
    generated model.py imports it, inside Triton: a string here, not an import)."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "sources" / "mlflow.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name.split(".")[0] in ("mlflow", "pickle", "cloudpickle")]


def test_the_record_never_shows_the_operators_artifact_root(tracking: MlflowServer, tmp_path: Path) -> None:
    """A version registered from a run in a local artifact root: its MLflow source is a file: path of the operator's
    (file:///srv/mlflow/...); the version's JSON, which the team reads, shows the run's runs:/ URI instead."""
    experiment = support.local_experiment(tracking, "local-root-hidden")
    version = _run_artifacts(tracking, "onnx-root-hidden", {
        "MLmodel": yaml.safe_dump({"flavors": {"onnx": {"data": "model.onnx"}}}).encode(),
        "model.onnx": b"onnx bytes"}, tmp_path, experiment_id=experiment)
    fetched, _ = fetch(f"models:/onnx-root-hidden/{version}", tmp_path / "work")
    shown = json.dumps(fetched.record)
    assert str(tracking.root) not in shown and "file:" not in shown
    assert fetched.record["source"] == f"runs:/{fetched.record['run_id']}/model"


@pytest.mark.parametrize(("source", "shown"), [
    ("models:/m-0123abc", "models:/m-0123abc"),
    ("runs:/abc123/model", "runs:/abc123/model"),
    ("file:///srv/operator-root/1/abc123/artifacts/model", "runs:/abc123/model"),
    ("s3://operator-bucket/mlartifacts/1/abc123/artifacts/sub/model", "runs:/abc123/sub/model"),
    ("mlflow-artifacts://mlflow.internal:5000/1/abc123/artifacts/model", "runs:/abc123/model"),
    ("s3://operator-bucket/elsewhere/model", ""),
    ("/srv/operator-root/model", ""),
    ("dbfs:/operator/abc123/artifacts/../../x", ""),
])
def test_an_mlflow_source_is_shown_as_a_models_or_runs_uri_or_not_at_all(source: str, shown: str) -> None:
    from models_registry.sources.mlflow import shown_source

    assert shown_source(source, "abc123") == shown


@pytest.mark.parametrize("location", [
    "s3://operator-secret-bucket/mlartifacts/1/model",
    "file:///srv/operator-secret-root/1/model",
    "file://operator-secret-host/srv/1/model",
    "mlflow-artifacts://operator-secret-host:5000/0/models/m-1/artifacts",
])
def test_errors_never_name_the_operators_artifact_location(hostile_registry: type[_HostileRegistry],
                                                           tmp_path: Path, location: str) -> None:
    """The version's error is the team's to read: where the operator keeps artifacts is not in it (the worker's
    log has it)."""
    hostile_registry.download_uri = location
    hostile_registry.listing = []  # through the proxy: a folder without MLmodel
    with pytest.raises(SourceRefused) as refused:
        fetch("models:/evil/1", tmp_path / "work")
    assert "operator-secret" not in str(refused.value), refused.value
