"""/metrics: closed unless the operator opens it (a token, or METRICS_OPEN), in development too, and its series are
labelled by team and deployment, so two teams' deployments of the same name never add up into one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import Client
from prometheus_client import generate_latest

from gateway import metrics_server, stats
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

TOKEN = "t" * 12 + "Xy7#pQ2$wE9!"


def scrape(headers: dict[str, str] | None = None) -> Any:
    return Client().get("/metrics", headers=headers or {})


@pytest.mark.django_db
def test_metrics_are_closed_without_a_token_or_an_explicit_opening(settings: Any) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = "", False
    response = scrape()
    assert response.status_code == 403
    assert "METRICS_TOKEN" in response.content.decode() and "METRICS_OPEN=true" in response.content.decode()
    assert b"modelport_gateway" not in response.content
    # The gRPC gateway's own /metrics answers the same.
    status, _, body = metrics_server.answer(b"GET /metrics HTTP/1.1\r\n\r\n", "", False)
    assert status == 403 and b"METRICS_OPEN" in body


@pytest.mark.django_db
def test_an_operator_opens_them_explicitly(settings: Any) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = "", True
    response = scrape()
    assert response.status_code == 200 and b"modelport_gateway_requests_total" in response.content
    assert metrics_server.answer(b"GET /metrics HTTP/1.1\r\n\r\n", "", True)[0] == 200


@pytest.mark.django_db
@pytest.mark.parametrize("authorization", [
    "", "Bearer", "Bearer ", "Basic " + TOKEN, "Bearer " + TOKEN[:-1], "Bearer " + TOKEN + "x", TOKEN,
    "Bearer " + "\u00e9" * 40, "Bearer " + "x" * 100_000,
])
def test_with_a_token_every_other_authorization_is_refused_even_when_open(settings: Any, authorization: str) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = TOKEN, True
    response = scrape({"Authorization": authorization} if authorization else {})
    assert response.status_code == 401
    assert response.content == b"metrics need 'Authorization: Bearer <METRICS_TOKEN>'\n"
    head = b"GET /metrics HTTP/1.1\r\nAuthorization: " + authorization.encode() + b"\r\n\r\n"
    assert metrics_server.answer(head, TOKEN, True)[0] == 401


@pytest.mark.django_db
def test_the_token_holder_scrapes_them(settings: Any) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = TOKEN, False
    for scheme in ("Bearer", "bearer"):
        assert scrape({"Authorization": f"{scheme} {TOKEN}"}).status_code == 200


def series(metric: str, deployment: str) -> dict[str, float]:
    """team -> value of `metric`'s samples for `deployment`, from the exposition Prometheus reads."""
    found: dict[str, float] = {}
    for family in stats.REQUESTS.collect() + stats.IN_FLIGHT.collect():
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("deployment") == deployment:
                team = sample.labels["team"]
                found[team] = found.get(team, 0.0) + sample.value
    return found


def test_two_teams_deployments_of_one_name_have_series_of_their_own(
    people: dict[str, Person], gateway_app: Any
) -> None:
    alice, charlie = people["alice"], people["charlie"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "same-name", upstream.url)
            await asyncio.to_thread(make_deployment, charlie, "same-name", upstream.url)
            app = gateway_app()
            for _ in range(3):
                assert (await call(app, "GET", "/serve/same-name/v2/models/digits/ready", token=alice.token)).status \
                    == 200
            assert (await call(app, "GET", "/serve/same-name/v2/models/digits/ready", token=charlie.token)).status \
                == 200

    run(scenario)
    assert series("modelport_gateway_requests_total", "same-name") == {"acme": 3.0, "globex": 1.0}
    assert series("modelport_gateway_in_flight_requests", "same-name") == {"acme": 0.0, "globex": 0.0}
    text = generate_latest().decode()
    assert ('modelport_gateway_requests_total{code="200",deployment="same-name",model="digits",revision="1",'
            'team="acme"} 3.0') in text
    assert ('modelport_gateway_request_duration_seconds_count{deployment="same-name",model="digits",revision="1",'
            'team="globex"} 1.0') in text


def test_the_in_flight_gauge_counts_each_teams_requests_while_they_wait_and_after_a_deployment_comes_back(
    people: dict[str, Person], gateway_app: Any
) -> None:
    """The gateway keeps each deployment's in-flight child (gateway/stats.py): it is the series /metrics shows,
    counts only its own team's requests, and still is after the deployment is deleted and made again by that name
    (the same labels), by the same gateway."""
    alice, charlie = people["alice"], people["charlie"]
    url = "/serve/waiting/v2/models/digits/ready"

    async def scenario() -> None:
        release = asyncio.Event()

        async def held(request: Any) -> bytes:
            await release.wait()
            return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

        async with FakeUpstream(answer=held) as upstream:
            await asyncio.to_thread(make_deployment, alice, "waiting", upstream.url)
            await asyncio.to_thread(make_deployment, charlie, "waiting", upstream.url)
            app = gateway_app()
            for round_ in range(2):
                calls = [asyncio.ensure_future(call(app, "GET", url, token=person.token))
                         for person in (alice, alice, charlie)]
                while len(upstream.requests) < 3 * (round_ + 1):
                    await asyncio.sleep(0.01)
                assert series("modelport_gateway_in_flight_requests", "waiting") == {"acme": 2.0, "globex": 1.0}
                release.set()
                assert [reply.status for reply in await asyncio.gather(*calls)] == [200, 200, 200]
                assert series("modelport_gateway_in_flight_requests", "waiting") == {"acme": 0.0, "globex": 0.0}
                release.clear()
                if round_ == 0:
                    from deployments.models import Deployment

                    await asyncio.to_thread(lambda: Deployment.objects.filter(team=alice.team, name="waiting").delete())
                    await asyncio.sleep(0.6)  # past GATEWAY_CACHE_TTL_SECONDS: the gateway sees the new row
                    await asyncio.to_thread(make_deployment, alice, "waiting", upstream.url)

    run(scenario)
