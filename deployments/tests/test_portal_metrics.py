"""The portal's own state on /metrics (deployments/portal_metrics.py): pools' budgets and reservations, canary
rollbacks from the audit log, and the Celery queues' lengths, from the real Redis and from the filesystem transport;
a broker that accepts and never answers leaves the queue sample out within the timeout."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client
from kombu import Connection, Producer
from kombu import Queue as KombuQueue
from prometheus_client.parser import text_string_to_metric_families

from deployments import actions
from deployments.models import Deployment, Revision
from deployments.pool_models import Pool, PoolLoad
from deployments.portal_metrics import PortalState, queue_lengths
from tests.support.people import Person

REDIS_URL = os.environ.get("TEST_PORTAL_METRICS_REDIS_URL", "redis://127.0.0.1:6379/11")
TOKEN = "m" * 12 + "Xy7#pQ2$wE9!"


def samples(collector: PortalState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in collector.collect()
            for s in family.samples}


def deployment_of(person: Person, name: str = "digits-prod") -> Deployment:
    deployment = Deployment.objects.create(team=person.team, name=name, status=Deployment.Status.READY)
    for number in (1, 2, 3):
        Revision.objects.create(deployment=deployment, number=number,
                                spec={"models": [{"name": "digits", "version": 1, "format": "onnx"}]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=deployment.revisions.get(number=1))
    return deployment


def roll_back(deployment: Deployment, number: int) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(canary_revision=deployment.revisions.get(number=number))
    actions.rollback_canary(deployment, None, reason="error ratio 0.5 over 0.05")


@pytest.mark.django_db
def test_each_pool_shows_its_budget_and_what_its_loaded_and_loading_models_reserve(alice: Person,
                                                                                    charlie: Person) -> None:
    pool = Pool.objects.create(name="acme-own", memory_budget_bytes=4 * 2**30, team=alice.team)
    Pool.objects.create(name="empty", memory_budget_bytes=2**30)
    mine, theirs = deployment_of(alice), deployment_of(charlie)
    PoolLoad.objects.create(pool=pool, deployment=mine, revision=mine.revisions.get(number=1),
                            state=PoolLoad.State.LOADED, memory_bytes=3 * 2**30)
    PoolLoad.objects.create(pool=pool, deployment=mine, revision=mine.revisions.get(number=2),
                            state=PoolLoad.State.LOADING, reserved_bytes=2**29)
    # Neither an unloaded model nor a failed load holds memory.
    PoolLoad.objects.create(pool=pool, deployment=theirs, revision=theirs.revisions.get(number=1),
                            state=PoolLoad.State.UNLOADED, memory_bytes=2**30)
    PoolLoad.objects.create(pool=pool, deployment=theirs, revision=theirs.revisions.get(number=2),
                            state=PoolLoad.State.FAILED, reserved_bytes=2**30)

    found = samples(PortalState(broker_url="memory://"))

    assert found[("modelport_pool_memory_budget_bytes", (("pool", "acme-own"),))] == 4 * 2**30
    assert found[("modelport_pool_memory_reserved_bytes", (("pool", "acme-own"),))] == 3 * 2**30 + 2**29
    assert found[("modelport_pool_memory_budget_bytes", (("pool", "empty"),))] == 2**30
    assert found[("modelport_pool_memory_reserved_bytes", (("pool", "empty"),))] == 0


@pytest.mark.django_db
def test_each_model_in_a_pool_is_named_with_its_pool_name_and_whose_it_is(alice: Person, charlie: Person) -> None:
    pool = Pool.objects.create(name="shared", memory_budget_bytes=4 * 2**30)
    mine, theirs = deployment_of(alice), deployment_of(charlie)
    Revision.objects.filter(deployment=mine, number=2).update(spec={"models": [
        {"name": "digits", "version": 1, "format": "onnx"}, {"name": "prep", "version": 1, "format": "python"}]})
    PoolLoad.objects.create(pool=pool, deployment=mine, revision=mine.revisions.get(number=2),
                            state=PoolLoad.State.LOADED)
    # An unloaded revision's models are named too: their series stay in Prometheus' window after the unload.
    PoolLoad.objects.create(pool=pool, deployment=theirs, revision=theirs.revisions.get(number=1),
                            state=PoolLoad.State.UNLOADED)

    found = {labels for (name, labels), value in samples(PortalState(broker_url="memory://")).items()
             if name == "modelport_pool_model_info" and value == 1}

    def info(load_of: Deployment, revision: int, model: str, team: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"pool": "shared", "pool_model": f"d{load_of.pk}-r{revision}-{model}", "team": team,
                             "deployment": "digits-prod", "revision": str(revision), "model": model}.items()))

    assert found == {info(mine, 2, "digits", alice.team.name), info(mine, 2, "prep", alice.team.name),
                     info(theirs, 1, "digits", charlie.team.name)}


@pytest.mark.django_db
def test_rollbacks_count_per_deployment_and_never_mix_two_teams_deployments_of_one_name(
        alice: Person, charlie: Person) -> None:
    mine, theirs = deployment_of(alice), deployment_of(charlie)
    other = deployment_of(alice, "digits-eu")
    roll_back(mine, 2)
    roll_back(mine, 3)
    roll_back(other, 2)
    gone = deployment_of(alice, "gone")
    roll_back(gone, 2)
    gone.delete()  # its audit rows stay; its series does not
    Deployment.objects.filter(pk=theirs.pk).update(canary_revision=theirs.revisions.get(number=2),
                                                   canary_upstream_url="http://127.0.0.1:9")
    actions.promote_canary(theirs, charlie.user)  # a promotion is no rollback

    found = {labels: value for (name, labels), value in samples(PortalState(broker_url="memory://")).items()
             if name == "modelport_canary_rollbacks_total"}

    # Every deployment has its series, 0 before its first rollback, so that Prometheus' increase() sees the first.
    assert found == {(("deployment", "digits-prod"), ("team", alice.team.name)): 2,
                     (("deployment", "digits-eu"), ("team", alice.team.name)): 1,
                     (("deployment", "digits-prod"), ("team", charlie.team.name)): 0}


@pytest.fixture
def private_redis() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


def publish(connection: Connection, queue: str, count: int, **options: Any) -> None:
    producer = Producer(connection.channel())
    for i in range(count):
        producer.publish({"n": i}, routing_key=queue, declare=[KombuQueue(queue, routing_key=queue)], **options)


def test_with_redis_each_queue_counts_its_messages_of_every_priority(private_redis: str) -> None:
    with Connection(private_redis) as connection:
        publish(connection, "reconcile", 3)
        publish(connection, "reconcile", 2, priority=9)
        publish(connection, "tune", 1)

    assert queue_lengths(private_redis, {}, 0.5) == {"reconcile": 5, "inspection": 0, "build": 0, "import": 0,
                                                     "tune": 1}


def test_with_the_filesystem_transport_each_queue_counts_its_message_files(tmp_path: Path) -> None:
    folders = {"data_folder_in": str(tmp_path / "q"), "data_folder_out": str(tmp_path / "q"),
               "processed_folder": str(tmp_path / "p"), "store_processed": False,
               "control_folder": str(tmp_path / "c")}
    with Connection("filesystem://", transport="infra.kombu_filesystem:Transport",
                    transport_options=folders) as connection:
        publish(connection, "inspection", 2)
        publish(connection, "build", 1)
    (tmp_path / "q" / "1_x.reconcile.msg.part").write_text("{}")  # still being written: not a message yet

    assert queue_lengths("filesystem://", folders, 0.5) == {"reconcile": 0, "inspection": 2, "build": 1, "import": 0,
                                                             "tune": 0}
    assert queue_lengths("filesystem://", {"data_folder_in": str(tmp_path / "none")}, 0.5)["inspection"] == 0


@pytest.mark.django_db
def test_a_broker_that_never_answers_leaves_the_queues_out_and_not_the_rest(settings: Any, alice: Person) -> None:
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the connection; nothing ever reads or answers
    try:
        settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        settings.METRICS_TOKEN, settings.METRICS_OPEN = TOKEN, False
        started = time.monotonic()
        response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        took = time.monotonic() - started
    finally:
        silent.close()

    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    assert took < 1.5, took  # the timeout is 0.5 s, and no retries
    assert families["modelport_worker_queue_messages"].samples == []
    assert [s.value for s in families["modelport_pool_memory_budget_bytes"].samples] == [2**30]


@pytest.mark.django_db
def test_a_closed_metrics_endpoint_shows_none_of_it(settings: Any, alice: Person) -> None:
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    settings.METRICS_TOKEN, settings.METRICS_OPEN = "", False
    response = Client().get("/metrics")
    assert response.status_code == 403 and b"modelport_pool" not in response.content
