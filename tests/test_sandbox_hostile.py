"""A team member's python model tries every way out of its sandbox, on the real local runtime (the reconciler, the
launcher, a real tritonserver and its python-backend stub); a legitimate model and resource limits work.

The hostile model (sandbox_models/hostile_model.py) reports each attempt through its output tensor. The same model
run unsandboxed (SANDBOX_ENABLED=false) reaches what it goes after, which proves that each attempt is real: a
denial seen in the sandboxed run is the sandbox's doing, not a broken attempt.

The deployments are reconciled in the test process (eager tasks), so the planted secret and the process whose
/proc/<pid>/environ the model goes after are this process's.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from audit.models import AuditEntry
from deployments import reconcile
from deployments.models import Deployment, TritonServer
from deployments.runtimes.local import confined as local_confined
from deployments.runtimes.local import files as local_files
from infra import sandbox_settings
from tests.artifacts import tiny_onnx
from tests.sandbox_helpers import (
    VECTOR,
    Canaries,
    admin_change,
    canaries_fixture,  # noqa: F401 - the `canaries` fixture
    deploy,
    gone,
    infer,
    kill_named,
    model_source,
    outer_uids,
    output,
    processes_named,
    python_version,
    ready,
    shm_regions,
)
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.django_db, pytest.mark.usefixtures("no_triton_left")]

PLANTED = "MODELPORT_PLANTED_SECRET"
REPORT = {"inputs": [{"name": "probe", "datatype": "BYTES", "dims": [1]}],
          "outputs": [{"name": "report", "datatype": "BYTES", "dims": [1]}]}

# Attempts that the unsandboxed control run must win: each is a working attack where nothing stops it.
WORK_UNSANDBOXED = {
    "read_secret_key", "read_sqlite_database", "list_artifacts", "list_deployments", "read_other_repository",
    "read_portal_source", "write_var", "write_own_repository", "read_etc_shadow", "list_root_home", "host_passwd",
    "host_devices", "cgroup_filesystem", "read_test_process_environ", "read_server_environ", "list_processes",
    "signal_test_process", "other_deployments_shm", "tcp_portal", "tcp_portal_ipv6", "tcp_redis", "tcp_postgresql",
    "unix_postgresql", "tcp_other_triton", "unix_abstract_socket", "udp_portal", "packet_socket", "netlink_sock_diag",
    "server_admin_key", "server_tcp_table", "server_tcp6_table", "server_unix_table", "server_mountinfo",
    "server_mounts", "own_mountinfo", "proc_net_tcp",
}


@pytest.fixture
def sandbox_required() -> Iterator[None]:
    """The sandbox must work on the machine running these tests: a CI runner that cannot build it fails here (and
    says why) rather than passing the escape tests vacuously."""
    sandbox_settings.sandbox_capabilities.cache_clear()
    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available:
        pytest.fail(f"the sandbox is not available here: {caps.reason}")
    yield
    sandbox_settings.sandbox_capabilities.cache_clear()


@pytest.fixture
def unsandboxed(settings: Any) -> Iterator[None]:
    settings.SANDBOX_ENABLED = False
    sandbox_settings.sandbox_capabilities.cache_clear()
    yield
    sandbox_settings.sandbox_capabilities.cache_clear()


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> str:
    value = secrets.token_hex(16)
    monkeypatch.setenv(PLANTED, value)
    return value


def victim(charlie: Person) -> TritonServer:
    """Another team's running deployment: the hostile model goes after its repository, port and shared memory."""
    from tests.support.versions import make_ready_version

    make_ready_version(charlie, name="victim", data=tiny_onnx())
    return ready(deploy(charlie, "victim", [{"model": "victim"}]))


def targets(token: str, other: TritonServer, canaries: Canaries, *, control: bool) -> dict[str, Any]:
    db = settings.DATABASES["default"]
    database = Path(str(db["NAME"]))
    if not str(db["ENGINE"]).endswith("sqlite3"):
        # On PostgreSQL (CI) there is no database file: a stand-in in var/, where `make run` keeps SQLite's.
        database = Path(settings.VAR_DIR) / "modelport.sqlite3"
        if not database.exists():
            database.write_bytes(b"SQLite format 3\0")
    return {
        "token": token,
        "control": control,
        "planted_name": PLANTED,
        "secret_key": str(Path(settings.VAR_DIR) / "secret_key"),
        "sqlite": str(database),
        "artifacts": str(settings.ARTIFACT_ROOT),
        "deployments_dir": str(settings.DEPLOYMENTS_DIR),
        "var_dir": str(settings.VAR_DIR),
        "source_file": str(Path(settings.BASE_DIR) / "portal" / "settings.py"),
        "other_repository": str(local_files.repository_dir(other.revision)),
        "other_model": "victim",
        "other_shm": shm_regions(other),
        "test_pid": os.getpid(),
        "abstract_name": canaries.abstract_name,
        "ports": {"portal": canaries.tcp_port, "portal_ipv6": canaries.tcp6_port, "udp": canaries.udp_port,
                  "other_triton": other.http_port},
    }


def run_hostile(alice: Person, charlie: Person, canaries: Canaries, *,
                control: bool) -> tuple[dict[str, Any], TritonServer, str]:
    token = secrets.token_hex(6)
    other = victim(charlie)
    # The key file a development portal keeps in var/ (`manage.py ensure_dirs` writes it with mode 0600; the tests
    # take their key from the environment, so none is there unless we put one): the model must not read it.
    key_file = Path(settings.VAR_DIR) / "secret_key"
    if not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(64))
    files = {"model.py": model_source("hostile_model"),
             "targets.json": json.dumps(targets(token, other, canaries, control=control)).encode()}
    python_version(alice, "hostile", files, REPORT)
    server = ready(deploy(alice, "hostile", [{"model": "hostile"}]))
    answer = infer(server, "hostile", [{"name": "probe", "datatype": "BYTES", "shape": [1], "data": ["go"]}])
    report: dict[str, Any] = json.loads(output(answer, "report")[0])
    print(json.dumps(report, indent=1))  # the evidence, in the test's output
    return report, server, token


def harmless(name: str, detail: str, server: TritonServer, token: str) -> bool:
    """What a model reports as done but reached nothing outside its sandbox. The sandbox shows its own repository at
    its real path, so when var/ lies under /tmp (a checkout in /tmp, as CI may have), the path to var/ exists inside
    the model's private /tmp: a listing there shows only the mount point of its own deployment, and a file written
    there lands in its own scratch directory, never in the real var/ (which the test checks on the host)."""
    if name == "list_deployments":
        return detail == repr([str(server.deployment_id)])
    if name == "write_var":
        return not (Path(settings.VAR_DIR) / f"pwned-{token}").exists()
    return False


def test_a_hostile_python_model_is_denied_every_escape(
    alice: Person, charlie: Person, eager_tasks: Any, canaries: Canaries, planted: str, sandbox_required: None,
) -> None:
    report, server, token = run_hostile(alice, charlie, canaries, control=False)
    try:
        assert server.sandboxed and server.sandbox_note == ""
        for phase in ("initialize", "execute"):
            attempts = report[phase]
            assert set(WORK_UNSANDBOXED) <= set(attempts), f"{phase}: attempts missing"
            escaped = {name: r["detail"] for name, r in attempts.items()
                       if r["escaped"] and name != "detached_process"
                       and not harmless(name, r["detail"], server, token)}
            assert escaped == {}, f"{phase}: escaped {json.dumps(escaped, indent=1)}"
        assert len(report["initialize"]) >= 50
        assert canaries.hits == []  # nothing reached the stand-ins for the portal, UDP and abstract sockets included
        assert not (Path(settings.VAR_DIR) / f"pwned-{token}").exists()
        assert planted not in json.dumps(report)
        # Neither its own server's admin key nor the other team's reached it, in any form.
        for key in (server.admin_key, TritonServer.objects.get(revision__deployment__name="victim").admin_key):
            assert key and key not in json.dumps(report) and key[:6] not in json.dumps(report)
        # Nothing of it is root outside: every process runs as the unprivileged sandbox uid.
        assert outer_uids(server) == ({settings.SANDBOX_UID} if os.geteuid() == 0 else {os.geteuid()})
        # The detached process it started is real (it runs now) and lives in the sandbox's PID namespace.
        detached = processes_named(f"hostile-detached-{token}")
        assert len(detached) == 1
        assert os.readlink(f"/proc/{detached[0]}/ns/pid") == os.readlink(f"/proc/{server.pid}/ns/pid")

        response = alice.client().post("/api/v1/deployments/hostile/stop")
        assert response.status_code == 202
        assert Deployment.objects.get(name="hostile").status == Deployment.Status.STOPPED
        assert gone(server)
        assert processes_named(f"hostile-detached-{token}") == []  # setsid + double fork did not outlive the stop
        assert not local_confined.scratch_dir(server).exists()
        assert all(not Path(d).exists() for d in server.cgroups)
    finally:
        kill_named(f"hostile-detached-{token}")


def test_the_same_model_unsandboxed_escapes_which_proves_each_attempt_is_real(
    alice: Person, charlie: Person, eager_tasks: Any, canaries: Canaries, planted: str, unsandboxed: None,
) -> None:
    report, server, token = run_hostile(alice, charlie, canaries, control=True)
    try:
        assert not server.sandboxed and server.sandbox_note == "SANDBOX_ENABLED is false"
        escaped = {name for name, r in report["initialize"].items() if r["escaped"]}
        assert WORK_UNSANDBOXED - escaped == set(), {n: report["initialize"][n] for n in WORK_UNSANDBOXED - escaped}
        assert {"tcp", "tcp6", "abstract"} <= set(canaries.hits) and any(h.startswith("udp") for h in canaries.hits)
        # Even unsandboxed, Triton's environment holds nothing of the portal's: only /proc gave the secret away.
        assert not report["initialize"]["env_secret"]["escaped"]
        # The bug this work fixes: a detached process outlives an unsandboxed Triton's stop.
        response = alice.client().post("/api/v1/deployments/hostile/stop")
        assert response.status_code == 202
        assert processes_named(f"hostile-detached-{token}") != []
    finally:
        kill_named(f"hostile-detached-{token}")
        (Path(settings.VAR_DIR) / f"pwned-{token}").unlink(missing_ok=True)


def test_a_legitimate_python_model_works_in_the_sandbox(alice: Person, eager_tasks: Any,
                                                        sandbox_required: None) -> None:
    signature = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                 "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]},
                             {"name": "info", "datatype": "BYTES", "dims": [-1, 1]}]}
    files = {"model.py": model_source("legit_model"), "labels.json": b'["a", "b", "c"]',
             "matmul.onnx": tiny_onnx(in_features=4, out_features=3)}
    python_version(alice, "legit", files, signature)
    server = ready(deploy(alice, "legit", [{"model": "legit"}]))
    assert server.sandboxed
    x = [[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.5, 0.25]]
    answer = infer(server, "legit", [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": sum(x, [])}])

    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(tiny_onnx(in_features=4, out_features=3), providers=["CPUExecutionProvider"])
    expected = session.run(["y"], {"x": np.array(x, dtype=np.float32)})[0]
    assert np.allclose(np.array(output(answer, "y")).reshape(2, 3), expected, atol=1e-5)
    info = json.loads(output(answer, "info")[0])
    assert info["labels"] == ["a", "b", "c"] and info["png_size"] == [4, 2]
    assert info["temporary"] == "scratch" and info["state"] == {"initialized": True}
    assert info["threads"] == [0, 1, 4, 9] and info["child"] == "42"
    assert info["home"] == str(local_confined.scratch_dir(server) / "home") and info["uid"] == 1000
    # What it wrote is in its scratch directory, a tmpfs seen only inside the sandbox: the host's directory of that
    # name stays empty (tests/test_sandbox_scratch.py bounds it).
    assert [p for p in local_confined.scratch_dir(server).rglob("*") if p.is_file()] == []


def test_a_model_that_takes_more_memory_than_its_limit_is_killed_and_the_deployment_says_why(
    alice: Person, eager_tasks: Any, sandbox_required: None,
) -> None:
    if sandbox_settings.sandbox_capabilities().cgroups.version == 0:
        pytest.skip(f"no cgroups here: {sandbox_settings.sandbox_capabilities().cgroups.note}")
    files = {"model.py": model_source("greedy_model"), "greed.json": b'{"megabytes": 700}'}
    python_version(alice, "greedy", files, VECTOR)
    started = time.monotonic()
    deployment = deploy(alice, "greedy", [{"model": "greedy"}], resources={"memory": "300Mi"})
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.FAILED
    assert "Out of memory" in deployment.status_message and "300Mi" in deployment.status_message
    assert time.monotonic() - started < 120
    server = TritonServer.objects.get(deployment=deployment)
    assert gone(server)
    assert all(not Path(d).exists() for d in server.cgroups)  # the limit's cgroup went with it


def test_a_model_killed_for_memory_after_it_served_does_not_leave_the_deployment_ready(
    alice: Person, eager_tasks: Any, sandbox_required: None,
) -> None:
    if sandbox_settings.sandbox_capabilities().cgroups.version == 0:
        pytest.skip(f"no cgroups here: {sandbox_settings.sandbox_capabilities().cgroups.note}")
    files = {"model.py": model_source("hungry_model"), "hunger.json": b'{"megabytes": 700}'}
    python_version(alice, "hungry", files, VECTOR)
    deployment = deploy(alice, "hungry", [{"model": "hungry"}], resources={"memory": "300Mi"})
    server = ready(deployment)  # it loads within its limit
    with pytest.raises(urllib.error.HTTPError):
        infer(server, "hungry", [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}])
    # The health check the reconciler runs every few seconds: one tick of it.
    reconcile.reconcile(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status != Deployment.Status.READY
    assert "killed for memory (limit 300Mi, 300 MiB)" in deployment.status_message, deployment.status_message
    event = deployment.events.filter(kind="error", message__contains="stopped serving").get()
    assert "killed for memory (limit 300Mi" in event.message and "Out of memory" in event.message
    assert gone(server)


def test_an_operator_can_allow_egress_to_the_listed_ports_only(
    alice: Person, eager_tasks: Any, canaries: Canaries, sandbox_required: None, settings: Any,
) -> None:
    settings.SANDBOX_EGRESS_PORTS = [str(canaries.tcp_port)]
    token = secrets.token_hex(6)
    probe = {"token": token, "ports": {"portal": canaries.tcp_port, "redis": 6379, "udp": canaries.udp_port}}
    files = {"model.py": model_source("egress_model"), "targets.json": json.dumps(probe).encode()}
    python_version(alice, "egress", files, REPORT)
    deployment = deploy(alice, "egress", [{"model": "egress"}])
    before = ready(deployment)
    ask = [{"name": "probe", "datatype": "BYTES", "shape": [1], "data": ["go"]}]
    denied = json.loads(output(infer(before, "egress", ask), "report")[0])
    assert denied == {"portal": False, "redis": False, "udp": False}, denied

    operator = get_user_model().objects.create_superuser("operator", "op@example.com", "password")
    client = Client()
    client.force_login(operator)
    response = admin_change(client, deployment, allow_egress=True)  # the reconciler restarts it, eagerly
    assert response.status_code == 302, response.content[:2000]

    after = ready(deployment)
    assert after.pk != before.pk and after.allow_egress and gone(before)
    allowed = json.loads(output(infer(after, "egress", ask), "report")[0])
    assert allowed == {"portal": True, "redis": False, "udp": True}, allowed
    assert "tcp" in canaries.hits
    entry = AuditEntry.objects.get(action="deployment.egress")
    assert entry.username == "operator" and entry.detail == {"allow_egress": True}
    assert deployment.events.filter(message__contains="Outgoing connections allowed by operator operator").exists()
    assert alice.client().get("/api/v1/deployments/egress/").json()["allow_egress"] is True


def test_with_tracing_on_triton_may_reach_the_collectors_port_and_its_models_may_not(
    alice: Person, eager_tasks: Any, canaries: Canaries, sandbox_required: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The collector's port is Triton's alone (docs/security.md, "Tracing"): a python model runs in a network
    namespace of its own, so the port Landlock opens for Triton's exporter is nothing to it. (Triton itself reaching
    the collector, through the same sandbox: tests/test_tracing_e2e.py.)"""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{canaries.tcp_port}/v1/traces")
    token = secrets.token_hex(6)
    probe = {"token": token, "ports": {"portal": canaries.tcp_port, "redis": 6379, "udp": canaries.udp_port}}
    files = {"model.py": model_source("egress_model"), "targets.json": json.dumps(probe).encode()}
    python_version(alice, "traced", files, REPORT)
    server = ready(deploy(alice, "traced", [{"model": "traced"}]))
    assert server.sandboxed
    command = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    assert f"opentelemetry,url=http://127.0.0.1:{canaries.tcp_port}/v1/traces".encode() in command
    ask = [{"name": "probe", "datatype": "BYTES", "shape": [1], "data": ["go"]}]
    report = json.loads(output(infer(server, "traced", ask), "report")[0])
    assert report == {"portal": False, "redis": False, "udp": False}, report
