"""Reconciliation and inspection run on queues of their own (portal/queues.py), and every way Modelport starts a
worker consumes both, so that nothing is queued where no worker listens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from portal.celery import app
from portal.queues import Queue

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("task", "queue"), [
    ("deployments.tasks.reconcile_deployment", Queue.RECONCILE),
    ("deployments.tasks.reconcile_all", Queue.RECONCILE),
    ("deployments.tasks.sweep_orphan_servers", Queue.RECONCILE),
    ("deployments.tasks.build_python_env", Queue.INSPECTION),
    ("models_registry.tasks.inspect_version", Queue.INSPECTION),
    ("models_registry.tasks.delete_expired_uploads", Queue.INSPECTION),
    ("accounts.tasks.delete_expired_idempotency_records", Queue.INSPECTION),
    ("tuning.tasks.run_tune", Queue.TUNE),
    ("some.task.nobody.routed", Queue.INSPECTION),  # never ahead of a rollout
])
def test_each_task_goes_to_its_queue(task: str, queue: Queue) -> None:
    assert app.amqp.router.route({}, task)["queue"].name == queue.value


def _queues_of(argv: list[str]) -> set[str]:
    assert "-Q" in argv, argv
    return set(argv[argv.index("-Q") + 1].split(","))


def test_every_worker_command_consumes_every_queue() -> None:
    everything = {q.value for q in Queue}
    assert {q.name for q in app.conf.task_queues} == everything  # a worker started without -Q: all of them
    script = (ROOT / "bin" / "run-portal").read_text()
    [line] = [line for line in script.splitlines() if re.search(r"celery -A portal worker", line)]
    assert _queues_of(line.split()) == everything
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert _queues_of(compose["services"]["worker"]["command"]) == everything
    worker = yaml.safe_load((ROOT / "platform" / "kubernetes" / "base" / "worker.yaml").read_text())
    [container] = worker["spec"]["template"]["spec"]["containers"]
    assert _queues_of(container["command"]) == everything
