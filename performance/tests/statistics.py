"""Triton's /v2/models/stats rows as Triton 2.51 writes them, for the performance tests."""

from __future__ import annotations

from typing import Any


def triton_row(name: str, n: int, *, queue_ns: int = 0, infer_ns: int = 0, fail: int = 0,
               batches: dict[int, int] | None = None) -> dict[str, Any]:
    """A /v2/models/stats row of `name` after `n` successful requests, as Triton 2.51 writes it."""
    batches = batches if batches is not None else {1: n}
    per = {"count": n, "ns": 0}
    return {
        "name": name, "version": "1", "last_inference": 0, "inference_count": n,
        "execution_count": sum(batches.values()),
        "inference_stats": {"success": {"count": n, "ns": queue_ns + infer_ns + 3_000 * n},
                            "fail": {"count": fail, "ns": 0}, "queue": {"count": n, "ns": queue_ns},
                            "compute_input": {**per, "ns": 1_000 * n},
                            "compute_infer": {"count": n, "ns": infer_ns},
                            "compute_output": {**per, "ns": 2_000 * n},
                            "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
        "batch_stats": [{"batch_size": size, "compute_input": {"count": c, "ns": 0},
                         "compute_infer": {"count": c, "ns": 0}, "compute_output": {"count": c, "ns": 0}}
                        for size, c in batches.items()],
    }
