"""Per-token rate limiting: a token bucket per API token, in the gateway process."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate  # requests per second; 0 turns limiting off
        self.burst = max(1, burst)
        self.buckets: dict[int, _Bucket] = {}

    def check(self, key: int) -> float:
        """0 when the request may go ahead, else the seconds to wait before the next one would."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) > 100_000:
                self.buckets.clear()
            bucket = self.buckets[key] = _Bucket(tokens=float(self.burst), updated=now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
