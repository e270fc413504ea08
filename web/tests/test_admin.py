"""The operators' console: every admin page renders, the operator actions change state, and the overview shows
servers, GPUs per team, the Celery queue and workers, and recent failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.html import escape

from accounts.models import ApiToken
from audit.models import AuditEntry
from deployments.models import Deployment, Event, Revision, TritonServer
from models_registry.models import Blob, Model, ModelVersion, Upload
from tests.support.deploying import deploy
from tests.support.people import Person
from web import overview


@pytest.fixture
def operator(db: Any) -> Client:
    user = get_user_model().objects.create_superuser("olivia", "olivia@example.com", "password")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def no_worker_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ping waits a second for workers on the broker; the page tests do not need them."""
    monkeypatch.setattr(overview, "worker_ping", lambda timeout=1.0: overview.Probe([], "no worker answered"))


def _server(deployment: Deployment) -> TritonServer:
    return TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=999_999_999,
                                       http_port=18000,
                                       grpc_port=18001, metrics_port=18002, log_path="/nonexistent/triton.log",
                                       state=TritonServer.State.READY)


@pytest.mark.parametrize("model",
                         [Model, ModelVersion, Blob, Upload, Deployment, Revision, Event, TritonServer, ApiToken,
                                   get_user_model()])
def test_every_changelist_renders_with_rows(operator: Client, alice: Person, deployment: Deployment,
                                            model: Any) -> None:
    _server(deployment)
    opts = model._meta
    response = operator.get(f"/admin/{opts.app_label}/{opts.model_name}/")
    assert response.status_code == 200
    obj = model.objects.first()
    if obj is None:
        assert f"0 {opts.verbose_name_plural}" in response.content.decode()
        return
    change_url = f"/admin/{opts.app_label}/{opts.model_name}/{obj.pk}/change/"
    assert change_url in response.content.decode()  # the row is listed, linking to its page
    change = operator.get(change_url)
    assert change.status_code == 200
    assert escape(str(obj)) in change.content.decode()


def test_a_deployments_launches_show_as_their_json(operator: Client, alice: Person, deployment: Deployment) -> None:
    from deployments.launch import Launch

    launch = Launch(deployment.revision_id, "http://127.0.0.1:41000", "pid 41", 7, grpc_target="127.0.0.1:41001")
    Deployment.objects.filter(pk=deployment.pk).update(serving_launch=launch)
    page = operator.get(f"/admin/deployments/deployment/{deployment.pk}/change/").content.decode()
    assert escape('"url": "http://127.0.0.1:41000"') in page and "Launch(" not in page


def test_deployments_can_be_searched_and_filtered(operator: Client, alice: Person, deployment: Deployment) -> None:
    for query in ["?q=digits", "?status__exact=pending", "?runtime__exact=local", f"?team__id__exact={alice.team.pk}"]:
        response = operator.get(f"/admin/deployments/deployment/{query}")
        assert response.status_code == 200
        assert b"digits-prod" in response.content, query
    assert b"digits-prod" not in operator.get("/admin/deployments/deployment/?status__exact=failed").content


def _action(client: Client, model: str, action: str, ids: list[int]) -> Any:
    return client.post(f"/admin/{model}/", {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True)


def test_operators_stop_and_start_deployments(operator: Client, alice: Person, deployment: Deployment) -> None:
    _action(operator, "deployments/deployment", "stop_deployments", [deployment.pk])
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.STOPPED
    assert Event.objects.filter(deployment=deployment, message="Stop requested by olivia.").exists()
    response = _action(operator, "deployments/deployment", "stop_deployments", [deployment.pk])
    assert b"Skipped: digits-prod" in response.content
    _action(operator, "deployments/deployment", "start_deployments", [deployment.pk])
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.RUNNING
    assert deployment.status == Deployment.Status.PENDING


def test_rerendering_makes_a_new_revision_with_the_same_spec(operator: Client, alice: Person,
                                                             deployment: Deployment) -> None:
    first = deployment.revision
    _action(operator, "deployments/deployment", "rerender_deployments", [deployment.pk])
    deployment.refresh_from_db()
    assert deployment.revision.number == 2
    assert deployment.revision.spec == first.spec
    assert list(deployment.revision.versions.all()) == list(first.versions.all())


def test_operators_disable_users_but_not_themselves(operator: Client, alice: Person, bob: Person) -> None:
    olivia = get_user_model().objects.get(username="olivia")
    _action(operator, "auth/user", "disable_users", [bob.user.pk, olivia.pk])
    bob.user.refresh_from_db()
    olivia.refresh_from_db()
    assert not bob.user.is_active
    assert olivia.is_active
    assert AuditEntry.objects.filter(action="user.disable", target="bob", username="olivia").exists()


def test_operators_revoke_tokens(operator: Client, alice: Person) -> None:
    token = ApiToken.objects.get(user=alice.user)
    _action(operator, "accounts/apitoken", "revoke_tokens", [token.pk])
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_the_admin_index_links_to_the_overview(operator: Client) -> None:
    assert b'href="/admin/overview/"' in operator.get("/admin/").content


def test_the_overview_shows_servers_gpus_queue_workers_and_failures(operator: Client, alice: Person, charlie: Person,
                                                                    deployment: Deployment,
                                                                    no_worker_ping: None) -> None:
    from tests.support.versions import make_ready_version

    _server(deployment)
    make_ready_version(charlie, "faces")
    deploy(charlie, "faces-gpu", "faces", runtime="kubernetes", replicas=3, resources={"gpu": 2},
           models=[{"model": "faces", "instance_group": {"kind": "gpu"}}])
    deployment.set_status(Deployment.Status.FAILED, "Revision 1 failed to start: out of memory")
    Event.objects.create(deployment=deployment, kind=Event.Kind.ERROR,
                         message="Revision 1 failed to start: out of memory")
    response = operator.get("/admin/overview/")
    assert response.status_code == 200
    content = response.content.decode()
    assert "18000 / 18001 / 18002" in content
    assert 'alt="gone"' in content  # pid 999999999 is no live tritonserver
    assert response.context["gpus"] == [{"team": "globex", "gpus": 6, "deployments": 1}]
    assert "out of memory" in content
    assert "no worker answered" in content
    assert 'id="overview-queue-depth"' in content


def test_the_overview_counts_the_gateways_5xx_answers_not_only_error_events(
        operator: Client, deployment: Deployment, no_worker_ping: None) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from gateway.models import RequestStats

    now = timezone.now()
    RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=now - timedelta(minutes=5),
                                requests=100, errors=7, codes={"200": 92, "429": 1, "500": 4, "502": 3})
    RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=now - timedelta(minutes=4),
                                requests=50, errors=0, codes={"200": 50})
    RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=now - timedelta(hours=30),
                                requests=10, errors=10, codes={"503": 10})  # outside the 24 hours
    assert not Event.objects.filter(kind=Event.Kind.ERROR).exists()

    response = operator.get("/admin/overview/")

    [row] = response.context["failures"]["gateway"]
    assert (row["deployment"], row["errors"], row["requests"], row["codes"]) == (deployment, 7, 150,
                                                                                 "4 x 500, 3 x 502")
    content = response.content.decode()
    assert 'id="overview-gateway-errors"' in content
    assert "No errors" not in content


def test_the_overview_says_no_errors_only_when_the_gateway_had_none_either(
        operator: Client, deployment: Deployment, no_worker_ping: None) -> None:
    content = operator.get("/admin/overview/").content.decode()
    assert "No errors: no error events, and no 5xx answer from the gateway." in content


def test_the_overview_is_for_staff_only(alice: Person) -> None:
    client = Client()
    client.force_login(alice.user)
    response = client.get("/admin/overview/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_the_queue_depth_of_the_filesystem_broker_counts_its_files(settings: Any, tmp_path: Path) -> None:
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.VAR_DIR = tmp_path
    queue = tmp_path / "celery" / "queue"
    queue.mkdir(parents=True)
    for n in range(3):
        (queue / f"message-{n}.msg").write_text("{}")
    assert overview.queue_depth().value == 3


def test_an_unreachable_redis_broker_is_reported_not_raised(settings: Any) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    probe = overview.queue_depth()
    assert probe.value is None
    assert "did not answer" in probe.note


def test_a_failing_worker_ping_reads_as_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from portal.celery import app

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(app.control, "inspect", broken)
    probe = overview.worker_ping()
    assert probe.value == []
    assert "no worker answered" in probe.note


def test_the_admin_is_branded_modelport_and_links_back_to_the_portal(operator: Client) -> None:
    content = operator.get("/admin/").content.decode()
    assert "Modelport admin" in content and "Django administration" not in content
    assert '<a href="/" id="admin-back-to-portal">Back to the portal</a>' in content
    assert "img/favicon.svg" in content
    assert "<title>Operators’ console | Modelport admin</title>" in content or "| Modelport admin</title>" in content
    assert ">Audit entries<" in content and "entrys" not in content


def test_every_model_in_the_admin_index_reads_as_english(operator: Client) -> None:
    """Django makes a plural by appending an s and a name from the class name: the index read "Model memorys" and
    "Api tokens". Each name shown is checked: no consonant + "ys" plural, acronyms and products spelt as such."""
    import re

    from django.contrib import admin

    content = operator.get("/admin/").content.decode()
    assert ">Model memory measurements<" in content and "memorys" not in content
    assert ">API tokens<" in content and "Api tokens" not in content
    assert ">Triton servers<" in content
    for model in admin.site._registry:
        plural = str(model._meta.verbose_name_plural)
        assert not re.search(r"[^aeiou]ys$", plural), plural
        assert not re.search(r"\b(api|gpu|triton)\b", plural), plural  # spelt API, GPU, Triton
        assert f">{plural[:1].upper()}{plural[1:]}<" in content, plural  # the name shown is this one
