"""A closed-loop gRPC load generator: N concurrent callers of ModelInfer on one channel (one HTTP/2 connection,
as a tritonclient.grpc program makes), each sending its next request as soon as the previous answer arrived.
Warm-up first, then a fixed measurement window; its own process, as tuning/loadgen.py.

    python bench/grpc_loadgen.py --target HOST:PORT --body FILE [--metadata 'k: v'] --concurrency 16 --duration 10

FILE holds a serialized ModelInferRequest (sent as it is, no client-side encoding per call). Prints one JSON
object: requests, errors, throughput (req/s), p50/p95/p99 latency (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuning.loadgen import summary  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


async def run(target: str, body: bytes, metadata: list[tuple[str, str]], concurrency: int, duration: float,
              warmup: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    error_samples: list[str] = []
    measuring = False
    stop_at = time.monotonic() + warmup + duration
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    async with grpc.aio.insecure_channel(target, options=options) as channel:
        infer = channel.unary_unary(METHOD)

        async def client() -> None:
            nonlocal errors
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    await infer(body, metadata=metadata, timeout=60)
                    ok = True
                except grpc.aio.AioRpcError as exc:
                    ok = False
                    if len(error_samples) < 3:
                        error_samples.append(f"{exc.code().name}: {(exc.details() or '')[:200]}")
                elapsed = time.perf_counter() - started
                if measuring:
                    if ok:
                        latencies.append(elapsed)
                    else:
                        errors += 1

        tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        measuring = True
        window_start = time.monotonic()
        await asyncio.gather(*tasks)
        window = time.monotonic() - window_start
    return summary(concurrency, window, latencies, errors, error_samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--metadata", action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args(argv)
    metadata = [tuple(item.split(": ", 1)) for item in args.metadata]
    result = asyncio.run(run(args.target, args.body.read_bytes(), metadata,  # type: ignore[arg-type]
                             args.concurrency, args.duration, args.warmup))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
