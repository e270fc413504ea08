"""Helpers of the sandbox tests (tests/test_sandbox_*.py): upload a python model the way a team member does,
deploy it on the real local runtime (reconciled in the test process through eager tasks), ask it, and look at
processes from the host's side."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployments.models import Deployment, TritonServer
from deployments.runtimes.local.triton import is_alive, server_pids
from models_registry.models import Model, ModelVersion
from tests.support.people import Person

MODELS = Path(__file__).resolve().parent / "sandbox_models"

VECTOR = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
          "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}]}


def model_source(name: str) -> bytes:
    return (MODELS / f"{name}.py").read_bytes()


def python_version(person: Person, name: str, files: dict[str, bytes], signature: dict[str, Any]) -> ModelVersion:
    """A ready python model version through the real upload path (the inspection runs in-process)."""
    from modelport.core.signature import parse_signature
    from models_registry import actions
    from models_registry.inspection import inspect_here

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for filename, data in files.items():
            archive.writestr(filename, data)
    buffer.seek(0)
    model = (Model.objects.filter(team=person.team, name=name).first()
             or Model.objects.create(team=person.team, name=name))
    version = actions.create_version_from_file(model, person.user, buffer, "model.zip", declared_format="python",
                                               signature=parse_signature(signature))
    version = inspect_here(version.pk)
    assert version.status == "ready", version.error
    return version


def deploy(person: Person, name: str, models: list[dict[str, Any]], **fields: Any) -> Deployment:
    """POST the deployment; with eager tasks the reconciler has run (Triton started or failed) when this returns."""
    response = person.client().post("/api/v1/deployments/", {"name": name, "models": models, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.get(team=person.team, name=name)


def ready(deployment: Deployment) -> TritonServer:
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.READY, deployment.status_message
    return TritonServer.objects.get(revision=deployment.serving_revision, state=TritonServer.State.READY)


def infer(server: TritonServer, model: str, inputs: list[dict[str, Any]], timeout: float = 120) -> dict[str, Any]:
    body = json.dumps({"inputs": inputs}).encode()
    request = urllib.request.Request(f"{server.url}/v2/models/{model}/infer", body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def output(answer: dict[str, Any], name: str) -> Any:
    return next(o for o in answer["outputs"] if o["name"] == name)["data"]


def processes_named(prefix: str) -> list[int]:
    """Processes on this machine (any PID namespace) whose argv[0] starts with `prefix`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if argv0.startswith(prefix) and state != "Z":
                found.append(int(entry.name))
    return found


def kill_named(prefix: str) -> None:
    for pid in processes_named(prefix):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def shm_regions(server: TritonServer) -> list[str]:
    """The python backend's shared-memory files the server's processes have mapped (names under /dev/shm)."""
    names: set[str] = set()
    for pid in server_pids(server.pid):
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
                if path.startswith("/dev/shm/"):
                    names.add(path.removeprefix("/dev/shm/").removesuffix(" (deleted)"))
        except OSError:
            continue
    return sorted(names)


def outer_uids(server: TritonServer) -> set[int]:
    """The real uids (as this machine sees them) of every process of the server."""
    uids = set()
    for pid in server_pids(server.pid):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                uids.add(int(line.split()[1]))
    return uids


def admin_change(client: Any, deployment: Deployment, **changes: Any) -> Any:
    """Save the deployment's admin change form as an operator would: what it shows, with `changes` made."""
    page = client.get(f"/admin/deployments/deployment/{deployment.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {name: form.initial.get(name) for name in form.fields}
    data.update(changes)
    data = {name: ("on" if value is True else value) for name, value in data.items()
            if value is not None and value is not False}
    return client.post(f"/admin/deployments/deployment/{deployment.pk}/change/", data)


def stop_everything() -> None:
    """After a test: no Triton of this test run's var/ left, nor its sandboxes' cgroups."""
    from tests.processes import stop_leftover_servers

    stop_leftover_servers()


def gone(server: TritonServer) -> bool:
    return not is_alive(server.pid) and server_pids(server.pid) == []


@dataclass
class Canaries:
    """Listeners standing in for the portal's services; `hits` records whatever reached them."""

    tcp_port: int = 0
    tcp6_port: int = 0
    udp_port: int = 0
    abstract_name: str = ""
    hits: list[str] = field(default_factory=list)


@pytest.fixture(name="canaries")
def canaries_fixture() -> Iterator[Canaries]:
    stop = threading.Event()
    found = Canaries(abstract_name=f"modelport-canary-{os.getpid()}-{id(stop)}")
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    tcp6.bind(("::1", 0))
    tcp6.listen()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + found.abstract_name)
    abstract.listen()
    found.tcp_port, found.tcp6_port, found.udp_port = tcp.getsockname()[1], tcp6.getsockname()[1], udp.getsockname()[1]

    def accept(listener: socket.socket, label: str) -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            found.hits.append(label)
            connection.close()

    def receive() -> None:
        udp.settimeout(0.2)
        while not stop.is_set():
            try:
                data, _ = udp.recvfrom(4096)
            except (TimeoutError, OSError):
                continue
            found.hits.append(f"udp: {data[:40]!r}")

    threads = [threading.Thread(target=accept, args=(tcp, "tcp"), daemon=True),
               threading.Thread(target=accept, args=(tcp6, "tcp6"), daemon=True),
               threading.Thread(target=accept, args=(abstract, "abstract"), daemon=True),
               threading.Thread(target=receive, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        yield found
    finally:
        stop.set()
        for thread in threads:
            thread.join(2)
        for s in (tcp, tcp6, udp, abstract):
            s.close()
