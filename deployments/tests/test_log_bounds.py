"""What a model writes reaches users bounded by bytes (issue 21, "giant log lines"): the logs API answers at most
LOG_TAIL_MAX_BYTES of a log that is one line of many MiB, `lines` has an upper bound, and the statuses and events
that carry Triton's errors or the death report keep an excerpt."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

from deployments.models import Deployment, Event, TritonServer
from deployments.runtimes.local import confined as local_confined
from deployments.runtimes.local import runtime as local_runtime
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import create as create_deployment
from deployments.tests.reconciling import tick
from models_registry.models import ModelVersion
from tests.support.deploying import post_deployment as create
from tests.support.people import Person

MiB = 1024**2


def server_with_log(deployment: Deployment, log: Path) -> TritonServer:
    return TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=2**22 + 7,
                                       http_port=1, grpc_port=2, metrics_port=3, log_path=str(log),
                                       state=TritonServer.State.READY)


def bomb(path: Path, size: int = 6 * MiB) -> Path:
    """The 300 MiB line without a newline, a few MiB above the cap."""
    with open(path, "wb") as f:
        f.write(b"I0101 00:00:00.000000 1 server.cc:1] started\n")
        for _ in range(size // MiB):
            f.write(b"x" * MiB)
    return path


def test_a_giant_log_line_is_answered_within_the_cap(alice: Person, digits: ModelVersion, tmp_path: Path,
                                                     settings: Any) -> None:
    create(alice)
    server_with_log(Deployment.objects.get(), bomb(tmp_path / "triton.log"))
    settings.LOG_TAIL_MAX_BYTES = MiB
    settings.LOG_LINE_MAX_BYTES = 4 * MiB  # so the tail's cap, not the line's, is what bounds the answer
    tracemalloc.start()
    try:
        response = alice.client().get("/api/v1/deployments/digits-prod/logs/?lines=1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    assert MiB - 100 <= len(response.content) <= MiB + 1024
    assert response.json()["log"].endswith("bytes cut)")
    assert peak < 12 * MiB  # the answer and its JSON, not the 6 MiB log
    settings.LOG_LINE_MAX_BYTES = 16 * 1024
    log = alice.client().get("/api/v1/deployments/digits-prod/logs/?lines=1").json()["log"]
    assert log == "x" * 16 * 1024 + f"… (more than {MiB - 16 * 1024:,} bytes cut)"


def test_lines_has_an_upper_bound_and_a_wrong_number_is_a_400_saying_what_to_fix(
        alice: Person, digits: ModelVersion, settings: Any) -> None:
    create(alice)
    client = alice.client()
    assert client.get(f"/api/v1/deployments/digits-prod/logs/?lines={settings.LOG_MAX_LINES}").status_code == 200
    for value, message in [(settings.LOG_MAX_LINES + 1, f"at most {settings.LOG_MAX_LINES} lines: ask for fewer"),
                           (0, "at least 1 line"), ("ten", "must be an integer")]:
        response = client.get(f"/api/v1/deployments/digits-prod/logs/?lines={value}")
        assert response.status_code == 400, value
        assert response.json()["error"]["fields"] == {"lines": [message]}
    settings.LOG_MAX_LINES = 10
    response = client.get("/api/v1/deployments/digits-prod/logs/?lines=11")
    assert response.json()["error"]["fields"] == {"lines": ["at most 10 lines: ask for fewer"]}


def test_the_schema_states_the_bound_of_lines(settings: Any) -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    [parameter] = [p for p in schema["paths"]["/api/v1/deployments/{name}/logs/"]["get"]["parameters"]
                   if p["name"] == "lines"]
    assert parameter["in"] == "query" and not parameter.get("required")
    assert parameter["schema"] == {"type": "integer", "minimum": 1, "maximum": settings.LOG_MAX_LINES, "default": 200}


def test_a_load_failure_with_a_giant_message_leaves_a_short_status_and_event(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, settings: Any) -> None:  # noqa: F811
    fake.fails_with = "failed to load 'digits': " + "e" * (5 * MiB)
    deployment = create_deployment(alice)
    for _ in range(6):
        tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == Deployment.Status.FAILED
    assert row.status_message.startswith("Revision 1 failed") or "failed to load 'digits'" in row.status_message
    assert len(row.status_message) <= settings.LOG_EXCERPT_MAX_CHARS + 100
    longest = max(len(e.message) for e in Event.objects.filter(deployment=deployment))
    assert longest <= settings.LOG_EXCERPT_MAX_CHARS + 100
    assert "bytes cut)" in row.status_message


def test_the_death_report_is_an_excerpt_of_tritons_errors(alice: Person, digits: ModelVersion, tmp_path: Path,
                                                          settings: Any) -> None:
    create(alice)
    log = tmp_path / "triton.log"
    with open(log, "wb") as f:
        for i in range(50):
            f.write(b"E0101 00:00:00.000000 1 model.py:1] \"boom %d " % i + b"z" * 100_000 + b"\"\n")
    server = server_with_log(Deployment.objects.get(), log)
    report = local_runtime._death_report(server)
    assert len(report) <= settings.LOG_EXCERPT_MAX_CHARS + 100
    # The last five errors, each cut (a cut message stays as Triton quoted it: it no longer decodes as JSON).
    assert report.startswith('"boom 45 zzz') and report.count("bytes cut)") >= 2


def test_a_revisions_old_logs_are_pruned_to_the_newest_few(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"triton-2026010{i}T000000000000.log").write_text("x")
        (tmp_path / f"triton-2026010{i}T000000000000.log.1").write_text("x")
    local_confined.prune_logs(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "triton-20260103T000000000000.log", "triton-20260103T000000000000.log.1",
        "triton-20260104T000000000000.log", "triton-20260104T000000000000.log.1"]
