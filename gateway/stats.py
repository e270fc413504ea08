"""Request counting: Prometheus metrics for scraping, and per-deployment (and per-revision: a canary and its stable
revision apart; and per model called, for the performance panel) time buckets written to the database every few
seconds for the UI's request rate and latency percentiles, and for a canary's guardrails (deployments/canary.py),
which read them from there, whichever gateway process counted them."""

from __future__ import annotations

import bisect
import hmac
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from accounts.tokens import parse_bearer
from gateway.models import LATENCY_BUCKETS_MS, MODEL_KEY_MAX
from gateway.stream_figures import BOUNDS, CANCELLED, StreamCounts, StreamFigures

if TYPE_CHECKING:
    from gateway.models import RequestStats

log = logging.getLogger(__name__)

BUCKET_SECONDS = 10

# The Prometheus label of a request for a model the deployment lacks: one series for every such name.
OTHER_MODEL = "(other)"

# A time bucket's key: deployment id, revision number, model key (model_key), bucket start.
Key = tuple[int, int, str, datetime]

# A deployment's name is unique within its team only: every series is labelled by both, so two teams' "prod"
# deployments never add up into one. `revision`: the number of the revision that answered ("0": none was chosen),
# so that a canary's series and its stable revision's stay apart (platform/observability's dashboards).
REQUESTS = Counter("modelport_gateway_requests_total", "Requests proxied by the gateway",
                   ["team", "deployment", "revision", "model", "code"])
LATENCY = Histogram("modelport_gateway_request_duration_seconds", "Gateway request latency, upstream included",
                    ["team", "deployment", "revision", "model"],
                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
IN_FLIGHT = Gauge("modelport_gateway_in_flight_requests", "Requests in flight through the gateway",
                  ["team", "deployment"])

CLOSED_MESSAGE = ("/metrics is closed: an operator opens it with METRICS_TOKEN (scrapers send "
                  "'Authorization: Bearer <METRICS_TOKEN>') or, on a network only operators reach, METRICS_OPEN=true\n")
TOKEN_MESSAGE = "metrics need 'Authorization: Bearer <METRICS_TOKEN>'\n"


def scrape_refusal(authorization: str | None, token: str, is_open: bool) -> tuple[int, str] | None:
    """Why a scrape with this Authorization header is refused ((status, message)), or None to serve it. The
    metrics name every team's deployments and their traffic, so they are closed unless the operator set a token
    (then it is required, whatever METRICS_OPEN says) or opened them explicitly."""
    if token:
        raw = parse_bearer(authorization)
        if raw is None or not hmac.compare_digest(raw.encode(), token.encode()):
            return 401, TOKEN_MESSAGE
        return None
    return None if is_open else (403, CLOSED_MESSAGE)


def is_error(code: int) -> bool:
    """What the error rate counts: the server's failures and refusals for load (5xx, 429); a 4xx is the caller's
    mistake and shows in the status codes."""
    return code >= 500 or code == 429


def merge_codes(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int]:
    merged = dict(a or {})
    for code, count in (b or {}).items():
        merged[code] = merged.get(code, 0) + int(count)
    return merged


def model_key(model: str) -> str:
    """The model a request is stored under: the label the gateway gave it (the model's name when the deployment has
    that model, OTHER_MODEL or "" otherwise: gateway/app.py's and grpc_app.py's _model_label), OTHER_MODEL as ""
    (a name the deployment lacks adds no key of its own), and never a name longer than a model's can be."""
    if model == OTHER_MODEL or len(model) > MODEL_KEY_MAX:
        return ""
    return model


@dataclass
class _Bucket:
    requests: int = 0
    errors: int = 0
    latency_sum_ms: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_MS))
    codes: dict[str, int] = field(default_factory=dict)
    streams: StreamCounts = field(default_factory=StreamCounts)


class StatsCollector:
    def __init__(self) -> None:
        # (deployment id, revision number, model key, bucket start) -> counts
        self.pending: dict[Key, _Bucket] = defaultdict(_Bucket)
        # Prometheus' labels() takes a lock and builds a key each time: keep the children per label set.
        self.counters: dict[tuple[str, str, int, str, int], Any] = {}
        self.histograms: dict[tuple[str, str, int, str], Any] = {}
        self.gauges: dict[tuple[str, str], Any] = {}
        self.live: set[StreamFigures] = set()  # streams open, whose counts each take() folds in

    def stream(self, deployment_id: int, team: str, name: str, revision: int, arrived: float,
               model: str = "") -> StreamFigures:
        """The figures of a stream of deployment `name` of `team` answered by `revision`, which arrived at
        `arrived` (time.perf_counter()); it is counted in flight until its `ended()`. `model`: its label, as
        `observe` takes it (its figures are stored beside its requests')."""
        figures = StreamFigures(self, deployment_id, team, name, revision, arrived, model=model_key(model))
        self.live.add(figures)
        return figures

    def stream_ended(self, figures: StreamFigures) -> None:
        self.live.discard(figures)
        self._add_stream(figures)

    def _add_stream(self, figures: StreamFigures) -> None:
        now = time.time()
        start = datetime.fromtimestamp(now - now % BUCKET_SECONDS, UTC)
        self.pending[(figures.deployment_id, figures.revision, figures.model, start)].streams.add(figures.fold())

    def in_flight(self, team: str, name: str) -> Any:
        """The in-flight gauge of deployment `name` of `team` (its child, kept like the counters')."""
        gauge = self.gauges.get((team, name))
        if gauge is None:
            gauge = self.gauges[(team, name)] = IN_FLIGHT.labels(team, name)
        return gauge

    def observe(self, deployment_id: int, team: str, name: str, model: str, code: int, seconds: float,
                revision: int = 0) -> None:
        """One answer of deployment `name` of `team`; `model`: its label (the deployment's model called, OTHER_MODEL
        for a name it lacks, "" for none); `revision`: the number of the revision that answered (0: none was
        chosen)."""
        counter = self.counters.get((team, name, revision, model, code))
        if counter is None:
            counter = self.counters[(team, name, revision, model, code)] = REQUESTS.labels(
                team, name, str(revision), model, str(code))
        histogram = self.histograms.get((team, name, revision, model))
        if histogram is None:
            histogram = self.histograms[(team, name, revision, model)] = LATENCY.labels(
                team, name, str(revision), model)
        counter.inc()
        histogram.observe(seconds)
        now = time.time()
        start = datetime.fromtimestamp(now - now % BUCKET_SECONDS, UTC)
        bucket = self.pending[(deployment_id, revision, model_key(model), start)]
        bucket.requests += 1
        bucket.codes[str(code)] = bucket.codes.get(str(code), 0) + 1
        if is_error(code):
            bucket.errors += 1
        ms = seconds * 1000.0
        bucket.latency_sum_ms += ms
        bucket.histogram[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1

    def take(self) -> dict[Key, _Bucket]:
        for figures in self.live:
            self._add_stream(figures)  # a long stream's pieces so far, and its seconds open
        taken, self.pending = self.pending, defaultdict(_Bucket)
        return taken


def flush(buckets: dict[Key, _Bucket]) -> None:
    """Add the buckets to the database (runs in a thread; rows of deleted deployments are skipped). A flush takes a
    fixed number of queries however many keys it holds (a row per deployment, revision, model and bucket): the rows
    already there read and locked at once, the new ones inserted at once, the others updated at once. Another gateway
    process that inserted one of the keys meanwhile makes the insert fail: the whole flush is tried again, and merges
    into its row."""
    from django.db import IntegrityError

    from deployments.models import Deployment

    alive = set(Deployment.objects.filter(pk__in={key[0] for key in buckets}).values_list("pk", flat=True))
    kept = {key: bucket for key, bucket in buckets.items() if key[0] in alive}
    if not kept:
        return
    for attempt in range(3):
        try:
            _write(kept)
            return
        except IntegrityError:
            if attempt == 2:
                raise


def _write(buckets: dict[Key, _Bucket]) -> None:
    from django.db import transaction

    from gateway.models import RequestStats

    with transaction.atomic():
        # Locked in the primary key's order, as every gateway process locks them: two may wait, never on each other.
        found = {(row.deployment_id, row.revision, row.model, row.bucket_start): row
                 for row in RequestStats.objects.select_for_update().filter(
                     deployment_id__in={key[0] for key in buckets},
                     bucket_start__in={key[3] for key in buckets}).order_by("pk")}
        new, changed = [], []
        # In the keys' order too: two processes inserting the same new keys wait on the first they share.
        for key in sorted(buckets, key=lambda k: (k[0], k[1], k[2], k[3])):
            bucket = buckets[key]
            row = found.get(key)
            if row is None:
                new.append(RequestStats(deployment_id=key[0], revision=key[1], model=key[2], bucket_start=key[3],
                                        requests=bucket.requests, errors=bucket.errors,
                                        latency_sum_ms=bucket.latency_sum_ms, latency_histogram=bucket.histogram,
                                        codes=bucket.codes, **_stream_fields(bucket.streams)))
            else:
                _merge_into(row, bucket)
                changed.append(row)
        if new:
            RequestStats.objects.bulk_create(new)
        if changed:
            RequestStats.objects.bulk_update(changed, _MERGED_FIELDS)


_MERGED_FIELDS = ["requests", "errors", "latency_sum_ms", "latency_histogram", "codes", "streams", "stream_pieces",
                  "stream_seconds", "first_piece_histogram", "piece_gap_histogram", "stream_ends"]


def _merge_into(row: RequestStats, bucket: _Bucket) -> None:
    """Add the bucket's counts to its row, read under the row's lock (so no other process adds to it meanwhile)."""
    row.requests += bucket.requests
    row.errors += bucket.errors
    row.latency_sum_ms += bucket.latency_sum_ms
    row.latency_histogram = _add_lists(row.latency_histogram, bucket.histogram)
    row.codes = merge_codes(row.codes, bucket.codes)
    counts = bucket.streams
    if counts.streams or counts.pieces or counts.seconds:
        row.streams += counts.streams
        row.stream_pieces += counts.pieces
        row.stream_seconds += counts.seconds
        row.first_piece_histogram = _add_lists(row.first_piece_histogram, counts.first)
        row.piece_gap_histogram = _add_lists(row.piece_gap_histogram, counts.gaps)
        row.stream_ends = merge_codes(row.stream_ends, counts.ends)


def _stream_fields(counts: StreamCounts) -> dict[str, Any]:
    return {"streams": counts.streams, "stream_pieces": counts.pieces, "stream_seconds": counts.seconds,
            "first_piece_histogram": counts.first, "piece_gap_histogram": counts.gaps, "stream_ends": counts.ends}


def _add_lists(a: list[int] | None, b: list[int]) -> list[int]:
    if not a:
        return list(b)
    return [x + y for x, y in zip(a, b, strict=False)]


def percentile_ms(histogram: list[int], q: float) -> float | None:
    """The q-quantile (0..1) of a bucketed histogram, interpolated linearly inside its bucket."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(histogram):
        if count and seen + count >= rank:
            lower = LATENCY_BUCKETS_MS[index - 1] if index else 0.0
            upper = LATENCY_BUCKETS_MS[index]
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - seen) / count)
        seen += count
    return LATENCY_BUCKETS_MS[-2]


# --- Summaries of the stored rows: the API's and the pages' traffic, and a canary's guardrails ------------------


def summarize(rows: list[RequestStats], window: timedelta) -> dict[str, Any]:
    """Totals and a series over the rows (of every revision: rows of one bucket are added up)."""
    total = [0] * len(LATENCY_BUCKETS_MS)
    requests = errors = 0
    codes: dict[str, int] = {}
    by_bucket: dict[Any, tuple[int, int, list[int], dict[str, int]]] = {}
    for row in sorted(rows, key=lambda r: r.bucket_start):
        codes = merge_codes(codes, row.codes)
        histogram = row.latency_histogram or [0] * len(LATENCY_BUCKETS_MS)
        total = [a + b for a, b in zip(total, histogram, strict=False)]
        requests += row.requests
        errors += row.errors
        seen = by_bucket.get(row.bucket_start)
        if seen is not None:
            histogram = [a + b for a, b in zip(seen[2], histogram, strict=False)]
        by_bucket[row.bucket_start] = ((seen[0] if seen else 0) + row.requests, (seen[1] if seen else 0) + row.errors,
                                       histogram, merge_codes(seen[3] if seen else None, row.codes))
    series = [{
        "time": start.isoformat(),
        "requests": count,
        "errors": failed,
        "error_rate": round(failed / count, 4) if count else None,
        "codes": dict(sorted(bucket_codes.items())),
        "requests_per_second": round(count / BUCKET_SECONDS, 3),
        "p50_ms": _round(percentile_ms(histogram, 0.50)),
        "p99_ms": _round(percentile_ms(histogram, 0.99)),
    } for start, (count, failed, histogram, bucket_codes) in by_bucket.items()]
    return {
        "window_seconds": int(window.total_seconds()),
        "requests": requests,
        "errors": errors,
        "error_rate": round(errors / requests, 4) if requests else None,
        "codes": dict(sorted(codes.items())),
        "requests_per_second": round(requests / window.total_seconds(), 3),
        "p50_ms": _round(percentile_ms(total, 0.50)),
        "p95_ms": _round(percentile_ms(total, 0.95)),
        "p99_ms": _round(percentile_ms(total, 0.99)),
        "bucket_seconds": BUCKET_SECONDS,
        "series": series,
    }


def stream_summary(rows: list[RequestStats], window: timedelta) -> dict[str, Any]:
    """A streaming deployment's figures over the rows: TTFT and ITL percentiles, pieces per second, the mean number
    of streams open, and how many ended cancelled or by a bound (by reason)."""
    first = [0] * len(LATENCY_BUCKETS_MS)
    gaps = [0] * len(LATENCY_BUCKETS_MS)
    streams = pieces = 0
    seconds = 0.0
    ends: dict[str, int] = {}
    for row in rows:
        if row.first_piece_histogram:
            first = _add_lists(first, row.first_piece_histogram)
        if row.piece_gap_histogram:
            gaps = _add_lists(gaps, row.piece_gap_histogram)
        streams += row.streams
        pieces += row.stream_pieces
        seconds += row.stream_seconds
        ends = merge_codes(ends, row.stream_ends)
    span = window.total_seconds()
    return {
        "streams": streams,
        "pieces": pieces,
        "pieces_per_second": round(pieces / span, 3),
        "in_flight": round(seconds / span, 3),
        "ttft_p50_ms": _round(percentile_ms(first, 0.50)),
        "ttft_p95_ms": _round(percentile_ms(first, 0.95)),
        "ttft_p99_ms": _round(percentile_ms(first, 0.99)),
        "itl_p50_ms": _round(percentile_ms(gaps, 0.50)),
        "itl_p95_ms": _round(percentile_ms(gaps, 0.95)),
        "itl_p99_ms": _round(percentile_ms(gaps, 0.99)),
        "cancelled": ends.get(CANCELLED, 0),
        "ended_by": {reason: ends.get(reason, 0) for reason in BOUNDS},
    }


def by_revision(rows: list[RequestStats], window: timedelta) -> dict[str, dict[str, Any]]:
    """{revision number: its requests, errors, error rate, rate, p50/p99 and stream figures} for the revisions that
    answered."""
    grouped: dict[int, list[RequestStats]] = {}
    for row in rows:
        if row.revision:
            grouped.setdefault(row.revision, []).append(row)
    keys = ["requests", "errors", "error_rate", "requests_per_second", "p50_ms", "p99_ms"]
    out = {}
    for number, group in sorted(grouped.items()):
        summary = summarize(group, window)
        out[str(number)] = {**{key: summary[key] for key in keys}, "streams": stream_summary(group, window)}
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def prune(now: datetime) -> int:
    """Delete the request buckets older than REQUEST_STATS_KEEP_HOURS: every reader (the metrics API, the traffic
    panel, a canary's guardrails, the performance panel) looks at most 24 hours back, and the gateway writes a row per
    deployment, revision and 10-second bucket with traffic, so kept forever they grow without bound (8,640 rows a day
    for one busy deployment). Returns how many were deleted."""
    from django.conf import settings

    from gateway.models import RequestStats

    cutoff = now - timedelta(hours=settings.REQUEST_STATS_KEEP_HOURS)
    deleted, _ = RequestStats.objects.filter(bucket_start__lt=cutoff).delete()
    return deleted
