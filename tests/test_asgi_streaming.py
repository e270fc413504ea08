"""What streams through the real web server (uvicorn with portal/web_server.py's protocol serving portal.asgi) does
so without Django's "StreamingHttpResponse must consume synchronous iterators in order to serve them
asynchronously" warning (issue 31): static files (whitenoise's FileResponse, whose synchronous iterator Django read
whole in a thread, warning each time; portal/static_files.py), and an answer the gateway streams (an inference
answer over its 1 MiB threshold, sent chunked by a scripted upstream on a real socket in place of Triton)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import django_htmx
import pytest
import requests

from gateway.tests import fake_upstream
from portal import static_files
from tests import processes
from tests.support.gateway_calls import make_deployment
from tests.support.people import Person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WARNING = "must consume synchronous iterators"
ROOT = Path(__file__).resolve().parent.parent
# An answer of 3 MiB in pieces, over the gateway's STREAM_THRESHOLD (1 MiB): streamed on as it arrives.
PIECES = [b'{"model_name":"digits","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,'
          b'%d],"data":[' % (3 * 2**19), *(b"0.0," * 2**18 for _ in range(3)), b"0.0]}]}"]


def _stream(request: fake_upstream.Request) -> bytes:
    if request.target.endswith(b"/infer"):
        return fake_upstream.chunked(200, PIECES).replace(
            b"Transfer-Encoding", b"Content-Type: application/json\r\nTransfer-Encoding", 1)
    return fake_upstream.json_response({"error": "not here"}, 404)


@pytest.fixture
def upstream() -> Iterator[str]:
    """The scripted upstream, served by an event loop of its own in a thread (the test's requests are blocking)."""
    loop = asyncio.new_event_loop()
    server = fake_upstream.FakeUpstream(answer=_stream)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(10)
    try:
        yield server.url
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_static_files_and_a_streamed_answer_are_served_without_the_synchronous_iterator_warning(
        tmp_path: Path, alice_tx: Person, upstream: str) -> None:
    make_deployment(alice_tx, "streamer", upstream)
    log = tmp_path / "web.log"
    port = processes.free_port()
    # Every warning, not once per place: the first static file would otherwise hide what the others do.
    web = processes.start_web(log, port, {"PYTHONWARNINGS": "always"})
    base = f"http://127.0.0.1:{port}"
    try:
        processes.wait_for(lambda: _healthy(base), 60, what="the web server")
        for path in ("static/css/app.css", "static/js/app.js", "static/img/favicon.svg"):
            expected = (ROOT / path).read_bytes()
            got = requests.get(f"{base}/{path}", timeout=30)
            assert got.status_code == 200 and got.content == expected, (path, got.status_code)
            assert int(got.headers["Content-Length"]) == len(expected)
            # A range, a HEAD and a revalidation: whitenoise's own answers, streamed the same way.
            ranged = requests.get(f"{base}/{path}", headers={"Range": "bytes=5-20"}, timeout=30)
            assert ranged.status_code == 206 and ranged.content == expected[5:21]
            head = requests.head(f"{base}/{path}", timeout=30)
            assert head.status_code == 200 and head.content == b""
            again = requests.get(f"{base}/{path}", headers={"If-None-Match": got.headers["ETag"]}, timeout=30)
            assert again.status_code == 304 and again.content == b""
        # A file of many blocks arrives whole and in order (htmx, from django-htmx's package).
        expected = (Path(django_htmx.__file__).parent / "static" / "django_htmx" / "htmx-2.js").read_bytes()
        assert len(expected) > 2 * static_files.BLOCK_BYTES
        htmx = requests.get(f"{base}/static/django_htmx/htmx-2.js", timeout=30)
        assert htmx.status_code == 200 and htmx.content == expected

        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
        with requests.post(f"{base}/serve/streamer/v2/models/digits/infer", json=body,
                           headers={"Authorization": f"Bearer {alice_tx.token}"}, stream=True, timeout=30) as streamed:
            assert streamed.status_code == 200, streamed.text[:500]
            assert streamed.raw.read() == b"".join(PIECES)
    finally:
        processes.kill(web)
    text = log.read_text(errors="replace")
    assert WARNING not in text, text[-3000:]


def _healthy(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False
