"""Reconciliation, inspection, builds and tunes run on queues of their own (infra/queues.py), each consumed by a
lane of worker processes of its own (infra/lanes.py); every way Modelport starts workers (bin/run-portal,
docker-compose, the Kubernetes manifests) starts exactly those lanes, so that nothing is queued where no worker
listens and no stop waits behind a team's slow work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.lanes import LANES, Lane, lane, main
from infra.queues import Queue
from portal.celery import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("task", "queue"), [
    ("deployments.tasks.reconcile_deployment", Queue.RECONCILE),
    ("deployments.tasks.reconcile_all", Queue.RECONCILE),
    ("deployments.tasks.sweep_orphan_servers", Queue.RECONCILE),
    ("gateway.tasks.check_canaries", Queue.RECONCILE),
    ("models_registry.tasks.dispatch_inspections", Queue.RECONCILE),
    ("tuning.tasks.sweep_servers", Queue.RECONCILE),
    ("deployments.tasks.build_python_env", Queue.BUILD),
    ("models_registry.tasks.inspect_version", Queue.INSPECTION),
    ("models_registry.tasks.delete_expired_uploads", Queue.INSPECTION),
    ("accounts.tasks.delete_expired_idempotency_records", Queue.INSPECTION),
    ("tuning.tasks.run_tune", Queue.TUNE),
    ("some.task.nobody.routed", Queue.INSPECTION),  # never ahead of a rollout
])
def test_each_task_goes_to_its_queue(task: str, queue: Queue) -> None:
    assert app.amqp.router.route({}, task)["queue"].name == queue.value


def test_every_queue_has_exactly_one_lane_and_reconcile_shares_it_with_nothing() -> None:
    assert {q.name for q in app.conf.task_queues} == {q.value for q in Queue}  # a worker without -Q: all of them
    consumed = [q for each in LANES for q in each.queues]
    assert sorted(consumed) == sorted(Queue)
    assert lane("reconcile").queues == (Queue.RECONCILE,)


def test_inspections_run_in_the_prefork_pool_where_their_time_limits_hold() -> None:
    assert lane("inspection").pool == "prefork"
    from models_registry.tasks import inspect_version as task

    assert task.soft_time_limit is not None and task.time_limit is not None
    assert task.soft_time_limit < task.time_limit


def _lane_of(argv: list[str]) -> Lane:
    """The lane a worker command line starts: its queues, pool, concurrency and node name, each as LANES says."""
    start = argv.index("worker") + 1
    args = [a for a in argv[start:] if not a.startswith("--loglevel")]
    [match] = [each for each in LANES if each.worker_args() == args]
    return match


def test_docker_compose_starts_one_worker_per_lane() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [s["command"] for s in compose["services"].values() if s.get("command", [None, None, None, ""])[3:4]
                == ["worker"]]
    assert sorted(_lane_of(c).name for c in commands) == sorted(each.name for each in LANES)


def _k8s_workers() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((ROOT / "platform" / "kubernetes" / "base" / "worker.yaml").read_text())
    return [d for d in docs if d and d["kind"] == "Deployment"]


def test_the_kubernetes_manifests_start_one_worker_deployment_per_lane() -> None:
    lanes = []
    for deployment in _k8s_workers():
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        lanes.append(_lane_of(container["command"]).name)
    assert sorted(lanes) == sorted(each.name for each in LANES)


def test_run_portal_reads_its_lanes_from_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    script = (ROOT / "bin" / "run-portal").read_text()
    assert '$PY -m infra.lanes "$lane"' in script and "$($PY -m infra.lanes)" in script
    assert main([]) == 0 and capsys.readouterr().out.split() == [each.name for each in LANES]
    assert main(["inspection"]) == 0
    assert capsys.readouterr().out.split() == lane("inspection").worker_args()
    assert main(["nope"]) == 2
    assert "no lane 'nope': one of reconcile, inspection, build, tune, import" in capsys.readouterr().err


def test_one_team_at_its_import_cap_holds_at_most_a_quarter_of_the_import_lane() -> None:
    from django.conf import settings

    # Imports run for up to an hour each: with as many threads as one team may have imports, that team would fill the
    # lane and every other team's import would wait behind its fetches (docs/security.md, "Imported versions").
    assert lane("import").concurrency >= 4 * settings.IMPORT_MAX_ACTIVE_PER_TEAM
