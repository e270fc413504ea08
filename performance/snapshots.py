"""Taking the snapshots the performance panel reads: every serving revision's (and a canary's) Triton counters,
from the statistics extension the gateway also forwards (`GET /v2/models/stats`: open on every Triton the portal
starts; only the repository, logging, trace and shared-memory APIs take the admin key, docs/security.md).

One GET per Triton (a pool's serves many deployments: one answer, split by the names' prefixes), MAX_PARALLEL at
once with a short timeout, the whole pass bounded in time (PASS_SECONDS) however many Tritons are stuck. One row per
revision per pass, never per request; rows older than the longest window are removed by the same pass.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments.models import Deployment, Revision
from deployments.pool_names import name_prefix
from performance.figures import parse_statistics
from performance.models import TritonSnapshot
from performance.windows import LONGEST

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_SECONDS = 2.0
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # a pool's answer names many models; anything beyond this is not statistics
MAX_PARALLEL = 8
# A pass reads Tritons for at most this long (each read at most SNAPSHOT_TIMEOUT_SECONDS): it runs on a reconcile
# thread, and a Triton left unread is read at the next pass (its figures span two intervals, not less exact).
PASS_SECONDS = 3 * SNAPSHOT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Target:
    deployment_id: int
    revision: int
    url: str  # the Triton's HTTP base URL, as the gateway routes to it
    prefix: str  # a pool's prefix of the revision's model names ("" on a dedicated server)
    models: tuple[str, ...]


def _target(deployment: Deployment, revision: Revision | None, url: str) -> Target | None:
    if revision is None or not url:
        return None
    spec = revision.spec
    prefix = name_prefix(deployment.pk, revision.number) if spec.placement.shared else ""
    return Target(deployment.pk, revision.number, url.rstrip("/"), prefix, spec.model_names)


def targets() -> list[Target]:
    """The Tritons serving now: each running deployment's serving revision, and its canary's."""
    found = []
    running = (Deployment.objects.filter(desired_state=Deployment.Desired.RUNNING).exclude(upstream_url="")
               .select_related("serving_revision", "canary_revision"))
    for deployment in running:
        for revision, url in ((deployment.serving_revision, deployment.upstream_url),
                              (deployment.canary_revision, deployment.canary_upstream_url)):
            target = _target(deployment, revision, url)
            if target is not None:
                found.append(target)
    return found


def fetch(url: str, timeout: float = SNAPSHOT_TIMEOUT_SECONDS) -> Any:
    """Triton's statistics of every model it serves, or None when it does not answer them."""
    try:
        with urllib.request.urlopen(f"{url}/v2/models/stats", timeout=timeout) as response:
            body = response.read(MAX_ANSWER_BYTES + 1)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    if len(body) > MAX_ANSWER_BYTES:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def fetch_all(urls: list[str], pass_seconds: float = PASS_SECONDS) -> dict[str, Any]:
    """Each URL's statistics (None: no answer), read MAX_PARALLEL at a time; what has not started within
    `pass_seconds` is left for the next pass, so that many stuck Tritons cannot hold a reconcile thread longer."""
    if not urls:
        return {}
    executor = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(urls)))
    futures = {executor.submit(fetch, url): url for url in urls}
    done, _ = wait(futures, timeout=pass_seconds)
    executor.shutdown(wait=False, cancel_futures=True)
    return {futures[future]: future.result() for future in done}


def take_snapshots(now: datetime | None = None) -> int:
    """One pass: a snapshot of every serving revision that answered, and the rows past the longest window removed.
    Returns how many snapshots were written."""
    now = now or timezone.now()
    found = targets()
    urls = sorted({target.url for target in found})
    answers = fetch_all(urls)
    rows = []
    alive = set(Deployment.objects.filter(pk__in={t.deployment_id for t in found}).values_list("pk", flat=True))
    for target in found:
        if target.deployment_id not in alive:  # deleted since targets() read it
            continue
        answer = answers.get(target.url)
        if answer is None:
            continue
        counters = parse_statistics(answer, target.prefix)
        rows.append(TritonSnapshot(deployment_id=target.deployment_id, revision=target.revision, taken_at=now,
                                   counters={name: counters[name].to_json() for name in target.models
                                             if name in counters}))
    TritonSnapshot.objects.bulk_create(rows)
    prune(now)
    return len(rows)


def prune(now: datetime) -> int:
    """Remove the snapshots no window reaches (one interval of slack, so the longest window has its first one)."""
    keep = LONGEST + timedelta(seconds=2 * settings.PERFORMANCE_SNAPSHOT_SECONDS)
    deleted, _ = TritonSnapshot.objects.filter(taken_at__lt=now - keep).delete()
    return deleted
