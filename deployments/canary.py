"""Canary rollouts: a new revision served beside the stable one for a share of the requests, judged by its
guardrails against the stable revision over a window of the gateway's statistics.

The reconciler (deployments/reconcile.py) launches the canary beside the serving revision and gives it its route;
the gateway (gateway/app.py, grpc_app.py) splits the requests per request; users promote it or roll it back
(deployments/actions.py), or its guardrails do. Here: the rollout as asked for and the guardrails' verdict, a pure
function of the figures (`decide`). The judge that reads the figures from the gateway's statistics and acts on the
verdict is the gateway's (gateway/canary.py, run every CANARY_CHECK_SECONDS by beat through
gateway.tasks.check_canaries): the statistics are the gateway's, and it sits above this app.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.models import Deployment

# Defaults of a rollout's guardrails (the model's field defaults; docs/api.md states them too).
DEFAULT_MAX_ERROR_RATE = 0.05  # the canary's share of 5xx/429 answers
DEFAULT_MAX_P99_RATIO = 2.0  # the canary's p99 latency over the stable revision's
# A canary's first seconds are a cold server's (its first requests load and warm the model) on a machine that is
# busy with the stable revision: a 60 s window and 20 requests rolled a healthy first canary back 11 s in (p99
# 41.6 against 14.7 ms). Two minutes and a hundred requests are enough of both for a p99 to be a percentile.
DEFAULT_WINDOW_SECONDS = 120
DEFAULT_MIN_REQUESTS = 100  # fewer canary requests in the window: no verdict yet
# A p99 ratio is only a regression past this many milliseconds too: 1 ms against 0.4 ms is noise, not a regression.
P99_SLACK_MS = 5.0
# A p99 of fewer requests is their slowest one (a cold first request, say), not a percentile: no latency verdict
# on fewer, from either revision.
MIN_REQUESTS_FOR_P99 = 100
MIN_WINDOW_SECONDS = 10  # the statistics' bucket
MAX_WINDOW_SECONDS = 86_400


@dataclass(frozen=True)
class Rollout:
    """A canary rollout as asked for (parsed and bounded by the API's serializer or the edit form)."""

    percent: int
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    max_p99_ratio: float = DEFAULT_MAX_P99_RATIO
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    min_requests: int = DEFAULT_MIN_REQUESTS
    auto_promote: bool = False

    def fields(self) -> dict[str, object]:
        return {"canary_percent": self.percent, "canary_max_error_rate": self.max_error_rate,
                "canary_max_p99_ratio": self.max_p99_ratio, "canary_window_seconds": self.window_seconds,
                "canary_min_requests": self.min_requests, "canary_auto_promote": self.auto_promote}


@dataclass(frozen=True)
class Figures:
    requests: int
    errors: int
    p99_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Verdict:
    action: str  # "wait", "rollback" or "promote"
    reason: str = ""


def _percent(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def p99_requests_needed(deployment: Deployment) -> int:
    """Requests of each revision in the window before the p99 rule is judged (the form and the page say it)."""
    return max(deployment.canary_min_requests, MIN_REQUESTS_FOR_P99)


def judged(deployment: Deployment, canary: Figures, stable: Figures, serving_for: float) -> str:
    """Which guardrails these figures judge, on how many requests, and why the others are not judged (yet): the
    page shows it live and every automatic verdict carries it, so that a promotion on 25 requests says its p99 was
    never looked at rather than that it passed."""
    needed = deployment.canary_min_requests
    if canary.requests >= needed:
        errors = f"error rate judged on {canary.requests} requests"
    else:
        errors = f"error rate not judged: {canary.requests} of the {needed} requests needed"
    return f"{errors}; {_p99_judged(deployment, canary, stable, serving_for)}"


def _p99_judged(deployment: Deployment, canary: Figures, stable: Figures, serving_for: float) -> str:
    window = deployment.canary_window_seconds
    enough = p99_requests_needed(deployment)
    if canary.requests < enough:
        return f"p99 not judged: {canary.requests} of the {enough} requests needed"
    if stable.requests < enough:
        return f"p99 not judged: the stable revision has {stable.requests} of the {enough} requests needed"
    if serving_for < window:
        return f"p99 not judged: {serving_for:.0f} s of the whole {window} s window served"
    if canary.p99_ms is None or stable.p99_ms is None:
        return "p99 not judged: no latency figures"
    return f"p99 judged on {canary.requests} canary and {stable.requests} stable requests"


def decide(deployment: Deployment, canary: Figures, stable: Figures, serving_for: float) -> Verdict:
    """The guardrails' verdict on the window's figures (a pure function of them: the tests feed it numbers)."""
    window = deployment.canary_window_seconds
    if canary.requests >= deployment.canary_min_requests:
        if canary.error_rate > deployment.canary_max_error_rate:
            return Verdict("rollback", f"canary error rate {_percent(canary.error_rate)} > "
                                       f"{_percent(deployment.canary_max_error_rate)} over {window} s, stable "
                                       f"{_percent(stable.error_rate)} ({canary.errors} of {canary.requests} "
                                       f"requests; {_p99_judged(deployment, canary, stable, serving_for)})")
        enough = p99_requests_needed(deployment)
        # Latency is judged on a whole window only: the first seconds of a canary are its warm-up, and a p99 of
        # them is the cold start, not the revision.
        if (serving_for >= window and canary.p99_ms is not None and stable.p99_ms is not None
                and canary.requests >= enough and stable.requests >= enough
                and canary.p99_ms > stable.p99_ms * deployment.canary_max_p99_ratio
                and canary.p99_ms - stable.p99_ms > P99_SLACK_MS):
            return Verdict("rollback", f"canary p99 latency {canary.p99_ms:.1f} ms > "
                                       f"{deployment.canary_max_p99_ratio:g} x stable {stable.p99_ms:.1f} ms over "
                                       f"{window} s ({canary.requests} canary and {stable.requests} stable "
                                       "requests)")
        if deployment.canary_auto_promote and serving_for >= window:
            return Verdict("promote", f"a clean window of {window} s: canary error rate "
                                      f"{_percent(canary.error_rate)} over {canary.requests} requests, p99 "
                                      f"{_p99(canary.p99_ms)}; stable {_percent(stable.error_rate)}, p99 "
                                      f"{_p99(stable.p99_ms)}; {judged(deployment, canary, stable, serving_for)}")
    return Verdict("wait")


def _p99(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
