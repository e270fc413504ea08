"""A stream's figures (issue 33): time to first piece (TTFT: from the request's arrival at the gateway to the first
piece handed to the caller's connection), time between pieces (ITL), pieces, streams in flight, and how each stream
ended (complete, cancelled by the caller, or ended by a bound, by reason).

One `StreamFigures` per stream, whatever carries it (HTTP's /generate_stream relay, the OpenAI-compatible API's
streamed answers, gRPC's decoupled ModelStreamInfer): `piece(nbytes)` after each piece is handed on, `ended(reason)`
once at the end. It is on the event loop every team shares, once per piece, so a piece costs a clock read (none
when the caller passes the one it read), a bisect into a list kept for the stream's life and two additions, and
allocates nothing: about half a microsecond of CPU per piece through the relay (1.6 to 2.4 us a piece before, 2.3
to 2.8 with the figures and the bounds, 200,000 pieces through gateway/events.py's relay on this 2-core machine),
where a Prometheus observation alone took 1.3 us (prometheus_client 0.26 takes a lock and walks its buckets). The
counts reach Prometheus (a collector that reads them at scrape time) and the per-deployment time buckets (the stats
API, the page) when the stats collector takes them (`fold`, every flush, 5 s) and at the stream's end.

For the other streaming paths: make one with `StatsCollector.stream(deployment id, team, name, revision, arrival,
model)` (arrival: time.perf_counter() when the request reached the gateway; model: its label, as for `observe`),
call `piece()` as each piece leaves, and `ended(reason)` in a `finally` (CANCELLED when the caller went away or the
task was cancelled).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.models import LATENCY_BUCKETS_MS

# How a stream ended: the first two are no bound's doing; the rest are the bounds of docs/security.md's "Stream
# bounds", and the upstream's failures. A fixed set: they label a Prometheus series.
COMPLETE = "complete"
CANCELLED = "cancelled"  # the caller went away (counted 499)
IDLE = "idle"  # GATEWAY_STREAM_IDLE_SECONDS
LENGTH_SECONDS = "length_seconds"  # GATEWAY_MAX_STREAM_SECONDS
LENGTH_BYTES = "length_bytes"  # GATEWAY_MAX_STREAM_BYTES
SLOW_READER = "slow_reader"  # GATEWAY_STREAM_SEND_SECONDS
TOO_LARGE = "too_large"  # a piece over GATEWAY_MAX_RESPONSE_BYTES
MODEL_ERROR = "model_error"  # the model's error event ended it
UPSTREAM = "upstream"  # Triton broke the connection or cut a piece
BOUNDS = (IDLE, LENGTH_SECONDS, LENGTH_BYTES, SLOW_READER, TOO_LARGE)
REASONS = (COMPLETE, CANCELLED, *BOUNDS, MODEL_ERROR, UPSTREAM)

_BOUNDS_S = tuple(b / 1000.0 for b in LATENCY_BUCKETS_MS)  # the stored buckets, in seconds (inf stays inf)
_LE = [("+Inf" if b == float("inf") else repr(b)) for b in _BOUNDS_S]
_LABELS = ["team", "deployment", "revision"]
FIRST_PIECE = "modelport_gateway_stream_first_piece_seconds"
PIECE_GAP = "modelport_gateway_stream_piece_gap_seconds"
PIECES = Counter("modelport_gateway_stream_pieces_total", "Pieces of streams sent", _LABELS)
STREAMS_IN_FLIGHT = Gauge("modelport_gateway_streams_in_flight", "Streams open through the gateway", _LABELS)
STREAMS_ENDED = Counter("modelport_gateway_streams_ended_total",
                        "Streams ended, by how: complete, cancelled (the caller went away) or a bound's reason",
                        [*_LABELS, "reason"])


class _Children:
    """One label set's series: its Prometheus children (labels() takes a lock and builds a key: done once per label
    set), and the TTFT and ITL histograms folded so far, which `_Histograms` shows at scrape time."""

    __slots__ = ("labels", "pieces", "in_flight", "ended", "first", "first_sum", "gaps", "gap_sum")

    def __init__(self, team: str, deployment: str, revision: str) -> None:
        self.labels = (team, deployment, revision)
        self.pieces = PIECES.labels(team, deployment, revision)
        self.in_flight = STREAMS_IN_FLIGHT.labels(team, deployment, revision)
        self.ended: dict[str, Any] = {}
        self.first = [0] * len(LATENCY_BUCKETS_MS)
        self.first_sum = 0.0
        self.gaps = [0] * len(LATENCY_BUCKETS_MS)
        self.gap_sum = 0.0

    def ended_counter(self, reason: str) -> Any:
        counter = self.ended.get(reason)
        if counter is None:
            counter = self.ended[reason] = STREAMS_ENDED.labels(*self.labels, reason)
        return counter

    def add(self, counts: StreamCounts) -> None:
        if counts.pieces:
            self.pieces.inc(counts.pieces)
        _add_into(self.first, counts.first)
        _add_into(self.gaps, counts.gaps)
        self.first_sum += counts.first_sum
        self.gap_sum += counts.gap_sum


_SERIES: dict[tuple[str, str, str], _Children] = {}


def series_of(team: str, deployment: str, revision: int) -> _Children:
    """The series of one label set, made once per process."""
    found = _SERIES.get((team, deployment, str(revision)))
    if found is None:
        found = _SERIES[(team, deployment, str(revision))] = _Children(team, deployment, str(revision))
    return found


class _Histograms(Collector):
    """TTFT and ITL as Prometheus histograms, built from the folded counts when scraped."""

    def collect(self) -> Any:
        first = HistogramMetricFamily(FIRST_PIECE, "Time to first piece: from a stream request's arrival at the "
                                                   "gateway to its first piece sent", labels=_LABELS)
        gaps = HistogramMetricFamily(PIECE_GAP, "Time between two pieces of a stream sent", labels=_LABELS)
        for series in list(_SERIES.values()):
            first.add_metric(list(series.labels), _cumulative(series.first), series.first_sum)
            gaps.add_metric(list(series.labels), _cumulative(series.gaps), series.gap_sum)
        yield first
        yield gaps

    def describe(self) -> Any:
        return []


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    out = []
    seen = 0
    for le, count in zip(_LE, counts, strict=True):
        seen += count
        out.append((le, float(seen)))
    return out


def _add_into(into: list[int], counts: list[int]) -> None:
    for index, count in enumerate(counts):
        if count:
            into[index] += count


REGISTRY.register(_Histograms())


class StreamSink(Protocol):
    """Where a stream's counts go (gateway.stats.StatsCollector)."""

    def stream_ended(self, figures: StreamFigures) -> None: ...


class StreamCounts:
    """What a stream adds to a time bucket: kept per stream between two folds, added to the bucket at each."""

    __slots__ = ("streams", "pieces", "seconds", "first", "gaps", "first_sum", "gap_sum", "ends")

    def __init__(self) -> None:
        self.streams = 0  # streams ended
        self.pieces = 0
        self.seconds = 0.0  # stream-seconds open (their sum over a window / the window: the mean in flight)
        self.first = [0] * len(LATENCY_BUCKETS_MS)  # TTFT, counts per LATENCY_BUCKETS_MS entry
        self.gaps = [0] * len(LATENCY_BUCKETS_MS)  # ITL, the same
        self.first_sum = 0.0  # seconds, for Prometheus' _sum
        self.gap_sum = 0.0
        self.ends: dict[str, int] = {}

    def add(self, other: StreamCounts) -> None:
        self.streams += other.streams
        self.pieces += other.pieces
        self.seconds += other.seconds
        self.first_sum += other.first_sum
        self.gap_sum += other.gap_sum
        _add_into(self.first, other.first)
        _add_into(self.gaps, other.gaps)
        for reason, count in other.ends.items():
            self.ends[reason] = self.ends.get(reason, 0) + count


class StreamFigures:
    """One stream's measurement; `clock` is time.perf_counter (the gateway's request clock) unless a test fakes
    it. `arrived`: when the request reached the gateway, on that clock."""

    __slots__ = ("sink", "deployment_id", "revision", "model", "clock", "arrived", "last", "folded_at", "counts",
                 "reason", "_children")

    def __init__(self, sink: StreamSink | None, deployment_id: int, team: str, deployment: str, revision: int,
                 arrived: float, clock: Callable[[], float] = time.perf_counter, model: str = "") -> None:
        self.sink = sink
        self.deployment_id = deployment_id
        self.revision = revision
        self.model = model  # the stored rows' model key (gateway/stats.py model_key): not a Prometheus label
        self.clock = clock
        self.arrived = arrived
        self.last: float | None = None  # when the last piece went
        self.folded_at = clock()
        self.counts = StreamCounts()
        self.reason: str | None = None
        self._children = series_of(team, deployment, revision)
        self._children.in_flight.inc()

    @property
    def pieces(self) -> int:
        """Pieces sent since the last fold (all of them when nothing took the counts yet)."""
        return self.counts.pieces

    def piece(self, nbytes: int = 0, now: float | None = None) -> None:
        """A piece was handed to the caller's connection (`now`: when, on the clock, if the caller read it).
        `nbytes` is for the caller's own byte bound; the figures count pieces."""
        if now is None:
            now = self.clock()
        last = self.last
        counts = self.counts
        if last is None:
            first = now - self.arrived
            counts.first[bisect.bisect_left(_BOUNDS_S, first)] += 1
            counts.first_sum += first
        else:
            gap = now - last
            counts.gaps[bisect.bisect_left(_BOUNDS_S, gap)] += 1
            counts.gap_sum += gap
        self.last = now
        counts.pieces += 1

    def fold(self, now: float | None = None) -> StreamCounts:
        """The counts since the last fold (the stream's seconds up to `now` included), and a fresh start."""
        if now is None:
            now = self.clock()
        taken, self.counts = self.counts, StreamCounts()
        taken.seconds += now - self.folded_at
        self.folded_at = now
        self._children.add(taken)
        return taken

    def ended(self, reason: str) -> None:
        """The stream is over (once; later calls are ignored): counted by `reason` (one of REASONS)."""
        if self.reason is not None:
            return
        self.reason = reason
        self._children.in_flight.dec()
        self._children.ended_counter(reason).inc()
        self.counts.streams += 1
        self.counts.ends[reason] = self.counts.ends.get(reason, 0) + 1
        if self.sink is not None:
            self.sink.stream_ended(self)
