"""A stream's figures (gateway/stream_figures.py) on a fake clock: TTFT from the request's arrival, the gaps between
pieces, the pieces, the streams in flight and how each ended, into Prometheus and into the time buckets the stats
API and the page read (gateway/stats.py)."""

from __future__ import annotations

import secrets
from datetime import timedelta

from prometheus_client import REGISTRY

from gateway import stats, stream_figures
from gateway.models import RequestStats
from gateway.stream_figures import StreamFigures


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(name: str, team: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"team": team, "deployment": "chat", "revision": "3", **labels})


def test_the_first_piece_is_timed_from_the_arrival_and_each_later_one_from_the_piece_before() -> None:
    team = secrets.token_hex(4)
    clock = Clock()
    figures = StreamFigures(None, 1, team, "chat", 3, arrived=clock.now, clock=clock)
    assert sample("modelport_gateway_streams_in_flight", team) == 1
    clock.now += 0.040
    figures.piece(10)
    for gap in (0.002, 0.004, 0.3):
        clock.now += gap
        figures.piece(10)
    counts = figures.counts
    # 40 ms lies in the (30, 50] ms bucket; 2 ms in (1, 2], 4 ms in (3, 5], 300 ms in (200, 300].
    assert [stats.LATENCY_BUCKETS_MS[i] for i, c in enumerate(counts.first) if c] == [50]
    assert [stats.LATENCY_BUCKETS_MS[i] for i, c in enumerate(counts.gaps) if c] == [2, 5, 300]
    assert counts.pieces == 4
    assert sample("modelport_gateway_stream_first_piece_seconds_count", team) == 0  # nothing taken yet
    figures.fold()
    assert sample("modelport_gateway_stream_first_piece_seconds_count", team) == 1
    assert round(sample("modelport_gateway_stream_first_piece_seconds_sum", team) or 0, 6) == 0.04
    assert sample("modelport_gateway_stream_piece_gap_seconds_count", team) == 3
    assert sample("modelport_gateway_stream_piece_gap_seconds_bucket", team, le="0.005") == 2


def test_a_fold_takes_the_counts_and_the_seconds_open_so_far_and_the_end_is_counted_once() -> None:
    team = secrets.token_hex(4)
    clock = Clock()
    figures = StreamFigures(None, 1, team, "chat", 3, arrived=clock.now, clock=clock)
    clock.now += 1.5
    figures.piece(5)
    figures.piece(5)
    taken = figures.fold()
    assert (taken.pieces, taken.streams, taken.seconds) == (2, 0, 1.5)
    assert sample("modelport_gateway_stream_pieces_total", team) == 2  # counted into Prometheus at the fold
    clock.now += 0.5
    figures.ended(stream_figures.SLOW_READER)
    figures.ended(stream_figures.COMPLETE)  # ignored: a stream ends once
    rest = figures.fold()
    assert (rest.pieces, rest.streams, rest.seconds, rest.ends) == (0, 1, 0.5, {"slow_reader": 1})
    assert sample("modelport_gateway_streams_in_flight", team) == 0
    assert sample("modelport_gateway_streams_ended_total", team, reason="slow_reader") == 1
    assert sample("modelport_gateway_streams_ended_total", team, reason="complete") is None


def test_the_collector_folds_open_streams_into_each_take_and_an_ended_one_into_the_bucket_of_its_end() -> None:
    collector = stats.StatsCollector()
    team = secrets.token_hex(4)
    figures = collector.stream(7, team, "chat", 3, arrived=0.0)
    figures.piece(1, now=0.01)
    figures.piece(1, now=0.02)
    assert collector.live == {figures}
    ((key, bucket),) = collector.take().items()
    assert key[:2] == (7, 3) and bucket.streams.pieces == 2 and bucket.streams.streams == 0
    figures.piece(1, now=0.03)
    figures.ended(stream_figures.CANCELLED)
    assert collector.live == set()
    ((_, bucket),) = collector.take().items()
    assert (bucket.streams.pieces, bucket.streams.streams, bucket.streams.ends) == (1, 1, {"cancelled": 1})
    assert sum(bucket.streams.gaps) == 1 and sum(bucket.streams.first) == 0
    assert collector.take() == {}


def test_the_summary_gives_percentiles_rates_the_mean_in_flight_and_the_endings_by_bound() -> None:
    counts = stream_figures.StreamCounts()
    counts.first[stats.LATENCY_BUCKETS_MS.index(50)] = 10
    counts.gaps[stats.LATENCY_BUCKETS_MS.index(5)] = 90
    counts.streams, counts.pieces, counts.seconds = 10, 100, 300.0
    counts.ends = {"complete": 6, "cancelled": 2, "idle": 1, "slow_reader": 1}
    rows = [RequestStats(revision=3, **stats._stream_fields(counts)), RequestStats(revision=3)]
    summary = stats.stream_summary(rows, timedelta(minutes=5))
    assert summary["streams"] == 10 and summary["pieces"] == 100
    assert summary["pieces_per_second"] == round(100 / 300, 3) and summary["in_flight"] == 1.0
    assert 30 < summary["ttft_p50_ms"] <= summary["ttft_p99_ms"] <= 50
    assert 3 < summary["itl_p50_ms"] <= summary["itl_p95_ms"] <= summary["itl_p99_ms"] <= 5
    assert summary["cancelled"] == 2
    assert summary["ended_by"] == {"idle": 1, "length_seconds": 0, "length_bytes": 0, "slow_reader": 1,
                                   "too_large": 0}
    empty = stats.stream_summary([], timedelta(minutes=5))
    assert empty["ttft_p50_ms"] is None and empty["itl_p99_ms"] is None and empty["pieces_per_second"] == 0
