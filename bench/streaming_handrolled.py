"""The hand-rolled baseline of the streaming benchmark (bench/streaming.py): the sample text generator served the way
a team writes it without Modelport, a Starlette app whose endpoint generates in-process, one stream per request, and
answers Server-Sent Events in the shape Triton's /generate_stream does (`data: {"text_output": "<piece>"}`).

    .venv/bin/python -m uvicorn bench.streaming_handrolled:app --port 8123   (TEXTGEN_WEIGHTS=<file.npz>)

Each stream steps its own generation (models_registry/sample_models/textgen.py `generate`): the seed's kind of
server, with no batching across requests. A step is a few numpy operations on the event loop; after each piece the
stream yields the loop (`asyncio.sleep(0)`), so concurrent streams take turns piece by piece. Without it a stream
whose client keeps up never lets another start (uvicorn's send does not yield while its buffer has room): at 8
streams the first piece waited 218 ms at p50 in a trial run, a starvation no careful hand-rolled server would ship,
and not what this baseline is for (batching against none).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from models_registry.sample_models import textgen

_model: textgen.CharModel | None = None


def model() -> textgen.CharModel:
    global _model
    if _model is None:
        _model = textgen.CharModel(textgen.load_counts(Path(os.environ["TEXTGEN_WEIGHTS"]).read_bytes()))
    return _model


async def generate_stream(request: Request) -> Response:
    body = await request.json()
    try:
        params = textgen.make_params(max_tokens=body.get("max_tokens"), temperature=body.get("temperature"),
                                     top_p=body.get("top_p"), seed=body.get("seed"))
    except textgen.BadRequest as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    pieces = textgen.generate(model(), str(body.get("text_input", "")), params)

    async def events() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield b"data: " + json.dumps({"text_output": piece}).encode() + b"\n\n"
            await asyncio.sleep(0)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


app = Starlette(routes=[Route("/v2/models/textgen/generate_stream", generate_stream, methods=["POST"])])
