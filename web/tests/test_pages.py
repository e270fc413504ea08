"""Every page renders for its team; nothing of another team exists for charlie (404); list pages keep their number
of queries when their rows grow."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.context import SESSION_TEAM_KEY
from accounts.models import ApiToken, Membership
from deployments.models import Deployment, Event
from models_registry.models import Model, ModelVersion
from tests.support.deploying import deploy
from tests.support.people import Person, signed_in
from tests.support.versions import make_ready_version

ALICES_PAGES = [
    "/",
    "/dashboard/live/",
    "/models/",
    "/models/digits/",
    "/models/digits/versions/",
    "/models/upload/",
    "/models/upload/?model=digits",
    "/deployments/new/",
    "/deployments/new/?model=digits",
    "/deployments/new/?model=digits&version=1",
    "/deployments/digits-prod/",
    "/deployments/digits-prod/edit/",
    "/deployments/digits-prod/live/",
    "/deployments/digits-prod/logs/",
    "/deployments/digits-prod/delete/",
    "/tokens/",
]

# Pages naming something of alice's team: they do not exist for charlie.
ALICES_THINGS = [
    "/models/digits/",
    "/models/digits/versions/",
    "/deployments/new/?model=digits",
    "/deployments/digits-prod/",
    "/deployments/digits-prod/edit/",
    "/deployments/digits-prod/live/",
    "/deployments/digits-prod/logs/",
    "/deployments/digits-prod/delete/",
]


# The fragments htmx polls (no page around them), each with what it must show.
FRAGMENTS = {
    "/dashboard/live/": "digits-prod",
    "/models/digits/versions/": "<caption class=\"visually-hidden\">Versions of digits</caption>",
    "/deployments/digits-prod/live/": "digits-prod",
    "/deployments/digits-prod/logs/": "No log yet: Triton starts once the model repository is rendered.",
}


@pytest.mark.parametrize("url", ALICES_PAGES)
def test_every_page_renders_for_alice(alice: Person, deployment: Deployment, url: str) -> None:
    response = signed_in(alice).get(url)
    assert response.status_code == 200, response.content[:2000]
    content = response.content.decode()
    if url in FRAGMENTS:  # what the page polls: its own content, for alice's deployment or model
        assert FRAGMENTS[url] in content, content[:2000]
        return
    assert '<span class="team-name" id="current-team">Team <strong>acme</strong></span>' in content, content[:2000]
    if url in ALICES_THINGS:
        assert "digits" in content


@pytest.mark.parametrize("url", ALICES_THINGS)
def test_charlie_gets_a_404_for_everything_of_alices_team(alice: Person, charlie: Person, deployment: Deployment,
                                                         url: str) -> None:
    response = signed_in(charlie).get(url)
    assert response.status_code == 404
    assert b"digits" not in response.content


@pytest.mark.parametrize("action", ["stop", "start", "delete", "edit"])
def test_charlie_cannot_change_alices_deployment(alice: Person, charlie: Person, deployment: Deployment,
                                                 action: str) -> None:
    response = signed_in(charlie).post(f"/deployments/digits-prod/{action}/", {"replicas": 1})
    assert response.status_code == 404
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.RUNNING
    assert deployment.revision.number == 1


def test_charlie_sees_none_of_alices_models_or_deployments_in_his_lists(alice: Person, charlie: Person,
                                                                        deployment: Deployment) -> None:
    client = signed_in(charlie)
    for url in ["/", "/dashboard/live/", "/models/", "/deployments/new/"]:
        response = client.get(url)
        assert response.status_code == 200
        # Not "digits" alone: the empty dashboard offers the sample digits classifier.
        for trace in [b"digits-prod", b"model-row-digits", b"deploy-model-digits", b"digits&nbsp;v1"]:
            assert trace not in response.content, (url, trace)


def test_bob_sees_the_models_and_deployments_of_his_team(bob: Person, deployment: Deployment) -> None:
    client = signed_in(bob)
    assert client.get("/models/digits/").status_code == 200
    assert client.get("/deployments/digits-prod/").status_code == 200
    assert b"digits-prod" in client.get("/").content


def test_anonymous_visitors_are_sent_to_sign_in(db: Any) -> None:
    response = Client().get("/models/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/models/"


def test_alice_signs_in_and_out(alice: Person) -> None:
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'id="login-submit"' in page.content
    response = client.post("/login/", {"username": "alice", "password": "password"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_a_wrong_password_is_shown_on_the_sign_in_form(alice: Person) -> None:
    response = Client().post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


def test_a_new_user_is_told_to_upload_a_first_model(alice: Person) -> None:
    for url in ["/", "/models/", "/deployments/new/"]:
        response = signed_in(alice).get(url)
        assert b"Upload your first model" in response.content, url


def test_with_models_but_no_deployment_the_dashboard_says_how_to_deploy(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).get("/")
    assert b'id="no-deployments"' in response.content
    assert b"Upload your first model" not in response.content


def test_a_user_in_no_team_is_told_to_ask_for_one(db: Any) -> None:
    user = get_user_model().objects.create_user("dave", password="password")
    client = Client()
    client.force_login(user)
    response = client.get("/models/")
    assert response.status_code == 403
    assert b"You are not in a team yet" in response.content


def test_the_dashboard_lists_deployments_with_status_and_recent_events(alice: Person, deployment: Deployment) -> None:
    response = signed_in(alice).get("/")
    content = response.content.decode()
    assert 'id="deployment-row-digits-prod"' in content
    assert "status-pending" in content
    assert "digits&nbsp;v1" in content
    assert "no traffic in the last 5 min" in content
    assert "Created by alice with revision 1." in content
    assert 'hx-trigger="every 2s"' in content


def test_the_dashboard_shows_request_rate_and_latency_from_the_gateway(alice: Person, deployment: Deployment) -> None:
    from django.apps import apps
    from django.utils import timezone

    if not apps.is_installed("gateway"):
        pytest.skip("the gateway app is not installed")
    from gateway.models import LATENCY_BUCKETS_MS, RequestStats

    histogram = [0] * len(LATENCY_BUCKETS_MS)
    histogram[LATENCY_BUCKETS_MS.index(5)] = 60  # every request took 3-5 ms
    RequestStats.objects.create(deployment=deployment, bucket_start=timezone.now().replace(microsecond=0),
                                requests=60, errors=3, latency_sum_ms=240, latency_histogram=histogram,
                                codes={"200": 55, "400": 2, "502": 3})
    # Older than the window both pages show: not counted.
    RequestStats.objects.create(deployment=deployment, bucket_start=timezone.now() - timedelta(minutes=6),
                                requests=1000, latency_histogram=histogram, codes={"200": 1000})
    content = signed_in(alice).get("/dashboard/live/").content.decode()
    assert "no traffic" not in content
    assert "(last 5 min)" in content
    row = content[content.index('id="deployment-row-digits-prod"'):]
    assert '<td class="num" title="0.20 requests/s">60</td>' in row  # 60 requests in the last 5 minutes
    assert ">5.0%<" in row and "HTTP 200: 55, HTTP 400: 2, HTTP 502: 3" in row  # errors: the 502s
    assert " ms" in row

    metrics = alice.client().get("/api/v1/deployments/digits-prod/metrics/?minutes=5").json()
    assert metrics["requests"] == 60 and metrics["error_rate"] == 0.05
    assert metrics["codes"] == {"200": 55, "400": 2, "502": 3}
    page = signed_in(alice).get("/deployments/digits-prod/").content.decode()
    assert 'data-metrics-url="/api/v1/deployments/digits-prod/metrics/?minutes=5"' in page
    assert "last 5 minutes, as on the dashboard" in page


def test_the_model_page_shows_versions_sizes_statuses_signatures_and_deploy_buttons(alice: Person,
                                                                                   digits: ModelVersion) -> None:
    ModelVersion.objects.create(model=digits.model, number=2, status=ModelVersion.Status.INVALID, format="onnx",
                                size=3 * 1024**2, error="The file is not a valid ONNX model.", created_by=alice.user)
    content = signed_in(alice).get("/models/digits/").content.decode()
    assert 'id="version-1"' in content and 'id="version-2"' in content
    assert "3.0\xa0MB" in content
    assert "The file is not a valid ONNX model." in content
    assert 'id="deploy-version-1"' in content
    assert 'id="deploy-version-2"' not in content  # an invalid version cannot be deployed
    assert "<code>x</code>" in content and "-1 × 4" in content
    assert "alice" in content


def test_the_versions_table_polls_only_while_a_version_is_being_inspected(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    assert b"hx-trigger" not in client.get("/models/digits/versions/").content
    ModelVersion.objects.create(model=digits.model, number=2, status=ModelVersion.Status.VALIDATING)
    assert b'hx-trigger="every 2s"' in client.get("/models/digits/versions/").content


# --- Team switcher ----------------------------------------------------------------------------------------------


def test_the_team_switcher_changes_the_team_alice_works_in(alice: Person, charlie: Person,
                                                           digits: ModelVersion) -> None:
    Membership.objects.create(user=alice.user, team=charlie.team)
    make_ready_version(charlie, "faces")
    client = signed_in(alice)
    page = client.get("/models/").content.decode()
    assert 'id="team-switcher"' in page
    assert "digits" in page and "faces" not in page
    response = client.post("/team/", {"team": charlie.team.pk})
    assert response.status_code == 302
    assert client.session[SESSION_TEAM_KEY] == charlie.team.pk
    page = client.get("/models/").content.decode()
    assert "faces" in page and "model-row-digits" not in page
    assert client.get("/models/digits/").status_code == 404


@pytest.mark.parametrize("team", ["other", "", "999999"])
def test_switching_to_a_team_alice_is_not_in_is_a_404(alice: Person, charlie: Person, team: str) -> None:
    client = signed_in(alice)
    value = str(charlie.team.pk) if team == "other" else team
    assert client.post("/team/", {"team": value}).status_code == 404
    assert SESSION_TEAM_KEY not in client.session


def test_the_team_switcher_takes_only_posts(alice: Person) -> None:
    assert signed_in(alice).get("/team/").status_code == 405


# --- Query counts -----------------------------------------------------------------------------------------------


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_the_dashboard_makes_the_same_queries_for_one_deployment_or_many(alice: Person, digits: ModelVersion,
                                                                        django_assert_max_num_queries: Any) -> None:
    client = signed_in(alice)
    deploy(alice, "one")
    few = _queries(client, "/")
    for n in range(6):
        deployment = deploy(alice, f"more-{n}")
        Event.objects.create(deployment=deployment, message="something happened")
    assert _queries(client, "/") == few
    assert _queries(client, "/dashboard/live/") <= few
    with django_assert_max_num_queries(8):
        client.get("/")


def test_the_models_list_makes_the_same_queries_for_one_model_or_many(alice: Person,
                                                                     django_assert_max_num_queries: Any) -> None:
    client = signed_in(alice)
    Model.objects.create(team=alice.team, name="first", created_by=alice.user)
    few = _queries(client, "/models/")
    for n in range(6):
        model = Model.objects.create(team=alice.team, name=f"model-{n}", created_by=alice.user)
        for number in (1, 2):
            ModelVersion.objects.create(model=model, number=number, status=ModelVersion.Status.READY, format="onnx",
                                        created_by=alice.user)
    assert _queries(client, "/models/") == few
    with django_assert_max_num_queries(6):
        client.get("/models/")


def test_the_versions_table_makes_the_same_queries_for_one_version_or_many(alice: Person, digits: ModelVersion,
                                                                          django_assert_max_num_queries: Any) -> None:
    client = signed_in(alice)
    few = _queries(client, "/models/digits/")
    for number in range(2, 8):
        ModelVersion.objects.create(model=digits.model, number=number, status=ModelVersion.Status.READY, format="onnx",
                                    signature=digits.signature, created_by=alice.user)
    assert _queries(client, "/models/digits/") == few
    with django_assert_max_num_queries(7):
        client.get("/models/digits/")


def test_the_tokens_page_makes_the_same_queries_for_one_token_or_many(alice: Person, charlie: Person,
                                                                     django_assert_max_num_queries: Any) -> None:
    client = signed_in(alice)
    few = _queries(client, "/tokens/")
    Membership.objects.create(user=alice.user, team=charlie.team)
    for n in range(6):
        ApiToken.issue(alice.user, charlie.team if n % 2 else alice.team, name=f"t{n}")
    assert _queries(client, "/tokens/") == few
    with django_assert_max_num_queries(6):
        client.get("/tokens/")


def test_a_pipeline_model_page_draws_the_pipeline(alice: Any, client: Any) -> None:
    from models_registry.models import Model, ModelVersion

    model = Model.objects.create(team=alice.team, name="digits-pipeline")
    ModelVersion.objects.create(model=model, number=1, format="ensemble", status="ready", definition={
        "inputs": [{"name": "image", "datatype": "BYTES", "dims": [-1, 1]}],
        "outputs": [{"name": "labels", "datatype": "BYTES", "dims": [-1, 3]}],
        "steps": [{"model": "preprocess", "version": 1, "input_map": {"image": "image"},
                   "output_map": {"pixels": "pixels"}},
                  {"model": "postprocess", "version": 1, "input_map": {"pixels": "pixels"},
                   "output_map": {"labels": "labels"}}],
    })
    client.force_login(alice.user)
    response = client.get("/models/digits-pipeline/")
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="pipeline-title"' in body
    assert "<svg" in body and "preprocess" in body and "postprocess" in body


def test_every_page_has_a_favicon_and_a_link_to_the_api_docs(alice: Person) -> None:
    content = signed_in(alice).get("/").content.decode()
    assert '<link rel="icon" href="/static/img/favicon.svg" type="image/svg+xml">' in content
    assert '<a href="/api/v1/docs/" id="nav-api-docs">API docs</a>' in content
    assert Client().get("/static/img/favicon.svg").status_code == 200


def test_wide_tables_carry_a_hint_that_they_scroll(alice: Person, deployment: Deployment) -> None:
    content = signed_in(alice).get("/dashboard/live/").content.decode()
    wrap = content.index('<div class="table-wrap">')
    assert content.index('class="scroll-hint"') > wrap
