"""The streaming benchmark's own parts (bench/streaming.py): its client counts what a server streamed, and its verdict
reads the figures it was given. The benchmark itself runs by hand (docs/benchmarks.md, "Streaming")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from bench import streaming


async def measured(path: str, handler: Any, **loop: Any) -> dict[str, Any]:
    """The benchmark's closed loop against a small aiohttp server answering POST `path` with `handler`."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await streaming.closed_loop(f"http://127.0.0.1:{port}{path}", {}, **loop)
    finally:
        await runner.cleanup()


def figures(pieces_per_s: float, ttft_p50: float, ttft_p99: float, itl_p50: float) -> dict[str, Any]:
    return {"pieces": 100, "pieces_per_s": pieces_per_s, "ttft_p50_ms": ttft_p50, "ttft_p99_ms": ttft_p99,
            "itl_p50_ms": itl_p50, "event_gap_p50_ms": itl_p50}


def test_the_client_counts_every_piece_of_every_stream_and_times_the_first() -> None:
    """An event carrying several pieces counts each of them."""
    async def serve_and_measure() -> dict[str, Any]:
        async def stream(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            # The first two pieces in one event (a list, as Triton writes a model's [1, 2] text_output), then one each.
            outputs: list[Any] = [["w0 ", "w1 "], *(f"w{index} " for index in range(2, body["max_tokens"]))]
            for output in outputs:
                await response.write(b"data: " + json.dumps({"text_output": output}).encode() + b"\n\n")
            await response.write_eof()
            return response

        return await measured("/v2/models/textgen/generate_stream", stream, streams=2, duration=0.3, warmup=0.05,
                              max_tokens=5)

    result = asyncio.run(serve_and_measure())
    assert result["errors"] == 0
    assert result["completed"] >= 2
    assert result["pieces"] == 5 * result["completed"] and result["events"] == 4 * result["completed"]
    assert result["ttft_p50_ms"] is not None and result["itl_p50_ms"] is not None
    assert result["pieces_per_s"] > result["events_per_s"] > 0


def test_an_error_event_counts_as_an_error_not_as_a_piece() -> None:
    async def serve_and_measure() -> dict[str, Any]:
        async def stream(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'event: error\ndata: {"error": "the model failed"}\n\n')
            await response.write_eof()
            return response

        return await measured("/s", stream, streams=1, duration=0.1, warmup=0.0, max_tokens=5)

    result = asyncio.run(serve_and_measure())
    assert result["errors"] >= 1 and result["pieces"] == 0
    assert "the model failed" in result["first_errors"][0]


def test_the_verdict_compares_the_gateway_with_direct_at_8_and_with_the_handrolled_server_at_32() -> None:
    levels = {
        "8": {"gateway": figures(3000, 6.5, 20, 1.2), "direct": figures(3100, 5.0, 18, 1.0)},
        "32": {"gateway": figures(4000, 9, 30, 1), "handrolled": figures(1500, 12, 40, 3)},
    }
    met = streaming.targets_met(levels)
    assert met["ttft_p50_added_ms_at_8"] == 1.5 and met["gateway_adds_at_most_2_ms_ttft"]
    assert met["itl_p50_added_ms_at_8"] == 0.2 and met["gateway_adds_at_most_half_a_ms_itl"]
    assert met["pieces_per_s_ratio_at_32"] == 2.667 and met["twice_the_handrolled_pieces_per_s"]
    assert met["ttft_p99_no_worse"]
    levels["32"]["gateway"] = figures(2000, 9, 50, 1)
    met = streaming.targets_met(levels)
    assert not met["twice_the_handrolled_pieces_per_s"] and not met["ttft_p99_no_worse"]
    assert "floor_gateway_pieces_per_s_ratio_at_32" not in met  # no floor measured, no floor figure
    levels["32"]["floor_gateway"] = figures(2700, 9, 50, 1)
    assert streaming.targets_met(levels)["floor_gateway_pieces_per_s_ratio_at_32"] == 1.8


def test_a_level_whose_streams_all_failed_gives_no_verdict_rather_than_a_crash() -> None:
    failed = {"pieces": 0, "pieces_per_s": 0.0, "ttft_p50_ms": None, "ttft_p99_ms": None, "itl_p50_ms": None}
    assert streaming.targets_met({"8": {"gateway": failed, "direct": failed}}) == {}


def test_a_run_of_some_targets_judges_only_the_clauses_it_measured() -> None:
    """--targets gateway,handrolled at 32 (the TTFT p99 clause alone): no verdict at 8, none needing direct."""
    met = streaming.targets_met({"32": {"gateway": figures(4000, 9, 30, 1), "handrolled": figures(1500, 12, 40, 3)}})
    assert met["ttft_p99_no_worse"] and met["twice_the_handrolled_pieces_per_s"]
    assert "ttft_p50_added_ms_at_8" not in met
    assert streaming.targets_met({"8": {"gateway": figures(3000, 6.5, 20, 1.2)}}) == {}


def test_an_unknown_target_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        streaming.main(["--targets", "gateway,nginx"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "unknown targets nginx" in error and "handrolled" in error
