"""A request refused before its body is read (401, 404, 413) still gets its answer to a client that is sending a
body of a few MB: urllib, requests and tritonclient against the real web server (uvicorn with portal/web_server.py's
protocol serving portal.asgi) on a real socket. Before, uvicorn closed the connection with the body unread, the
kernel reset it, and urllib raised BrokenPipeError or ConnectionResetError instead of the answer.
docs/security.md, "Refusals a client can read"."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import processes
from tests.support.gateway_calls import make_deployment
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024
GATEWAY_LIMIT = 8 * MB  # the body limits in the served process
API_LIMIT = 1 * MB


@pytest.fixture
def alice_and_theirs(transactional_db: Any) -> Person:
    make_deployment(make_person("charlie", "globex", role="admin"), "theirs", "http://127.0.0.1:9")
    return make_person("alice", "acme", role="admin")


@pytest.fixture
def web(tmp_path: Path, alice_and_theirs: Person) -> Iterator[int]:
    port = processes.free_port()
    log = tmp_path / "web.log"
    process = processes.start_web(log, port, {"GATEWAY_MAX_BODY_BYTES": str(GATEWAY_LIMIT),
                                               "MAX_REQUEST_BODY_BYTES": str(API_LIMIT),
                                               "WEB_LINGER_SECONDS": "5"})
    try:
        processes.wait_for(lambda: _healthy(port), 60, what="the web server")
        yield port
    finally:
        processes.kill(process)
        print("--- web.log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))


def _healthy(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _refusals(port: int, token: str) -> list[tuple[str, str, dict[str, str], bytes, int, str]]:
    """(what, url, headers, body, status, a phrase of the answer): each refused before its body is read, and each
    body a few MB, far more than the sockets' buffers hold."""
    base = f"http://127.0.0.1:{port}"
    infer = "/v2/models/m/infer"
    return [
        ("no token", f"{base}/serve/digits{infer}", {}, b"x" * 6 * MB, 401, "Authentication required"),
        ("a bad token", f"{base}/serve/digits{infer}", {"Authorization": "Bearer mp_nope"}, b"x" * 6 * MB, 401,
         "invalid"),
        ("another team's deployment", f"{base}/serve/theirs{infer}", {"Authorization": f"Bearer {token}"},
         b"x" * 6 * MB, 404, "There is no deployment named 'theirs' in team"),
        ("a body over the gateway's limit", f"{base}/serve/theirs{infer}", {"Authorization": f"Bearer {token}"},
         b"x" * 12 * MB, 413, f"the limit is {GATEWAY_LIMIT} bytes"),
        ("a body over the API's limit", f"{base}/api/v1/models/", {"Authorization": f"Bearer {token}"},
         b"x" * 6 * MB, 413, f"the limit is {API_LIMIT} bytes"),
    ]


def test_urllib_reads_each_refusal_of_a_body_it_is_still_sending(web: int, alice_and_theirs: Person) -> None:
    # urllib sends `Connection: close`: the connection ends after the answer, the case that lost it before.
    got = []
    for what, url, headers, body, _, _ in _refusals(web, alice_and_theirs.token):
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/octet-stream", **headers})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                got.append((what, reply.status, reply.read()[:200]))
        except urllib.error.HTTPError as exc:
            got.append((what, exc.code, exc.read()[:300]))
    assert [(what, status) for what, status, _ in got] == [(r[0], r[4]) for r in _refusals(web, alice_and_theirs.token)]
    for (_, _, answer), refusal in zip(got, _refusals(web, alice_and_theirs.token), strict=True):
        assert refusal[5].encode() in answer


def test_requests_reads_each_refusal_and_keeps_its_connection(web: int, alice_and_theirs: Person) -> None:
    with requests.Session() as session:
        for what, url, headers, body, status, phrase in _refusals(web, alice_and_theirs.token):
            reply = session.post(url, data=body, headers=headers, timeout=30)
            assert (what, reply.status_code) == (what, status)
            assert phrase in reply.text
        # The bodies were drained: the kept-alive connection serves the next request.
        assert session.get(f"http://127.0.0.1:{web}/healthz", timeout=5).status_code == 200


def test_tritonclient_reads_the_gateways_refusal_of_a_large_request(web: int, alice_and_theirs: Person) -> None:
    tensor = np.zeros((1, 1_500_000), dtype=np.float32)  # 6 MB of binary data
    for base, headers, phrase in [
        (f"127.0.0.1:{web}/serve/digits", {}, "Authentication required"),
        (f"127.0.0.1:{web}/serve/theirs", {"Authorization": f"Bearer {alice_and_theirs.token}"},
         "There is no deployment named"),
    ]:
        client = httpclient.InferenceServerClient(base, network_timeout=30, connection_timeout=30)
        infer_input = httpclient.InferInput("input", list(tensor.shape), "FP32")
        infer_input.set_data_from_numpy(tensor, binary_data=True)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("m", [infer_input], headers=headers)
        assert phrase in str(raised.value), str(raised.value)
        client.close()


def test_a_client_that_never_stops_sending_is_closed_after_the_linger(web: int) -> None:
    # A declared 10 GB for a refused request: the answer, then a bounded wait, not 10 GB of reading.
    with socket.create_connection(("127.0.0.1", web), timeout=10) as sock:
        sock.sendall(b"POST /serve/digits/v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
        started = time.monotonic()
        answer = b""
        sent = 0
        sock.settimeout(0.5)
        try:
            while time.monotonic() - started < 20:
                try:
                    sent += sock.send(b"x" * 65536)
                except TimeoutError:
                    pass
                try:
                    answer += sock.recv(65536)
                except TimeoutError:
                    pass
        except (BrokenPipeError, ConnectionResetError):
            pass
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert elapsed < 15  # WEB_LINGER_SECONDS (5) or WEB_DRAIN_BYTES (64 MiB), whichever came first
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {
        "error": f"The request body is 10000000000 bytes; the limit is {GATEWAY_LIMIT} bytes."}
