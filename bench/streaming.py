"""Streaming answers (issue 33): the sample text generator at 1, 8 and 32 concurrent streams, read as Server-Sent
Events through Modelport's gateway, directly from its Triton, and from a hand-rolled Starlette SSE server running the
same model in-process (bench/streaming_handrolled.py, the seed's kind of baseline).

    .venv/bin/python bench/streaming.py [--streams 1,8,32] [--targets gateway,direct,...] [--duration 10]
                                        [--max-tokens 64] [--output PATH]

A throwaway Modelport (bench/stack.py: its own SQLite, worker and web server, as `make run` starts them) takes the
sample as a user does: the archive `make samples` builds, uploaded with decoupled=true, deployed on a dedicated
Triton. Beside it, the floor (bench/streaming_floor_model.py, deployed the same way): a decoupled model that sends
fixed pieces and computes nothing, through the gateway and direct, so the run says what one response per piece costs
here whatever the model. Each target gets the same closed loop: N clients, each opening a stream, reading it to its
end and opening the next, for --duration seconds after a warm-up. Per target and N: time to first piece (TTFT:
request sent to the first event read), inter-piece time (ITL: between two pieces of one stream), their p50 and p99,
and the aggregate pieces per second. An event may carry several pieces (text_output a list: the sample sends every
piece a stream has ready in one response when its sending fell behind;
models_registry/sample_models/textgen_model.py): the client counts them, and times each by its event's arrival (the
first gets the gap since the last event, the others none); the gaps between events and the events per second are
reported beside. Every request asks for --max-tokens pieces at temperature 0.8 with no stop string, so every stream
is as long on every target. The client is this process (aiohttp), the same for all three, on the same cores as the
servers: compare the targets as ratios within one run.

The targets (docs/benchmarks.md, "Streaming"): the gateway adds at most 2 ms to TTFT p50 and 0.5 ms to ITL p50 over
direct at 8 streams; at 32 streams Modelport's pieces per second are at least 2x the hand-rolled server's (the
model steps every live stream at once, continuous batching) with a TTFT p99 no worse.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEPLOYMENT = "textgen"
MODEL = "textgen"
FLOOR = "floor"  # bench/streaming_floor_model.py: one response per piece and nothing else
# What each level measures, in this order; --targets picks some (one clause of the targets at a time, say).
TARGETS = ("gateway", "direct", "handrolled", "floor_gateway", "floor_direct")
# Every input the sample declares (a model's inputs are all required unless declared optional); the empty stop string
# is ignored by the model, so every stream runs to max_tokens pieces.
REQUEST: dict[str, Any] = {"text_input": "MENENIUS:\n", "temperature": 0.8, "top_p": 1.0, "stream": True, "stop": ""}


@dataclass
class Run:
    """What one target's closed loop measured."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # between two events of one stream
    pieces: int = 0
    events: int = 0
    streams: int = 0
    errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_stream(session: Any, url: str, headers: dict[str, str], body: bytes, run: Run, counting: bool) -> None:
    started = time.perf_counter()
    last = None
    pieces = 0
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            run.errors.append(f"{response.status}: {(await response.text())[:200]}")
            return
        held = b""
        async for chunk in response.content.iter_any():
            held += chunk
            while b"\n\n" in held:
                event, held = held.split(b"\n\n", 1)
                now = time.perf_counter()
                if b'"error"' in event:
                    run.errors.append(event.decode(errors="replace")[:200])
                    return
                # An event may carry several pieces (a list: the model sent what it had when its sending was behind):
                # each is counted, its gap the event's (the first) or nothing (the rest).
                output = json.loads(event[event.index(b"{"):])["text_output"]
                count = len(output) if isinstance(output, list) else 1
                if counting:
                    if last is None:
                        run.ttft.append(now - started)
                    else:
                        run.itl.append(now - last)
                        run.gaps.append(now - last)
                    run.itl.extend([0.0] * (count - 1))
                    run.events += 1
                last = now
                pieces += count
    if counting:
        run.pieces += pieces
        run.streams += 1


async def closed_loop(url: str, headers: dict[str, str], streams: int, duration: float, warmup: float,
                      max_tokens: int) -> dict[str, Any]:
    import aiohttp

    run = Run()
    headers = {**headers, "Content-Type": "application/json"}
    started = time.perf_counter()
    counting_from = started + warmup
    ends = counting_from + duration
    window: list[float] = []

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        seed = index
        while time.perf_counter() < ends:
            seed += streams
            body = json.dumps({**REQUEST, "max_tokens": max_tokens, "seed": seed}).encode()
            opened = time.perf_counter()
            # A stream counts when it opened inside the window; the window closes when the last counted one ends.
            counting = counting_from <= opened < ends
            await one_stream(session, url, headers, body, run, counting)
            if counting:
                window.append(time.perf_counter())

    connector = aiohttp.TCPConnector(limit=streams)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(i, session) for i in range(streams)))
    elapsed = (max(window) - counting_from) if window else duration

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    return {
        "streams": streams, "completed": run.streams, "pieces": run.pieces, "events": run.events,
        "pieces_per_s": round(run.pieces / elapsed, 1) if elapsed > 0 else None,
        "events_per_s": round(run.events / elapsed, 1) if elapsed > 0 else None,
        "ttft_p50_ms": ms(percentile(run.ttft, 0.5)), "ttft_p99_ms": ms(percentile(run.ttft, 0.99)),
        "itl_p50_ms": ms(percentile(run.itl, 0.5)), "itl_p99_ms": ms(percentile(run.itl, 0.99)),
        "event_gap_p50_ms": ms(percentile(run.gaps, 0.5)), "event_gap_p99_ms": ms(percentile(run.gaps, 0.99)),
        "errors": len(run.errors), "first_errors": run.errors[:3],
    }


def deploy_sample(stack: Any, work: Path) -> None:
    from models_registry.samples import TEXTGEN_EXAMPLE_REQUEST, TEXTGEN_SIGNATURE, build_textgen_zip

    archive = work / "textgen.zip"
    archive.write_bytes(build_textgen_zip())
    stack.push(MODEL, archive, TEXTGEN_SIGNATURE.to_json(), decoupled="true",
               example_request=json.dumps(TEXTGEN_EXAMPLE_REQUEST))
    stack.deploy(DEPLOYMENT, [{"model": MODEL, "max_batch_size": 32}])
    floor = work / "floor.zip"
    with zipfile.ZipFile(floor, "w") as floor_zip:
        floor_zip.write(ROOT / "bench" / "streaming_floor_model.py", "model.py")
    stack.push(FLOOR, floor, TEXTGEN_SIGNATURE.to_json(), decoupled="true",
               example_request=json.dumps(TEXTGEN_EXAMPLE_REQUEST))
    stack.deploy(FLOOR, [{"model": FLOOR, "max_batch_size": 32}])


@contextlib.contextmanager
def handrolled_server(weights: Path) -> Any:
    from bench.stack import free_port, wait_for_port

    port = free_port()
    env = {**os.environ, "TEXTGEN_WEIGHTS": str(weights), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.streaming_handrolled:app", "--host",
                                "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
                               cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,8,32", help="concurrent streams, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"what to measure at each level, comma-separated, among {', '.join(TARGETS)}")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per target and level")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "streaming.json")
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.streams.split(",")]
    chosen = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(TARGETS))
    if unknown or not chosen:
        parser.error(f"unknown targets {', '.join(unknown) or '(none given)'}: choose among {', '.join(TARGETS)}")
    from bench.stack import cpu_seconds, running_stack
    from models_registry.samples import train_textgen

    result: dict[str, Any] = {"max_tokens": args.max_tokens, "duration_s": args.duration,
                              "load_average_before": os.getloadavg(), "levels": {}}
    with tempfile.TemporaryDirectory(prefix="streaming-bench-") as tmp, running_stack() as stack:
        work = Path(tmp)
        weights = work / "textgen.npz"
        weights.write_bytes(train_textgen().weights)
        deploy_sample(stack, work)
        path = f"/v2/models/{MODEL}/generate_stream"
        gateway = (f"{stack.url}/serve/{DEPLOYMENT}{path}", stack.headers)
        no_headers: dict[str, str] = {}
        direct = (f"http://127.0.0.1:{stack.triton_port(DEPLOYMENT)}{path}", no_headers)
        floor_path = f"/v2/models/{FLOOR}/generate_stream"
        with handrolled_server(weights) as (handrolled_url, _):
            targets = {"gateway": gateway, "direct": direct, "handrolled": (handrolled_url + path, no_headers),
                       "floor_gateway": (f"{stack.url}/serve/{FLOOR}{floor_path}", stack.headers),
                       "floor_direct": (f"http://127.0.0.1:{stack.triton_port(FLOOR)}{floor_path}", no_headers)}
            for level in levels:
                figures: dict[str, Any] = {}
                for name in chosen:
                    url, headers = targets[name]
                    web_cpu = cpu_seconds(stack.pid("web"))
                    figures[name] = asyncio.run(closed_loop(url, headers, level, args.duration, args.warmup,
                                                            args.max_tokens))
                    if name in ("gateway", "floor_gateway") and figures[name]["pieces"]:
                        spent = cpu_seconds(stack.pid("web")) - web_cpu
                        figures[name]["gateway_cpu_us_per_piece"] = round(spent / figures[name]["pieces"] * 1e6, 1)
                    print(f"{level:>3} streams {name:>10}: {json.dumps(figures[name])}", flush=True)
                result["levels"][str(level)] = figures
    result["load_average_after"] = os.getloadavg()
    result["targets"] = targets_met(result["levels"])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["targets"], indent=2))
    return 0


def targets_met(levels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    met: dict[str, Any] = {}
    eight = levels.get("8")
    if eight and all(eight.get(t, {}).get("pieces") for t in ("gateway", "direct")):
        g, d = eight["gateway"], eight["direct"]
        met["ttft_p50_added_ms_at_8"] = round(g["ttft_p50_ms"] - d["ttft_p50_ms"], 3)
        met["itl_p50_added_ms_at_8"] = round(g["itl_p50_ms"] - d["itl_p50_ms"], 3)
        met["gateway_adds_at_most_2_ms_ttft"] = met["ttft_p50_added_ms_at_8"] <= 2.0
        met["gateway_adds_at_most_half_a_ms_itl"] = met["itl_p50_added_ms_at_8"] <= 0.5
        # Between two events (the model sends several pieces in one when its sending fell behind: the gap per piece
        # is then mostly nothing), the stricter reading of the same target.
        met["event_gap_p50_added_ms_at_8"] = round(g["event_gap_p50_ms"] - d["event_gap_p50_ms"], 3)
    top = levels.get("32")
    if top and all(top.get(t, {}).get("pieces") for t in ("gateway", "handrolled")):
        g, h = top["gateway"], top["handrolled"]
        met["pieces_per_s_ratio_at_32"] = round(g["pieces_per_s"] / h["pieces_per_s"], 3)
        met["twice_the_handrolled_pieces_per_s"] = met["pieces_per_s_ratio_at_32"] >= 2.0
        met["ttft_p99_no_worse"] = g["ttft_p99_ms"] <= h["ttft_p99_ms"]
        if top.get("floor_gateway", {}).get("pieces"):
            # The most any python-backend model could stream here through the gateway, against the same bar.
            met["floor_gateway_pieces_per_s_ratio_at_32"] = round(
                top["floor_gateway"]["pieces_per_s"] / h["pieces_per_s"], 3)
    return met


if __name__ == "__main__":
    sys.exit(main())
