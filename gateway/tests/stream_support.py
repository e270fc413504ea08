"""What the stream tests share (gateway/tests/test_streams.py, tests/test_stream_slow_reader.py): Triton's SSE head,
an event as it writes one, and a deployment of a streaming model."""

from __future__ import annotations

import json
from typing import Any

from deployments.models import Deployment, Revision
from tests.support.people import Person

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"model_name": "chat", "model_version": "1", "text_output": text}).encode() + b"\n\n"


def streaming_deployment(person: Person, upstream_url: str, decoupled: bool = True) -> None:
    deployment = Deployment.objects.create(team=person.team, name="chat", upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    entry: dict[str, Any] = {"name": "chat", "version": 1, "format": "python", "decoupled": decoupled}
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": [entry]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
