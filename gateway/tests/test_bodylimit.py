"""Request bodies on Django's paths are capped before Django reads them: its ASGI handler spools the whole body to
a temporary file before any view (or authentication) runs, so without the cap one anonymous request could fill
the disk. These run the real Django application behind the cap (portal/asgi.py's wiring)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.bodylimit import BodyLimit
from tests.support.gateway_calls import call, run


class Recorder:
    """An app that reads the whole body, as Django's handler does, and says how much it got."""

    def __init__(self) -> None:
        self.calls = 0
        self.received = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            self.received += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read %d" % self.received})


@pytest.fixture
def limits(settings: Any) -> None:
    settings.MAX_REQUEST_BODY_BYTES = 1000
    settings.MAX_UPLOAD_SIZE = 5000


def test_a_declared_body_over_the_limit_is_refused_before_the_app_runs(limits: None) -> None:
    async def scenario() -> None:
        app = Recorder()
        reply = await call(BodyLimit(app), "POST", "/api/v1/models/", body=b"x" * 1001)
        assert reply.status == 413 and app.calls == 0
        assert "limit is 1000 bytes" in reply.json()["error"]["message"]
        bad = await call(BodyLimit(app), "POST", "/api/v1/models/", body=b"x", headers={"Content-Length": "1e3"})
        assert bad.status == 400 and app.calls == 0

    run(scenario)


def test_a_chunked_body_is_cut_off_at_the_limit_and_answered_413(limits: None) -> None:
    async def scenario() -> None:
        app = Recorder()
        reply = await call(BodyLimit(app), "POST", "/api/v1/models/", body=[b"x" * 400] * 10)
        assert reply.status == 413 and app.received <= 1000

    run(scenario)


def test_bodies_within_the_limit_and_tus_patches_within_the_upload_limit_pass(limits: None) -> None:
    async def scenario() -> None:
        ok = await call(BodyLimit(Recorder()), "POST", "/api/v1/models/", body=b"x" * 1000)
        assert ok.body == b"read 1000"
        patch = await call(BodyLimit(Recorder()), "PATCH", "/api/v1/uploads/abc123", body=[b"x" * 1000] * 4)
        assert patch.body == b"read 4000"
        too_long = await call(BodyLimit(Recorder()), "PATCH", "/api/v1/uploads/abc123", body=b"x" * 5001)
        assert too_long.status == 413
        assert (await call(BodyLimit(Recorder()), "POST", "/api/v1/uploads/abc", body=b"x" * 1001)).status == 413

    run(scenario)


def test_the_portal_caps_bodies_before_django_and_passes_the_rest_to_it(transactional_db: Any, limits: None) -> None:
    from portal.asgi import application

    async def scenario() -> None:
        too_big = await call(application, "POST", "/api/v1/models/", body=[b"{" + b" " * 600, b" " * 600 + b"}"])
        assert too_big.status == 413
        reached = await call(application, "POST", "/api/v1/models/", body=b'{"name": "x"}',
                             headers={"Content-Type": "application/json"})
        assert reached.status == 401  # Django's API answered: not signed in

    run(scenario)
