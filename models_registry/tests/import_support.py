"""A fetcher for the import backbone's tests (kind "fake", registered by the `fake_source` fixture): it serves a tiny
ONNX model in chunks, and can be told to declare another total, send more than it declared, fail transiently a number
of times, or wait between chunks until a test lets it go on (to cancel it meanwhile)."""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from typing import Any

from models_registry.sources.base import (
    FetchContext,
    Fetched,
    SourceRefused,
    TransientFetchError,
    copy_counted,
)
from tests.artifacts import tiny_onnx


@dataclass
class Script:
    declared_total: int | None = None  # None: the real size
    extra_bytes: int = 0  # sent beyond what was declared
    transient_failures: int = 0
    chunk: int = 64
    pause: threading.Event | None = None  # waited on after the first chunk
    paused: threading.Event = field(default_factory=threading.Event)  # set once it waits
    calls: int = 0
    progress_seen: list[tuple[int, int | None]] = field(default_factory=list)


SCRIPT = Script()


class _Chunks(io.RawIOBase):
    def __init__(self, data: bytes, chunk: int, script: Script) -> None:
        self.data, self.chunk, self.script, self.offset = data, chunk, script, 0

    def read(self, size: int = -1) -> bytes:
        if self.offset and self.script.pause is not None:
            self.script.paused.set()
            self.script.pause.wait(10)
        piece = self.data[self.offset:self.offset + self.chunk]
        self.offset += len(piece)
        return piece


class FakeFetcher:
    kind = "fake"

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        name = source.get("name")
        if set(source) != {"name"} or not isinstance(name, str) or not name:
            raise SourceRefused('A fake source is {"kind": "fake", "name": "<text>"}.')
        return {"name": name}

    def identity(self, source: dict[str, Any]) -> str:
        return str(source["name"])

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        script = SCRIPT
        script.calls += 1
        if script.calls <= script.transient_failures:
            raise TransientFetchError(f"connection reset (call {script.calls})")
        data = tiny_onnx() + b"\0" * script.extra_bytes if script.extra_bytes else tiny_onnx()
        total = script.declared_total if script.declared_total is not None else len(data)

        real = ctx.progress

        def progress(done: int, declared: int | None) -> None:
            script.progress_seen.append((done, declared))
            real(done, declared)

        ctx.progress = progress
        progress(0, total)
        path = ctx.workdir / "model.onnx"
        _, sha = copy_counted(_Chunks(data, script.chunk, script), path, ctx, 0, total)  # type: ignore[arg-type]
        return Fetched(path=path, filename="model.onnx", record={"name": source["name"], "files": {"model.onnx": sha}})


fetcher = FakeFetcher()
