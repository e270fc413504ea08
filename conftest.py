"""Shared fixtures: a tmp artifact store per test, fast password hashing, and the three users of every access test:
alice (owner, team admin of "acme"), bob (member of "acme"), charlie (another team, "globex": must see nothing)."""

from __future__ import annotations

import subprocess
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.people import Person, make_person

# tests/markers.py: a test that starts Triton, a worker or a browser without its marker fails, naming the marker.
pytest_plugins = ["tests.markers", "pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """The run's var/ (portal/settings_test.py) exists before pytest-django creates the test database in it: settings
    create nothing at import (infra/var_dir.py)."""
    import gc

    from infra.var_dir import ensure_dirs

    ensure_dirs()
    # Collecting imports the project's modules and their libraries: the heap only grows, and the cyclic collector's
    # full passes over it find next to nothing. Off until collection is done (pytest_collection_finish).
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built lives until the run ends: frozen out of the collector's reach, so that each full pass
    during the tests looks only at what the tests made, and the young generation is collected a little less often
    (a full pass over the heap costs about 0.1 s). Measured with gc.callbacks on 238 API and page tests: 1.7 s of
    their 15 s of CPU went to the collector before, 0.9 s after. Only this test process is affected: the portal's
    processes, and those the tests start, keep Python's defaults."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    gc.enable()


@pytest.fixture(autouse=True, scope="session")
def _remove_the_runs_var_dir() -> Iterator[None]:
    yield
    import shutil

    from django.conf import settings

    if "/var/test/run-" in str(settings.VAR_DIR):
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _static_files_found_once() -> Iterator[None]:
    """Django's test client builds a handler, and so a WhiteNoise middleware, for every client: each one walked the
    static finders and stat'ed every file of the admin, DRF and static/ again (a sixth of the fast suite's CPU,
    measured with a sampling profiler). A portal process builds its middleware once and serves that table until it
    stops; the tests do the same per run: the first walk's table, per static configuration, serves every later
    middleware, which still looks files up and serves them through WhiteNoise's own code."""
    from django.conf import settings
    from whitenoise.middleware import WhiteNoiseMiddleware

    walk = WhiteNoiseMiddleware.add_files_from_finders
    found: dict[tuple[object, ...], dict[str, Any]] = {}

    def add_files_from_finders(self: WhiteNoiseMiddleware) -> None:
        # Everything the walk's result depends on: where files are found and how their responses are made.
        key = (self.static_prefix, self.max_age, self.allow_all_origins, self.charset, self.index_file,
               repr(settings.STATICFILES_DIRS), tuple(settings.STATICFILES_FINDERS), tuple(settings.INSTALLED_APPS))
        if key not in found:
            files, self.files = self.files, {}
            try:
                walk(self)
                found[key] = self.files
            finally:
                self.files = files
        self.files.update(found[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", add_files_from_finders)
        yield


@pytest.fixture(autouse=True)
def _fast_and_isolated(settings: Any, tmp_path: Path) -> Iterator[None]:
    from models_registry.storage import get_store

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    # Inspecting a python model starts a Triton for its trial call: not in the fast suite (the triton tests that
    # check it turn it on, tests/test_serving_errors_e2e.py).
    settings.PYTHON_TRIAL_CALL = False
    # A team's memory total defaults to this machine's: tests that deploy a few times must not depend on the size
    # of the machine they run on (deployments/tests/test_ceilings.py sets its own).
    settings.TEAM_MAX_MEMORY = "0"
    settings.DEPLOYMENT_MEMORY_OVERCOMMIT = 0.0  # and the machine-wide one (deployments/tests/test_machine_memory.py)
    get_store.cache_clear()
    yield
    get_store.cache_clear()


@pytest.fixture(autouse=True)
def _close_other_threads_connections() -> Iterator[None]:
    """Close the database connections that threads of this test opened and left (an event loop's executor threads:
    the gateway's lookups; asgiref's thread for sync_to_async). Django keeps a connection per thread and nobody
    closes a dead thread's: it lives until the cyclic garbage collector runs, which in the one long CI process is
    rare, so PostgreSQL saw a dozen sessions still on the test database when the run dropped it."""
    from django.db.backends.signals import connection_created

    opened: list[tuple[weakref.ref[Any], threading.Thread]] = []

    def note(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append((weakref.ref(connection), threading.current_thread()))

    connection_created.connect(note, weak=False, dispatch_uid="close_other_threads_connections")
    yield
    connection_created.disconnect(dispatch_uid="close_other_threads_connections")
    still_open = [(wrapper, thread) for wrapper, thread in ((ref(), thread) for ref, thread in opened)
                  if wrapper is not None and wrapper.connection is not None]
    for wrapper, thread in still_open:
        if not thread.is_alive():
            _close_for_a_dead_thread(wrapper)
    if any(thread.is_alive() for _, thread in still_open):
        # asgiref's one thread for sync_to_async(thread_sensitive=True) outside a request lives as long as the
        # process: it closes its own connection.
        from asgiref.sync import SyncToAsync
        from django.db import connections

        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


def _close_for_a_dead_thread(wrapper: Any) -> None:
    from django.db import DatabaseError

    # Its thread is gone: nothing else can use the connection, so closing it from this thread is safe.
    wrapper.inc_thread_sharing()
    try:
        wrapper.close()
    except DatabaseError:
        pass  # a connection the server already dropped: closed either way
    finally:
        wrapper.dec_thread_sharing()


@pytest.fixture
def alice(db: Any) -> Person:
    return make_person("alice", "acme", role="admin")


@pytest.fixture
def bob(alice: Person) -> Person:
    return make_person("bob", "acme")


@pytest.fixture
def charlie(db: Any) -> Person:
    return make_person("charlie", "globex", role="admin")


# --- For tests whose code runs in other threads or processes, which see only committed rows: `transactional_db` --


@pytest.fixture
def alice_tx(transactional_db: Any) -> Person:
    return make_person("alice", "acme", role="admin")


@pytest.fixture
def people(transactional_db: Any) -> dict[str, Person]:
    """alice, bob and charlie of the access tests, committed."""
    return {"alice": make_person("alice", "acme", role="admin"), "bob": make_person("bob", "acme"),
            "charlie": make_person("charlie", "globex", role="admin")}


@pytest.fixture
def gateway_app(settings: Any) -> Any:
    """A fresh Gateway (its caches and pool) in front of a Django stand-in that says where a request went."""
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5

    def build() -> Any:
        from gateway.app import Gateway

        async def django(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 299, "headers": []})
            await send({"type": "http.response.body", "body": b"django"})

        return Gateway(django)

    return build


@pytest.fixture
def celery_processes(transactional_db: Any, tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A real Celery worker and beat, on the test database and the configured broker (files under var/test, or
    Redis in CI). Yields a dict so that a test can kill and replace the worker."""
    from tests import processes

    processes.purge_broker()
    logs = tmp_path / "logs"
    logs.mkdir()
    running = {
        "worker": processes.start_worker(logs / "worker.log"),
        "beat": processes.start_beat(logs / "beat.log", tmp_path / "beat-schedule"),
    }
    try:
        yield running
    finally:
        for process in running.values():
            processes.kill(process)
        processes.stop_leftover_servers()
        for name in ("worker.log", "beat.log"):
            path = logs / name
            if path.exists():
                print(f"--- {name} (last lines) ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]))


@pytest.fixture
def portal_url(celery_processes: Any, tmp_path: Path) -> Iterator[str]:
    """The whole portal over real HTTP (uvicorn + Django + gateway), with the worker and beat of celery_processes."""
    import urllib.request

    from tests import processes

    port = processes.free_port()
    web = processes.start_web(tmp_path / "logs" / "web.log", port)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        processes.wait_for(up, 30, what="the web server")
        yield url
    finally:
        processes.kill(web)
        log = tmp_path / "logs" / "web.log"
        if log.exists():
            print("--- web.log (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@pytest.fixture
def eager_tasks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run Celery tasks in-process right away (the test's transaction never commits, so on_commit callbacks run
    at once). The real worker process is tested in tests/test_worker_e2e.py."""
    from django.db import transaction

    from portal.celery import app

    monkeypatch.setattr(transaction, "on_commit", lambda func, using=None, robust=False: func())
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def _fresh_sign_in_counters(settings: Any) -> Iterator[None]:
    """Each test starts with no failed sign-ins counted, in this process's memory rather than a Redis that CI's
    broker URL would otherwise share between tests (accounts/tests/test_signin.py tests Redis explicitly)."""
    from accounts import signin

    settings.REDIS_URL = ""
    signin.reset_counters()
    yield
    signin.reset_counters()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `frameworks("torch", ...)` needs those frameworks in the runtime env (default: both). Without
    them it is skipped with the command that adds them; in CI (`make test` installs them) it fails instead, so a
    broken install cannot pass as a skip."""
    marker = item.get_closest_marker("frameworks")
    if marker is None:
        return
    import os

    from django.conf import settings

    from modelport.core import frameworks
    from modelport.core.runtime_env import RuntimeEnvError, find_runtime_env

    wanted = list(marker.args) or [f.name for f in frameworks.FRAMEWORKS]
    try:
        installed = frameworks.detect(find_runtime_env(settings.MODELPORT_RUNTIME_ENV).site_packages)
    except RuntimeEnvError:
        installed = {}
    missing = [name for name in wanted if name not in installed]
    if missing:
        message = (f"the runtime env ({settings.MODELPORT_RUNTIME_ENV}) lacks {', '.join(missing)}: "
                   f"`make runtime-env RUNTIME_EXTRAS={','.join(missing)}`")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def digits(alice: Person) -> Any:
    """alice's model "digits" with one ready ONNX version (through the real upload and inspection): the version.
    The one fixture of that name for every app's tests (models_registry's API tests mean the model, and say so)."""
    from tests.support.versions import make_ready_version

    return make_ready_version(alice, "digits")


@pytest.fixture
def deployment(alice: Person, digits: Any) -> Any:
    """alice's "digits-prod" of `digits`, created as the API creates it (tests/support/deploying.py): pending, since
    the reconciler's on_commit never fires inside a test transaction."""
    from tests.support.deploying import deploy

    return deploy(alice)


@pytest.fixture
def pipeline_steps(alice: Person) -> Any:
    """alice's ready versions that a digits pipeline chains (models_registry/tests/pipeline_versions.py)."""
    from models_registry.tests.pipeline_versions import digits_steps

    return digits_steps(alice)


@pytest.fixture
def live() -> Iterator[Any]:
    """The portal's ASGI app on a real socket in this process (models_registry/tests/live_portal.py)."""
    from models_registry.tests.live_portal import live_portal

    with live_portal() as portal:
        yield portal


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real MLflow tracking server for the session's import tests (tests/support/mlflow_server.py)."""
    from tests.support.mlflow_server import running_mlflow_server

    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture
def mlflow_for_the_workers(monkeypatch: pytest.MonkeyPatch, settings: Any, mlflow_server: Any) -> str:
    """MLFLOW_TRACKING_URI for this process and, in the environment, for the worker celery_processes starts after
    it (requested before celery_processes, so the worker starts with it)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("IMPORT_MLFLOW_MODELS", "digits-*")
    settings.MLFLOW_TRACKING_URI = mlflow_server.url
    settings.IMPORT_MLFLOW_MODELS = "digits-*"
    return mlflow_server.url
