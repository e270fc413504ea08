"""The Celery app. The broker is kombu's filesystem transport under var/ by default (no server needed) and Redis
when CELERY_BROKER_URL says so; its settings are the CELERY_* names in portal/settings.py."""

from __future__ import annotations

import os

from celery import Celery, signals
from kombu import Queue as KombuQueue

from infra.queues import DEFAULT, ROUTES, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("modelport")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    # A task whose worker dies mid-way is delivered again; every task is idempotent.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    timezone="UTC",
    # The queues of infra/queues.py: a worker without -Q consumes them all.
    task_queues=[KombuQueue(name, routing_key=name) for name in Queue],
    task_default_queue=DEFAULT,
    task_routes=ROUTES,
)
app.autodiscover_tasks()


@signals.worker_init.connect
@signals.beat_init.connect
def _prepare_process(**kwargs: object) -> None:
    """var/ and the secret key are checked when a worker or beat starts, not when the settings are imported; tracing
    starts there too (off, and nothing imported, without an endpoint: docs/observability.md), so that each task is a
    span in the trace of the request or task that queued it."""
    from infra import tracing
    from infra.var_dir import prepare_process

    prepare_process()
    tracing.configure()
    tracing.instrument_portal()


# SIGTERM handling for the worker and its pool (why: infra/worker_shutdown.py).
import infra.worker_shutdown  # noqa: E402,F401
