"""Running a tune in a worker: claim this machine (one running tune per host), then let tuning.search drive
temporary Tritons of the deployment's revision with candidate settings, each rendered into a repository of its own
and started through the deployment's runtime (Runtime.start_temporary: the local runtime's sandboxed launcher, the
code path of every deployment), on free ports, stopped in `finally`. The deployment's own server is not touched.

Temporary servers live under VAR_DIR/tuning/<tune id>/, outside DEPLOYMENTS_DIR, so that the orphan sweep of
deployments never stops one mid-measurement. A worker killed mid-tune leaves its last server running: beat's
`sweep_servers` (every 30 s) marks such a tune failed once its heartbeat is long gone and stops every temporary
Triton whose tune is not running, so none stays behind holding the team's model and its memory.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from deployments import logtail
from deployments.events import record
from deployments.models import Deployment, Event, bounded_message
from deployments.revision_spec import ModelEntry, RevisionSpec
from deployments.runtimes.base import RuntimeUnavailable, TemporaryServer, TemporaryServerFailed
from deployments.runtimes.registry import runtime_for, runtime_named
from deployments.spec import DynamicBatching, defaults_for
from tuning import search
from tuning.measure import run_loadgen
from tuning.models import TuneRun

log = logging.getLogger(__name__)

WAIT_SECONDS = 10  # how soon a tune that found the machine busy looks again
STALE_SECONDS = 180  # a running tune without a heartbeat this long is dead (its worker was killed)


def this_host() -> str:
    return socket.gethostname()


def machine_fingerprint() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {"hostname": this_host(), "cpu_model": model, "cores": os.cpu_count() or 1, "gpu": "none"}


def entry_to_tune(spec: RevisionSpec, tune: TuneRun) -> ModelEntry:
    entry = next((m for m in spec.models if m.version_id == tune.model_version_id), None)
    if entry is None:
        raise RuntimeUnavailable("the deployment's current revision no longer serves the model version tuned")
    return entry


def apply_config(spec: RevisionSpec, entry: ModelEntry, config: search.Config) -> RevisionSpec:
    """`spec` with `config` for `entry`'s model (the other models as they are)."""
    # The batching options a tune does not vary (preferred sizes, ordering) stay as the entry has them.
    batching = replace(entry.dynamic_batching or DynamicBatching(), max_queue_delay_microseconds=config.queue_delay_us)
    tuned = replace(entry, instance_group=replace(entry.instance_group, count=config.instances),
                    dynamic_batching=batching if config.batching else None,
                    max_batch_size=config.max_batch_size if config.batching else entry.max_batch_size)
    return replace(spec, models=tuple(tuned if m is entry else m for m in spec.models))


def current_config(entry: ModelEntry) -> search.Config:
    """The setting `entry` serves with now, as a tune names settings (apply_config of it changes nothing)."""
    if entry.dynamic_batching is None or entry.max_batch_size <= 0:
        return search.Config(instances=entry.instance_group.count)
    return search.Config(entry.instance_group.count, True, entry.max_batch_size,
                         entry.dynamic_batching.max_queue_delay_microseconds)


def next_in_line() -> int | None:
    """The queued tune that runs next on this machine, round-robin across teams: the oldest queued tune of the team
    whose last tune started longest ago (a team that never tuned first; ties: whose tune was queued first). So a
    team's queued tunes never run ahead of another team's waiting one, whoever's task wakes first."""
    queued = list(TuneRun.objects.filter(status=TuneRun.Status.QUEUED, cancel_requested=False)
                  .order_by("created_at", "pk").values_list("pk", "team_id"))
    if not queued:
        return None
    last_started = dict(TuneRun.objects.filter(team_id__in={team for _, team in queued}, started_at__isnull=False)
                        .values("team_id").annotate(last=Max("started_at")).values_list("team_id", "last"))
    oldest: dict[int, tuple[int, int]] = {}  # team -> (position in the queue, tune id)
    for position, (pk, team) in enumerate(queued):
        oldest.setdefault(team, (position, pk))
    never = datetime.min.replace(tzinfo=UTC)
    team = min(oldest, key=lambda t: (last_started.get(t) or never, oldest[t][0]))
    return oldest[team][1]


def _machine_busy() -> bool:
    fresh = timezone.now() - timedelta(seconds=STALE_SECONDS)
    return TuneRun.objects.filter(host=this_host(), status=TuneRun.Status.RUNNING, heartbeat_at__gte=fresh).exists()


def claim(tune: TuneRun) -> str | None:
    """Mark the tune running on this host; None when claimed, else why it waits (or that it is not queued)."""
    host = this_host()
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic():
                claimed = TuneRun.objects.filter(pk=tune.pk, status=TuneRun.Status.QUEUED).update(
                    status=TuneRun.Status.RUNNING, host=host, started_at=now, heartbeat_at=now,
                    message="Starting.", machine=machine_fingerprint())
            return None if claimed else "not queued"
        except IntegrityError:
            holder = TuneRun.objects.filter(host=host, status=TuneRun.Status.RUNNING).first()
            if holder is None:
                continue
            if holder.heartbeat_at is None or holder.heartbeat_at < now - timedelta(seconds=STALE_SECONDS):
                TuneRun.objects.filter(pk=holder.pk, status=TuneRun.Status.RUNNING).update(
                    status=TuneRun.Status.FAILED, finished_at=now,
                    message="Its worker stopped mid-tune (no heartbeat): run it again.")
                continue
            # Never another team's name: every team sees only its own objects (docs/security.md).
            whose = "yours" if holder.team_id == tune.team_id else "another team's"
            message = f"Waiting for another tune on this machine ({whose}) to finish."
            TuneRun.objects.filter(pk=tune.pk, status=TuneRun.Status.QUEUED).update(message=message)
            return message
    return "the machine is busy"


class Servers:
    """The one temporary Triton of the setting being measured: a new setting stops the last one first."""

    def __init__(self, tune: TuneRun, spec: RevisionSpec, entry: ModelEntry) -> None:
        self.tune, self.spec, self.entry = tune, spec, entry
        self.root = Path(settings.VAR_DIR) / "tuning" / str(tune.pk)
        self.config: search.Config | None = None
        self.runtime = runtime_for(tune.deployment)
        self.server: TemporaryServer | None = None
        self.count = 0

    def url_for(self, config: search.Config) -> str:
        if config != self.config or self.server is None:
            self.stop()
            self.count += 1
            spec = apply_config(self.spec, self.entry, config)
            workdir = self.root / f"c{self.count}"  # its repository: workdir/repository, as _tune_id reads it
            shutil.rmtree(workdir, ignore_errors=True)
            try:
                self.server = self.runtime.start_temporary(spec, workdir, label=f"tune {self.tune.pk}")
            except TemporaryServerFailed as exc:
                # Triton's error line may carry what the model wrote: a short excerpt of it.
                raise search.MeasureFailed(f"its Triton did not start: {logtail.excerpt(str(exc), 1000)}") from None
            self.config = config
        assert self.server is not None
        return f"{self.server.http_url}/v2/models/{self.entry.name}/infer"

    def stop(self) -> None:
        if self.server is not None:
            self.runtime.stop_temporary(self.server)
            self.server = None
            self.config = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def measurement_seconds(budget_seconds: float) -> tuple[float, float]:
    """(duration, warm-up) of one measurement: short for short budgets, never under 2 s of load."""
    return max(2.0, min(10.0, budget_seconds / 40)), 1.0


Measurer = Callable[[str, bytes, int, float, float], search.Measurement]


def run(tune_id: int, loadgen: Measurer = run_loadgen) -> str | None:
    """Run the tune; returns why it has to wait (the machine is busy), else None once it is over."""
    tune = TuneRun.objects.select_related("deployment", "team").filter(pk=tune_id).first()
    if tune is None or tune.status != TuneRun.Status.QUEUED:
        return None
    stopped = _stop_reason(tune.pk)
    if stopped is not None:
        TuneRun.objects.filter(pk=tune.pk, status=TuneRun.Status.QUEUED).update(
            status=TuneRun.Status.CANCELLED, finished_at=timezone.now(),
            message="Cancelled before it started." if stopped == "Cancelled." else stopped)
        return None
    turn = next_in_line()
    if turn is not None and turn != tune.pk and not _machine_busy():
        # The machine is free: this worker slot runs the tune whose turn it is, and this one waits for its own
        # (its task comes back), so the order never depends on whose task happens to wake first.
        run(turn, loadgen)
        message = "Waiting for its turn: the next tune is the oldest of the team that has waited longest."
        TuneRun.objects.filter(pk=tune.pk, status=TuneRun.Status.QUEUED).update(message=message)
        return message
    waiting = claim(tune)
    if waiting is not None:
        return None if waiting == "not queued" else waiting
    tune.refresh_from_db()
    try:
        outcome = _search(tune, loadgen)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the tune must end failed with the reason
        log.exception("Tune %s failed", tune.pk)
        _finish(tune, TuneRun.Status.FAILED, f"The tune failed: {exc}")
        return None
    _record(tune, outcome)
    return None


def measurer(tune: TuneRun, servers: Servers, loadgen: Measurer) -> search.Measure:
    """search's `measure`: the setting's temporary server (started on its first point), then one load test."""
    body = json.dumps(tune.request_body).encode()
    duration, warmup = measurement_seconds(tune.budget_seconds)

    def measure(config: search.Config, concurrency: int) -> search.Measurement:
        started = timezone.now()
        try:
            url = servers.url_for(config)
        except RuntimeUnavailable as exc:
            raise search.MeasureFailed(str(exc)) from None
        point = loadgen(url, body, concurrency, duration, warmup)
        # The first point of a setting carries its server's start, so the budget's estimate includes it.
        return replace(point, seconds=round(max(point.seconds, (timezone.now() - started).total_seconds()), 3))

    return measure


def tune_target(tune: TuneRun) -> tuple[RevisionSpec, ModelEntry, int]:
    """The deployment's current spec, the entry tuned, and the largest batch the model may take (0: none)."""
    revision = tune.deployment.revision
    if revision is None:
        raise RuntimeUnavailable("the deployment has no revision")
    spec = revision.spec
    entry = entry_to_tune(spec, tune)
    version = tune.model_version
    model_max = defaults_for(version.parsed_signature, version.max_batch_size).max_batch_size \
        if entry.max_batch_size > 0 else 0
    return spec, entry, model_max


def _search(tune: TuneRun, loadgen: Measurer) -> search.Outcome:
    spec, entry, model_max = tune_target(tune)
    servers = Servers(tune, spec, entry)
    measure = measurer(tune, servers, loadgen)

    def progress(done: int, planned: int, eta: float) -> None:
        TuneRun.objects.filter(pk=tune.pk).update(configs_done=done, configs_planned=planned, eta_seconds=eta,
                                                  heartbeat_at=timezone.now(),
                                                  message=f"Measured {done} of about {planned} settings.")

    def cancelled() -> bool:
        TuneRun.objects.filter(pk=tune.pk).update(heartbeat_at=timezone.now())
        return _stop_reason(tune.pk) is not None

    try:
        return search.search(measure, p99_target_ms=tune.p99_target_ms, budget_s=float(tune.budget_seconds),
                             cores=os.cpu_count() or 1, model_max_batch_size=model_max,
                             concurrency=(tune.concurrency_min, tune.concurrency_max), progress=progress,
                             current=current_config(entry), cancelled=cancelled)
    finally:
        servers.close()


def _record(tune: TuneRun, outcome: search.Outcome) -> None:
    target = tune.p99_target_ms
    results = [r.to_json(target) for r in outcome.results]
    frontier = [{"throughput": p.throughput, "p99_ms": p.p99_ms, "concurrency": p.concurrency}
                for p in outcome.frontier()]
    recommendation = None
    if outcome.recommendation is not None:
        best = next(r for r in outcome.results if r.config == outcome.recommendation)
        point = best.best(target)
        assert point is not None  # only a setting that met the target is recommended
        # Its throughput is the median of its runs (the figure the decision compared); p50 and p99 of its best point.
        recommendation = {"settings": outcome.recommendation.to_json(), "label": outcome.recommendation.label(),
                          "throughput": best.score(target), "p50_ms": point.p50_ms, "p99_ms": point.p99_ms,
                          "concurrency": point.concurrency, "current": best.current, "runs": len(best.samples(target)),
                          **outcome.decision.to_json()}
    stopped = _stop_reason(tune.pk)
    if stopped is not None:
        status, message = TuneRun.Status.CANCELLED, stopped
    elif recommendation is None:
        status = TuneRun.Status.DONE
        message = (f"No setting met p99 ≤ {target:g} ms at the concurrencies tried: raise the target or lower "
                   "the concurrency.") if results else "The budget ran out before any setting was measured."
    else:
        status = TuneRun.Status.DONE
        what = "Keep the current setting" if recommendation["current"] else "Recommended"
        note = f" {outcome.decision.note}" if outcome.decision.note else ""
        message = (f"{what}: {recommendation['label']}: {recommendation['throughput']:.0f} req/s at p99 "
                   f"{recommendation['p99_ms']:.1f} ms.{note}" + (" Partial: the budget ran out." if outcome.partial
                                                                 else ""))
    TuneRun.objects.filter(pk=tune.pk).update(results=results, frontier=frontier, recommendation=recommendation,
                                              partial=outcome.partial, configs_done=len(results),
                                              configs_planned=outcome.planned, eta_seconds=0)
    _finish(tune, status, message)


def _tune_id(pid: int, prefix: str) -> int | None:
    """The tune whose temporary Triton `pid` is: its repository is <prefix><tune id>/c<n>/repository."""
    wanted = f"--model-repository={prefix}"
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for arg in args:
        if arg.startswith(wanted):
            head = arg[len(wanted):].split("/", 1)[0]
            return int(head) if head.isascii() and head.isdigit() and len(head) < 19 else None
    return None


def sweep_servers() -> list[str]:
    """Stop the temporary Tritons of this var/ whose tune is not running (its worker was killed mid-tune, say) and
    remove what they left; a running tune of this machine without a heartbeat for much longer than any one step
    takes is marked failed first. Returns a line per thing done."""
    root = Path(settings.VAR_DIR) / "tuning"
    done: list[str] = []
    now = timezone.now()
    # A step may render a large model, start a Triton (up to TRITON_READY_TIMEOUT_SECONDS) and then measure: only
    # far past that is the worker gone (a wrong verdict would stop a live tune's server).
    dead_after = timedelta(seconds=STALE_SECONDS + float(settings.TRITON_READY_TIMEOUT_SECONDS) + 600)
    for pk in TuneRun.objects.filter(host=this_host(), status=TuneRun.Status.RUNNING,
                                     heartbeat_at__lt=now - dead_after).values_list("pk", flat=True):
        if TuneRun.objects.filter(pk=pk, status=TuneRun.Status.RUNNING).update(
                status=TuneRun.Status.FAILED, finished_at=now,
                message="Its worker stopped mid-tune (no heartbeat): run it again."):
            done.append(f"marked tune {pk} failed: its worker stopped mid-tune")
    running = set(TuneRun.objects.filter(status=TuneRun.Status.RUNNING).values_list("pk", flat=True))
    grace = float(settings.TRITON_ORPHAN_GRACE_SECONDS)
    prefix = f"{root}/"
    # The temporary Tritons of this machine are the local runtime's (the one whose can_tune is true).
    runtime = runtime_named(Deployment.Runtime.LOCAL)
    for pid, age in runtime.temporary_processes(root):
        tune_id = _tune_id(pid, prefix)
        # Young servers are left alone: a tune claimed after `running` was read may just have started one.
        if tune_id in running or age < grace:
            continue
        runtime.stop_process(pid)
        done.append(f"stopped the temporary Triton (pid {pid}) of tune {tune_id}, which no longer runs")
        log.warning("Stopped the temporary Triton (pid %s) of tune %s, which no longer runs.", pid, tune_id)
    if root.is_dir():
        cutoff = time.time() - grace
        for directory in root.iterdir():
            name = directory.name
            if name.isascii() and name.isdigit() and int(name) not in running and _mtime(directory) < cutoff \
                    and not runtime.temporary_processes(directory):
                shutil.rmtree(directory, ignore_errors=True)
                done.append(f"removed {directory}")
    return done


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _stop_reason(tune_id: int) -> str | None:
    """Why the tune must stop before its next measurement: cancelled, or its deployment deleted (a tune must not
    go on running temporary Tritons of a deployment that is gone); None to go on."""
    row = TuneRun.objects.filter(pk=tune_id).values("cancel_requested", "deployment__desired_state").first()
    if row is None or row["deployment__desired_state"] == Deployment.Desired.DELETED:
        return "Cancelled: its deployment was deleted."
    return "Cancelled." if row["cancel_requested"] else None


def _finish(tune: TuneRun, status: str, message: str) -> None:
    with transaction.atomic():
        if not Deployment.objects.filter(pk=tune.deployment_id).exists():
            return  # deleted meanwhile, and its tunes with it
        TuneRun.objects.filter(pk=tune.pk).update(status=status, message=bounded_message(message),
                                                  finished_at=timezone.now())
        record(tune.deployment, Event.Kind.INFO if status == TuneRun.Status.DONE else Event.Kind.WARNING,
               f"Tune {tune.pk}: {message}")
