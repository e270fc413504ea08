"""A closed-loop HTTP load generator: N concurrent clients, each sends its next request as soon as the previous
answer arrived. Warm-up first, then a fixed measurement window. Runs in its own process so that it does not share
an interpreter (or a GIL) with the server under test.

    python tuning/loadgen.py --url URL --body FILE [--header 'K: V'] --concurrency 16 --duration 10 --warmup 2

Prints one JSON object: requests, errors, throughput (req/s), p50/p95/p99 latency (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summary(concurrency: int, window: float, latencies: list[float], errors: int,
            error_samples: list[Any]) -> dict[str, Any]:
    """One closed-loop run's figures (latencies in seconds), as both load generators (HTTP and gRPC) print them."""
    ms = sorted(v * 1000 for v in latencies)
    return {
        "concurrency": concurrency,
        "duration_s": round(window, 3),
        "requests": len(latencies),
        "errors": errors,
        "error_samples": error_samples,
        "throughput": round(len(latencies) / window, 2) if window else 0.0,
        "p50_ms": percentile(ms, 0.50),
        "p95_ms": percentile(ms, 0.95),
        "p99_ms": percentile(ms, 0.99),
    }


async def run(url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float, warmup: float,
              method: str = "POST") -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    error_samples: list[str] = []
    measuring = False
    stop_at = time.monotonic() + warmup + duration

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                async with session.request(method, url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
                    if not ok and len(error_samples) < 3:
                        error_samples.append(f"{response.status}: {(await response.text())[:200]}")
            except aiohttp.ClientError as exc:
                ok = False
                if len(error_samples) < 3:
                    error_samples.append(repr(exc))
            elapsed = time.perf_counter() - started
            if measuring:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        measuring = True
        window_start = time.monotonic()
        await asyncio.gather(*tasks)
        window = time.monotonic() - window_start
    return summary(concurrency, window, latencies, errors, error_samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--method", default="POST")
    args = parser.parse_args(argv)
    headers = dict(h.split(": ", 1) for h in args.header)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    body = args.body.read_bytes() if args.method not in ("GET", "HEAD") else b""
    result = asyncio.run(run(args.url, body, headers, args.concurrency, args.duration, args.warmup, args.method))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
