"""The tus protocol as a test client speaks it (a fixture module: nothing here is collected)."""

from __future__ import annotations

from typing import Any

from tests.support.people import Person

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


def create(person: Person, length: int, metadata: str = "filename bW9kZWwub25ueA==") -> Any:
    return person.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=str(length), HTTP_UPLOAD_METADATA=metadata,
                                **TUS)


def patch(person: Person, url: str, offset: int, body: bytes, **headers: Any) -> Any:
    return person.client().generic("PATCH", url, body, content_type="application/offset+octet-stream",
                                   HTTP_UPLOAD_OFFSET=str(offset), **TUS, **headers)


def path_of(location: str) -> str:
    return location.split("testserver", 1)[-1]
