"""A Celery worker stopped with SIGTERM exits within seconds, also when the signal reaches its whole process group.

systemd (KillMode=control-group), supervisord (stopasgroup) and a terminal's Ctrl-C signal every process of the
group. With the filesystem broker, Celery's prefork pool is billiard's blocking pool: the signal killed its
children, the pool replaced them before the main process noticed the shutdown, and at exit the main process waited
for the task-queue lock that an idle replacement held while it waited for work, for ever (seen for 30 minutes in
"Warm shutdown"; the next `make run` then shared the broker with it). So:

- with the filesystem broker, the children of a prefork pool (the inspection lane, infra/lanes.py: the pool
  where time limits hold) ignore SIGTERM and SIGINT: a signal to the whole group reaches the main process alone,
  whose warm shutdown ends the idle children and waits for a running inspection (bounded by its hard time limit,
  or the supervisor's grace period and SIGKILL); the other lanes run the threads pool, with no children at all;
- the reconciler never waits inside a task (one step per task, deployments/reconcile.py), so a stopping worker
  finishes its ticks within seconds (an inspection's trial run is bounded by TRIAL_RUN_TIMEOUT_SECONDS). Tasks are
  idempotent and level-triggered: the next worker carries on from what the database says, adopting what was
  started;
- prefork children (the Redis broker's asynchronous pool copes with their death) are passed a SIGTERM sent to the
  main process alone (docker stop, Kubernetes): they stop at once and their tasks are delivered again
  (task_acks_late with task_reject_on_worker_lost), rather than outliving the grace period.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import billiard.process
from celery import signals


@signals.worker_shutting_down.connect
def _worker_stopping(**kwargs: Any) -> None:
    """Runs in the main process' signal handler (SIGTERM, Ctrl-C)."""
    for child in billiard.process.active_children():  # prefork pool children; none with the threads pool
        try:
            os.kill(child.pid, signal.SIGTERM)
        except (ProcessLookupError, TypeError):  # gone already; pid None: not started
            pass


@signals.worker_process_init.connect
def _child_ignores_group_signals(**kwargs: Any) -> None:
    """Runs in each prefork child as it starts. Only with the filesystem broker: its blocking pool is the one that
    hung when a child died of a group signal (Redis' asynchronous pool replaces dead children cleanly)."""
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
