"""The gateway's CPU per KServe v2 JSON request on its body check, before and after the JSON fast path: the CNN
sample's request (1x3x64x64 FP32 written out by json.dumps, about 253 KB, what bench/serving sends as
e-gateway-json) through the old check (json.loads and gateway/protocol.py), the fast check alone, and the fast
check with the transcoding to the binary tensor extension (gateway/fastpath/json_body.py). CPU time (process_time) per
request, the median of --repeat runs of --requests each, all in one process so that the ratios share the load.

    .venv/bin/python bench/json_path.py                 # ~20 s
    .venv/bin/python bench/json_path.py --requests 200 --repeat 3
    .venv/bin/python bench/json_path.py --nested        # the data as nested lists, as image.tolist() writes them
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway import protocol  # noqa: E402
from gateway.fastpath import json_body  # noqa: E402

MAX_TENSOR = 256 * 1024**2


def cnn_body(nested: bool = False) -> bytes:
    """The request with its data flat (as tritonclient and bench/serving send it) or nested as the shape is (as a
    client's `image.tolist()` writes it: 196 lists, so the depth check walks their brackets)."""
    image = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    data = image.tolist() if nested else image.reshape(-1).tolist()
    return json.dumps({"inputs": [{"name": "image", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                   "data": data}]}).encode()


def old(body: bytes) -> None:
    protocol.check_infer_request(protocol.parse_json_header(body, 64), None, MAX_TENSOR)


def fast(body: bytes) -> None:
    json_body.check_json(body, None, 64, MAX_TENSOR, transcode=False)


def fast_transcoded(body: bytes) -> None:
    checked = json_body.check_json(body, None, 64, MAX_TENSOR, transcode=True)
    assert checked.body is not None


def cpu_ms(function: Callable[[bytes], None], body: bytes, requests: int) -> float:
    function(body)
    started = time.process_time()
    for _ in range(requests):
        function(body)
    return (time.process_time() - started) / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nested", action="store_true", help="send the data as nested lists, not flat")
    args = parser.parse_args()
    body = cnn_body(args.nested)
    load = os.getloadavg()[0]
    paths = {"old: json.loads + checks": old, "fast: simdjson + checks": fast,
             "fast + transcode to binary": fast_transcoded}
    runs: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeat):  # interleaved, so that a change in the machine's load touches every path alike
        for name, function in paths.items():
            runs[name].append(cpu_ms(function, body, args.requests))
    checked = json_body.check_json(body, None, 64, MAX_TENSOR, transcode=True)
    form = "nested" if args.nested else "flat"
    print(f"CNN JSON request ({form} data): {len(body):,} bytes; transcoded: {len(checked.body or b''):,} bytes "
          f"({checked.header_length} of JSON header); load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    base = statistics.median(runs["old: json.loads + checks"])
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"{name:30} {median:6.3f} ms CPU per request (runs {min(values):.3f}-{max(values):.3f}), "
              f"{base / median:5.1f}x the old")


if __name__ == "__main__":
    main()
