"""The tests' fake source kind "fake" (portal/settings_test.py IMPORT_TEST_KINDS): a real module, so that a Celery
worker process started by a test loads it as the web process does. No network: the bytes come from a file on this
machine, named in the source, and the test steers the fetch through module-level hooks.

Source fields: {"kind": "fake", "path": "<a local file>", "filename": "model.onnx", "declared_total": int|null,
"forbidden": bool, "extra_bytes": int, "transient_faults": int}.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models_registry.sources.base import (
    FetchContext,
    Fetched,
    SourceForbidden,
    SourceRefused,
    TransientFetchError,
)

CHUNK = 64


class Hooks:
    """What a test steers (in-process only): `gate` blocks the fetch between progress calls until set; `entered` is
    set when the fetch has begun; `attempts` counts fetches; `faults_left` transient faults to raise first."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.attempts = 0
        self.faults_left = 0
        self.writes: list[int] = []
        # Called after each chunk's progress call (a test cancels there, in the fetch's own thread).
        self.between: Callable[[], None] | None = None


hooks = Hooks()


class FakeFetcher:
    kind = "fake"

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        path = source.get("path")
        if not isinstance(path, str) or not path:
            raise SourceRefused('source.path must be the path of a local file (the fake kind of the tests).')
        if source.get("forbidden") is True:
            raise SourceForbidden("This source is not allowed to your team (a fake operator setting).")
        declared = source.get("declared_total")
        if declared is not None and (not isinstance(declared, int) or isinstance(declared, bool) or declared < 0):
            raise SourceRefused("source.declared_total must be a whole number of bytes, or null.")
        filename = source.get("filename", "model.onnx")
        if not isinstance(filename, str) or not filename:
            raise SourceRefused("source.filename must be a file name.")
        extra = source.get("extra_bytes", 0)
        if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
            raise SourceRefused("source.extra_bytes must be a whole number.")
        return {"path": path, "filename": filename, "declared_total": declared, "extra_bytes": extra}

    def identity(self, source: dict[str, Any]) -> str:
        return f"fake:{source['path']}"

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        hooks.attempts += 1
        hooks.entered.set()
        if hooks.faults_left > 0:
            hooks.faults_left -= 1
            raise TransientFetchError("The fake source reset the connection.")
        data = Path(source["path"]).read_bytes() + b"\0" * int(source.get("extra_bytes") or 0)
        total = source.get("declared_total")
        ctx.progress(0, total)
        out = ctx.workdir / source["filename"]
        with open(out, "wb") as stream:
            for start in range(0, len(data), CHUNK):
                if hooks.gate is not None:
                    hooks.gate.wait(10)
                chunk = data[start:start + CHUNK]
                stream.write(chunk)
                hooks.writes.append(len(chunk))
                ctx.progress(start + len(chunk), total)
                if hooks.between is not None:
                    hooks.between()
        return Fetched(path=out, filename=source["filename"], record={"fetched_bytes": len(data)})


fetcher = FakeFetcher()
