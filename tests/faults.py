"""Throwaway infrastructure for the fault tests (tests/test_faults.py): a private Redis server the test may restart,
a TCP path to PostgreSQL the test may cut, a database of the test's own, and the portal's own processes (web,
worker, beat) started on them the way bin/run-portal starts them.

Nothing here stops or restarts the machine's shared PostgreSQL or Redis: other test runs use them at the same time.
The database is a real PostgreSQL database (created from a migrated template, dropped afterwards); "PostgreSQL down"
is the proxy refusing connections and dropping the open ones, which is what a stopped server looks like to a client.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import requests

from tests.markers import require
from tests.processes import ROOT, free_port, wait_for

# The server the fault tests make their databases on (CI and this machine: the local PostgreSQL).
POSTGRES_URL = os.environ.get("FAULTS_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
_PG = re.match(r"postgres(?:ql)?://(?P<user>[^@:/]+)(?::(?P<password>[^@]*))?@(?P<host>[^:/]+):(?P<port>\d+)/",
               POSTGRES_URL)
assert _PG is not None, f"FAULTS_POSTGRES_URL must be postgres://user[:password]@host:port/db, got {POSTGRES_URL!r}"
PG_HOST, PG_PORT, PG_USER, PG_PASSWORD = _PG["host"], int(_PG["port"]), _PG["user"], _PG["password"] or ""


def _admin_connection() -> Any:
    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, password=PG_PASSWORD, dbname="postgres",
                            connect_timeout=5)
    conn.autocommit = True
    return conn


def drop_database(name: str) -> None:
    with contextlib.closing(_admin_connection()) as conn, conn.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_database(name: str, template: str | None = None) -> None:
    drop_database(name)
    with contextlib.closing(_admin_connection()) as conn, conn.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))


def database_url(name: str, port: int = PG_PORT) -> str:
    password = f":{PG_PASSWORD}" if PG_PASSWORD else ""
    return f"postgres://{PG_USER}{password}@{PG_HOST}:{port}/{name}"


class PrivateRedis:
    """A redis-server of the test's own, without persistence: a restart loses every queued and unacknowledged task,
    the harshest case (a Redis with AOF or RDB keeps some of them)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/8"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - kept open for the process' lifetime
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self.answers, 10, what="the private redis-server")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


class CuttableProxy:
    """127.0.0.1:port -> target, until cut(): then open connections are dropped and new ones refused, until
    restore() listens on the same port again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self.lock:
            connections, self.connections = self.connections, set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.connections.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()
            with self.lock:
                self.connections.difference_update((a, b))


@dataclass
class Portal:
    """The portal's processes on a database and broker of the test's own, and a client for alice of team acme."""

    workdir: Path
    env: dict[str, str]
    token: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""

    @property
    def var_dir(self) -> Path:
        return Path(self.env["MODELPORT_VAR_DIR"])

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        require("worker", f"starts the portal's {name} process")
        log = open(self.log(name), "ab")  # noqa: SIM115 - kept open for the process' lifetime
        process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def start_worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        # As bin/run-portal starts it: the pool is the configured default (threads with the filesystem broker).
        return self._start(name, [sys.executable, "-m", "celery", "-A", "portal", "worker", "--loglevel=INFO",
                                  "--concurrency=2", "--without-gossip", "--without-mingle"])

    def start_beat(self) -> subprocess.Popen[bytes]:
        return self._start("beat", [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel=INFO",
                                    "--schedule", str(self.workdir / "beat-schedule")])

    def start_web(self) -> None:
        port = free_port()
        from portal.web_server import UVICORN_HTTP

        self._start("web", [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--http", UVICORN_HTTP,
                            "--host", "127.0.0.1", "--port", str(port), "--no-access-log"])
        self.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self._answers("/healthz"), 30, what="the web server")

    def start_all(self) -> None:
        self.start_worker()
        self.start_beat()
        self.start_web()

    def _answers(self, path: str) -> bool:
        try:
            return requests.get(self.url + path, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def api(self) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.token}"
        return session

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.api().get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.api().post(self.url + path, timeout=30, **kwargs)

    def browser(self) -> requests.Session:
        """A signed-in browser session (alice's password is set in the template database)."""
        session = requests.Session()
        session.get(self.url + "/login/", timeout=30)
        response = session.post(self.url + "/login/", timeout=30, allow_redirects=False,
                                data={"username": "alice", "password": "faults-password",
                                      "csrfmiddlewaretoken": session.cookies["csrftoken"]},
                                headers={"Referer": self.url + "/login/"})
        assert response.status_code == 302, response.text[:500]
        return session

    def deployment(self, name: str) -> dict[str, Any]:
        response = self.get(f"/api/v1/deployments/{name}/")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def wait_status(self, name: str, wanted: str, timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            body = self.deployment(name)
            if body["status"] == "failed" and wanted != "failed":
                raise AssertionError(f"{name} failed: {body['status_message']}")
            return body if body["status"] == wanted else None

        return wait_for(reached, timeout, interval=0.5, what=f"{name} to be {wanted}")  # type: ignore[no-any-return]

    def events(self, name: str) -> list[str]:
        return [event["message"] for event in self.get(f"/api/v1/deployments/{name}/events/").json()]

    def stop(self) -> None:
        for name, process in list(self.processes.items()):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            del self.processes[name]
        stop_tritons_under(self.var_dir)

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log(name)
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def stop_tritons_under(var_dir: Path) -> None:
    """Every tritonserver whose repository lies under `var_dir` (the test's own deployments)."""
    from deployments.runtimes.local.triton import stop_server

    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"tritonserver" in cmdline and str(var_dir).encode() in cmdline:
                stop_server(int(proc.name), grace_seconds=2)


def portal_env(workdir: Path, database: str, broker: str, db_port: int = PG_PORT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DATABASE_URL", "CELERY_", "MODELPORT_", "ARTIFACT_ROOT", "DEBUG", "PYTEST"))}
    env.update({
        # The test settings: fast reconcile ticks (1 s) and drains, as the other end-to-end tests.
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "MODELPORT_VAR_DIR": str(workdir / "var"),
        "ARTIFACT_ROOT": str(workdir / "artifacts"),
        "DATABASE_URL": database_url(database, db_port),
        "CELERY_BROKER_URL": broker,
        "MODELPORT_RUNTIME_ENV": os.environ.get("MODELPORT_RUNTIME_ENV", str(ROOT / "var" / "runtime-env")),
    })
    return env


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass(frozen=True)
class Template:
    name: str
    token: str


def make_template(workdir: Path, name: str) -> Template:
    """A migrated database with alice (password 'faults-password', admin of team acme) and an API token of hers."""
    create_database(name)
    env = portal_env(workdir, name, "memory://")
    manage(env, "migrate", "--noinput")
    token = manage(env, "create_api_token", "--user", "alice", "--team", "acme", "--create", "--admin").strip()
    manage(env, "shell", "-c", "from django.contrib.auth import get_user_model; "
                               "u = get_user_model().objects.get(username='alice'); "
                               "u.set_password('faults-password'); u.save()")
    return Template(name=name, token=token)


@contextlib.contextmanager
def portal_on(workdir: Path, template: Template, database: str, broker: str,
              db_port: int = PG_PORT) -> Iterator[Portal]:
    create_database(database, template=template.name)
    portal = Portal(workdir=workdir, env=portal_env(workdir, database, broker, db_port), token=template.token)
    try:
        yield portal
    finally:
        portal.stop()
        for name in ("web", "worker", "worker-2", "beat"):
            if portal.log(name).exists():
                print(f"--- {name}.log (last lines) ---\n{portal.tail(name)}")
        drop_database(database)


def wait_exit(process: subprocess.Popen[bytes], timeout: float) -> float | None:
    """Seconds until `process` exited, or None if it still runs after `timeout`."""
    started = time.monotonic()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - started
