"""Streaming (decoupled) models end to end (issue 33): uploaded with decoupled=true, checked piece by piece at their
trial call, deployed on a real Triton and read through the gateway's /generate_stream with plain HTTP clients, as
Server-Sent Events timed as they arrive (a gateway that buffers fails these tests)."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.artifacts import STREAMING_SIGNATURE, streaming_python_model_zip
from tests.deploying import deploy, serving, wait_status
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

PIECE_SECONDS = 0.2  # STREAMING_MODEL's gap between two pieces


@pytest.fixture
def stream_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The web server the portal_url fixture starts reads these: a piece of 2 MB is over the answer limit, and a model
    # silent for 3 s is past the idle limit.
    monkeypatch.setenv("GATEWAY_MAX_RESPONSE_BYTES", str(1024 * 1024))
    monkeypatch.setenv("GATEWAY_STREAM_IDLE_SECONDS", "1.5")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "100")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "100")


def upload(person: Person, name: str, archive: bytes, **fields: Any) -> Any:
    return person.client().post(f"/api/v1/models/{name}/versions/", {
        "file": SimpleUploadedFile(f"{name}.zip", archive), "signature": json.dumps(STREAMING_SIGNATURE),
        "create_model": "true", **fields}, format="multipart")


def inspected(person: Person, name: str, number: int) -> dict[str, Any]:
    client = person.client()
    path = f"/api/v1/models/{name}/versions/{number}/"
    return wait_for(lambda: (v := client.get(path).json())["status"] != "validating" and v, 60,  # type: ignore[no-any-return]
                    what=f"the worker to inspect {name}")


def read_events(url: str, headers: dict[str, str], text: str) -> tuple[requests.Response, list[tuple[float, str]]]:
    """The stream's events, each with the time it arrived (since the request was sent)."""
    started = time.monotonic()
    response = requests.post(url, json={"text_input": text}, headers=headers, stream=True, timeout=20)
    events: list[tuple[float, str]] = []
    held = b""
    for chunk in response.iter_content(chunk_size=None):
        held += chunk
        while b"\n\n" in held:
            event, held = held.split(b"\n\n", 1)
            events.append((time.monotonic() - started, event.decode()))
    return response, events


def data_of(event: str) -> Any:
    (line,) = [line for line in event.split("\n") if line.startswith("data: ")]
    return json.loads(line.removeprefix("data: "))


def test_a_streaming_model_streams_through_the_gateway_piece_by_piece_and_ends_in_triton_when_the_caller_goes(
    stream_settings: None, people: dict[str, Person], portal_url: str
) -> None:
    alice = people["alice"]
    created = upload(alice, "chat", streaming_python_model_zip(), decoupled="true")
    assert created.status_code == 201, created.json()
    assert created.json()["decoupled"] is True
    version = inspected(alice, "chat", created.json()["number"])
    assert version["status"] == "ready", version["error"]
    assert version["notes"] == []  # its trial call passed: every piece matched the signature
    deploy(alice, "chat", [{"model": "chat", "max_batch_size": 0}])
    wait_status(alice, "chat", "ready")
    auth = {"Authorization": f"Bearer {alice.token}"}
    base = f"{portal_url}/serve/chat/v2/models/chat"

    response, events = read_events(f"{base}/generate_stream", auth, "hello")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-cache" and response.headers["X-Accel-Buffering"] == "no"
    assert response.headers["Modelport-Revision"] == "1"
    assert [data_of(e)["text_output"] for _, e in events] == [f"piece {i}" for i in range(5)]
    # Sent 0.2 s apart, they arrive spread as they were sent: buffered, they would come together at the end.
    arrived = [at for at, _ in events]
    assert arrived[-1] - arrived[0] >= 3 * PIECE_SECONDS, arrived
    assert all(later - earlier >= PIECE_SECONDS / 2 for earlier, later in zip(arrived, arrived[1:], strict=False)), \
        arrived

    # /generate: one JSON answer from a model that sends one piece; for one that sends several, the 400 that names
    # the stream (Triton itself answers that with HTTP 200 and an error).
    one = requests.post(f"{base}/generate", json={"text_input": "one"}, headers=auth, timeout=10)
    assert one.status_code == 200, one.text
    assert one.json()["text_output"] == "piece 0" and one.json()["model_name"] == "chat"
    many = requests.post(f"{base}/generate", json={"text_input": "hello"}, headers=auth, timeout=10)
    assert many.status_code == 400 and "generate_stream" in many.json()["error"]
    # /infer refuses a streaming model in words naming both ways to stream.
    infer = requests.post(f"{base}/infer", json={"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES",
                                                             "data": ["hello"]}]}, headers=auth, timeout=10)
    assert infer.status_code == 400
    assert "generate_stream" in infer.json()["error"] and "ModelStreamInfer" in infer.json()["error"]
    # Another team's token: the 404 /infer gives, naming nothing of the deployment.
    charlie = requests.post(f"{base}/generate_stream", json={"text_input": "hello"},
                            headers={"Authorization": f"Bearer {people['charlie'].token}"}, timeout=10)
    assert charlie.status_code == 404
    assert "no deployment named 'chat' in team 'globex'" in charlie.json()["error"]
    assert requests.post(f"{base}/generate_stream", json={"text_input": "x"}, timeout=10).status_code == 401
    # A body that is no JSON object: the gateway's 400, before Triton.
    refused = requests.post(f"{base}/generate_stream", data=b"[1]", headers=auth, timeout=10)
    assert refused.status_code == 400 and "JSON object" in refused.json()["error"]

    # A model that raises after its first piece: the piece, then an error event saying so, and a stream that ends
    # properly (iter_content would raise on a cut one), in words that show nothing of the model's internals.
    response, events = read_events(f"{base}/generate_stream", auth, "fail")
    assert [data_of(e)["text_output"] for _, e in events[:1]] == ["piece 0"]
    assert events[1][1].startswith("event: error\n")
    assert "Model 'chat' failed on this request" in data_of(events[1][1])["error"]
    assert "model.py" not in events[1][1] and len(events) == 2

    # A piece over GATEWAY_MAX_RESPONSE_BYTES (1 MB here): not buffered on, the stream ends with the error event.
    response, events = read_events(f"{base}/generate_stream", auth, "big")
    assert len(events) == 1 and events[0][1].startswith("event: error\n")
    assert "GATEWAY_MAX_RESPONSE_BYTES" in data_of(events[0][1])["error"]
    # A model silent past GATEWAY_STREAM_IDLE_SECONDS (1.5 s here): its first piece, then the error event.
    response, events = read_events(f"{base}/generate_stream", auth, "slow")
    assert data_of(events[0][1])["text_output"] == "piece 0"
    assert events[-1][1].startswith("event: error\n") and "GATEWAY_STREAM_IDLE_SECONDS" in events[-1][1]

    # The caller goes away after the first piece: the gateway closes its connection to Triton, which cancels the
    # request, and the model sees it (it logs so in the server's log).
    log = Path(serving("chat").log_path)
    port = int(portal_url.rsplit(":", 1)[1])
    body = b'{"text_input": "hello"}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /serve/chat/v2/models/chat/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + alice.token.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while b"piece 0" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    seen = re.compile(r"stream-test: cancelled after (\d) pieces")
    cancelled = wait_for(lambda: seen.search(log.read_text(errors="replace")), 10,
                         what="the model to see the cancellation")
    assert int(cancelled.group(1)) < 5

    # Each stream's figures reach the stats API (the web process flushes them every few seconds): time to first
    # piece and between pieces (0.2 s apart), the caller that left and the streams ended by a bound, by reason.
    def figures() -> Any:
        streams = alice.client().get("/api/v1/deployments/chat/metrics/").json()["streams"]
        return streams if streams["cancelled"] >= 1 else None

    streams = wait_for(figures, 30, what="the stream figures to reach the stats API")
    assert streams["ttft_p50_ms"] is not None and 100 <= streams["itl_p50_ms"] <= 500, streams
    assert streams["ended_by"]["too_large"] == 1 and streams["ended_by"]["idle"] == 1, streams


@pytest.mark.parametrize("broken", ["misnamed", "mistyped"])
def test_a_streaming_model_whose_pieces_break_its_signature_is_refused_at_its_trial_call(
    broken: str, people: dict[str, Person], celery_processes: Any
) -> None:
    alice = people["alice"]
    created = upload(alice, "chat", streaming_python_model_zip(broken), decoupled="true")
    assert created.status_code == 201, created.json()
    version = inspected(alice, "chat", created.json()["number"])
    assert version["status"] == "invalid"
    assert "piece 1 of the stream" in version["error"], version["error"]
    assert ("output 'text_output' was not returned" if broken == "misnamed"
            else "output 'text_output' is FP32, declared BYTES") in version["error"]
