"""Issue 12's hand-written list of nasty inputs, against the real thing: the gateway in front of a real Triton, and the
tus endpoints on a real uvicorn. What the issue asks of each: no 5xx, no Triton crash (the same Triton process
answers ready after every request, so that a crash the reconciler repaired would still show), no hang (every request
has a timeout and gets its answer well within it), nothing of another team's in an answer.

The gateway's own checks are unit-tested case by case against a fake upstream (gateway/tests/test_infer_body.py,
whose list this reuses) and its worst exploits end to end (tests/test_gateway_e2e.py); here every case of that list,
and the requests that pass the gateway's checks and only Triton can judge, go to a real Triton."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import tritonclient.http as httpclient

from deployments.runtimes.local.triton import is_alive
from gateway.tests.infer_bodies import BINARY_HOSTILE, HOSTILE, OK
from models_registry.models import Upload
from models_registry.tests.live_portal import Live, b64, read_answer, settled
from tests.deploying import deploy, push, serving, wait_status
from tests.nasty_inputs import PASSED_TO_TRITON, j
from tests.support.people import Person, make_person

TIMEOUT = 15  # seconds: a request that takes longer is a hang


def raw_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """One request written byte for byte, on its own connection, answered within TIMEOUT."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.triton
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_nasty_requests_to_the_gateway_get_4xx_and_leave_the_same_triton_serving(
    people: dict[str, Person], portal_url: str, digits_onnx: Path
) -> None:
    alice, charlie = people["alice"], people["charlie"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "max_batch_size": 1024}])
    wait_status(alice, "digits-prod", "ready")
    triton = serving("digits-prod")
    direct = httpclient.InferenceServerClient(url=f"127.0.0.1:{triton.http_port}")
    base = f"{portal_url}/serve/digits-prod"
    cases = [(name, "POST", "/v2/models/digits/infer", body, {}) for name, body, _, _ in HOSTILE]
    cases += [(name, "POST", "/v2/models/digits/infer", body, headers) for name, body, headers, _, _ in BINARY_HOSTILE]
    cases += PASSED_TO_TRITON
    answers: dict[str, int] = {}
    wrong = []
    for name, method, path, body, headers in cases:
        for person in (alice, charlie):
            started = time.monotonic()
            response = requests.request(method, base + path, data=body, timeout=TIMEOUT, headers={
                "Authorization": f"Bearer {person.token}", "Content-Type": "application/json", **headers})
            took = time.monotonic() - started
            if person is charlie:
                # Another team's deployment does not exist for charlie, whatever he sends (a target too long for
                # anyone is refused before the lookup).
                if (response.status_code not in (404, 414) or "acme" in response.text
                        or "digits" in response.text.replace("digits-prod", "")):
                    wrong.append((name, "charlie", response.status_code, response.text[:200]))
                continue
            answers[name] = response.status_code
            if response.status_code >= 500 or took > TIMEOUT / 2:
                wrong.append((name, response.status_code, round(took, 1), response.text[:300]))
            if not (is_alive(triton.pid) and direct.is_server_ready()):
                pytest.fail(f"Triton is down after {name!r}: {response.status_code} {response.text[:300]}")
    assert not wrong, "\n".join(map(repr, wrong))
    # The ones Triton judged got its own answer: a good request among them is served, a bad one a 400.
    assert answers["a gzip body"] == 200 and answers["binary output asked for"] == 200
    assert answers["INT64 for an FP32 input"] == 400 and answers["a batch over max_batch_size"] == 400
    assert answers["dot segments towards the admin API"] in (403, 404)

    # The same at the HTTP level, written byte for byte: framing that disagrees with itself, a target that is a URL.
    port = int(portal_url.rsplit(":", 1)[1])
    auth = f"Authorization: Bearer {alice.token}\r\nHost: portal\r\nConnection: close\r\n"
    body = j(OK)
    for name, request in [
        ("Content-Length and chunked", f"POST /serve/digits-prod/v2/models/digits/infer HTTP/1.1\r\n{auth}"
                                       f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                                       + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"),
        ("two Content-Lengths", f"POST /serve/digits-prod/v2/models/digits/infer HTTP/1.1\r\n{auth}"
                                f"Content-Length: {len(body)}\r\nContent-Length: 5\r\n\r\n".encode() + body),
        ("an absolute URL as the target", f"GET http://evil.example/serve/digits-prod/v2/health/ready HTTP/1.1\r\n"
                                          f"{auth}\r\n".encode()),
        ("HTTP/1.0 without a Host", f"GET /serve/digits-prod/v2/health/ready HTTP/1.0\r\nAuthorization: Bearer "
                                    f"{alice.token}\r\n\r\n".encode()),
        ("a 64 KB header", f"GET /serve/digits-prod/v2/health/ready HTTP/1.1\r\n{auth}X-Pad: {'a' * 65536}\r\n\r\n"
                           .encode()),
        ("Expect: 100-continue", f"POST /serve/digits-prod/v2/models/digits/infer HTTP/1.1\r\n{auth}"
                                 f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body),
    ]:
        status, answer = raw_exchange(port, request)
        assert status < 500, (name, status, answer[:300])
        assert is_alive(triton.pid) and direct.is_server_ready(), name

    # The very process that started serves on: no crash was repaired behind the test's back.
    assert serving("digits-prod").pid == triton.pid
    gateway = httpclient.InferenceServerClient(url=f"{portal_url.removeprefix('http://')}/serve/digits-prod")
    assert gateway.is_model_ready("digits", headers={"Authorization": f"Bearer {alice.token}"})


# --- tus ------------------------------------------------------------------------------------------------------

TUS = {"Tus-Resumable": "1.0.0"}


def tus_request(live: Live, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Any:
    """One request on its own connection; an answer that takes longer than TIMEOUT fails the test (a hang)."""
    with live.connect(timeout=TIMEOUT) as sock:
        # Connection: close, so that a HEAD's answer (a Content-Length and no body) ends with the connection.
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
                 f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        sock.sendall("\r\n".join(lines).encode() + body)  # UTF-8, as a hostile client may write it
        return read_answer(sock)


def auth(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}", **TUS}


# (name, headers of a creation): each is a 4xx and creates nothing.
NASTY_CREATIONS: list[tuple[str, dict[str, str]]] = [
    ("no Upload-Length", {}),
    ("an empty Upload-Length", {"Upload-Length": ""}),
    ("a hex Upload-Length", {"Upload-Length": "0x10"}),
    ("an exponent", {"Upload-Length": "1e3"}),
    ("a plus sign", {"Upload-Length": "+5"}),
    ("a negative length", {"Upload-Length": "-1"}),
    ("superscript digits", {"Upload-Length": "²"}),
    ("Arabic-Indic digits", {"Upload-Length": "١٢"}),
    ("a length beyond int64", {"Upload-Length": "9" * 30}),
    ("over the maximum size", {"Upload-Length": str(2**62)}),
    ("a deferred length", {"Upload-Defer-Length": "1"}),
    ("metadata that is not base64", {"Upload-Length": "10", "Upload-Metadata": "filename !!!"}),
    ("metadata of 100 KB", {"Upload-Length": "10", "Upload-Metadata": "filename " + "QUFB" * 25_000}),
    ("no Tus-Resumable", {"Upload-Length": "10", "Tus-Resumable": ""}),
    ("another tus version", {"Upload-Length": "10", "Tus-Resumable": "0.2.2"}),
]


@pytest.mark.django_db(transaction=True)
def test_nasty_tus_creations_get_4xx_and_create_nothing(live: Live) -> None:
    alice = make_person("alice", "acme")
    wrong = []
    for name, headers in NASTY_CREATIONS:
        answer = tus_request(live, "POST", "/api/v1/uploads/", {**auth(alice), **headers})
        if not 400 <= answer.status < 500 or not json.loads(answer.body)["error"]["message"]:
            wrong.append((name, answer.status, answer.body[:200]))
    assert wrong == []
    assert not Upload.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_nasty_tus_patches_get_4xx_keep_the_upload_as_it_was_and_give_nothing_away(live: Live) -> None:
    alice, charlie = make_person("alice", "acme"), make_person("charlie", "globex")
    created = tus_request(live, "POST", "/api/v1/uploads/", {**auth(alice), "Upload-Length": "10",
                                                             "Upload-Metadata": f"filename {b64('secret.onnx')}"})
    assert created.status == 201
    url = "/api/v1/uploads/" + created.headers["location"].rstrip("/").rsplit("/", 1)[-1]
    assert tus_request(live, "PATCH", url, {**auth(alice), "Content-Type": "application/offset+octet-stream",
                                            "Upload-Offset": "0"}, b"12345").status == 204
    patch = {**auth(alice), "Content-Type": "application/offset+octet-stream"}
    cases: list[tuple[str, str, str, dict[str, str], bytes]] = [
        ("an offset behind the server's", "PATCH", url, {**patch, "Upload-Offset": "0"}, b"xxxxx"),
        ("an offset ahead of it", "PATCH", url, {**patch, "Upload-Offset": "7"}, b"xxx"),
        ("an offset past the end", "PATCH", url, {**patch, "Upload-Offset": "99"}, b"x"),
        ("superscript digits in the offset", "PATCH", url, {**patch, "Upload-Offset": "⁵"}, b"xxxxx"),
        ("no offset", "PATCH", url, patch, b"xxxxx"),
        ("more than remains", "PATCH", url, {**patch, "Upload-Offset": "5"}, b"x" * 6),
        ("a checksum of another algorithm", "PATCH", url,
         {**patch, "Upload-Offset": "5", "Upload-Checksum": "md5 AAAA"}, b"xxxxx"),
        ("a checksum without a digest", "PATCH", url, {**patch, "Upload-Offset": "5", "Upload-Checksum": "sha256"},
         b"xxxxx"),
        ("a wrong checksum", "PATCH", url,
         {**patch, "Upload-Offset": "5", "Upload-Checksum": "sha256 " + b64("x" * 32)}, b"xxxxx"),
        ("a JSON body", "PATCH", url, {**patch, "Upload-Offset": "5", "Content-Type": "application/json"}, b"{}"),
        ("a Content-Type with parameters", "PATCH", url,
         {**patch, "Upload-Offset": "5", "Content-Type": "application/offset+octet-stream; x=1"}, b"xxxxx"),
        ("no Tus-Resumable", "PATCH", url, {**patch, "Upload-Offset": "5", "Tus-Resumable": ""}, b"xxxxx"),
        ("an id that is no UUID", "PATCH", "/api/v1/uploads/..%2F..%2Fetc%2Fpasswd",
         {**patch, "Upload-Offset": "5"}, b"xxxxx"),
        ("an id of 10 KB", "PATCH", "/api/v1/uploads/" + "a" * 10_000, {**patch, "Upload-Offset": "5"}, b"xxxxx"),
        ("no credentials", "PATCH", url, {**TUS, "Content-Type": "application/offset+octet-stream",
                                          "Upload-Offset": "5"}, b"xxxxx"),
        ("a HEAD without Tus-Resumable", "HEAD", url, {"Authorization": f"Bearer {alice.token}"}, b""),
    ]
    wrong = []
    for name, method, path, headers, body in cases:
        answer = tus_request(live, method, path, headers, body)
        if not 400 <= answer.status < 500:
            wrong.append((name, answer.status, answer.body[:200]))
    assert wrong == []
    upload = settled(Upload.objects.get())
    assert upload.offset == 5

    # Charlie, with alice's upload URL: 404 for everything, and nothing of it in the answer.
    for method, headers, body in [("HEAD", {}, b""), ("DELETE", {}, b""),
                                  ("PATCH", {"Content-Type": "application/offset+octet-stream", "Upload-Offset": "5"},
                                   b"xxxxx")]:
        answer = tus_request(live, method, url, {**auth(charlie), **headers}, body)
        assert answer.status == 404, (method, answer.status)
        assert "upload-offset" not in answer.headers and "upload-metadata" not in answer.headers
        assert b"secret" not in answer.body and b"acme" not in answer.body
    assert settled(upload).offset == 5

    # The upload takes its remaining bytes as if nothing had happened, and is deleted once.
    done = tus_request(live, "PATCH", url, {**patch, "Upload-Offset": "5"}, b"67890")
    assert done.status == 204 and done.headers["upload-offset"] == "10"
    assert tus_request(live, "PATCH", url, {**patch, "Upload-Offset": "10"}, b"x").status in (409, 413)
    assert tus_request(live, "DELETE", url, auth(alice)).status == 204
    assert tus_request(live, "DELETE", url, auth(alice)).status == 404
