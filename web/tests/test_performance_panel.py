"""The deployment page's performance panel (templates/web/_performance_panel.html): per revision the gateway's
percentiles, per model Triton's means, the batch sizes, a stacked SVG bar of where the time went, the advice, and
the window links."""

from __future__ import annotations

from deployments.models import Deployment
from performance.tests.statistics import gateway_rows, serve, snapshot, triton_row
from tests.support.people import Person, signed_in

PAGE = "/deployments/digits-prod/"


def _traffic(deployment: Deployment) -> Deployment:
    deployment = serve(deployment)
    snapshot(deployment, 10, triton_row("digits", 100, queue_ns=100 * 6_000_000, infer_ns=100 * 1_000_000))
    gateway_rows(deployment, 5, requests=200, latency_ms=9.0)
    snapshot(deployment, 1, triton_row("digits", 300, queue_ns=300 * 6_000_000, infer_ns=300 * 1_000_000,
                                       batches={1: 100, 8: 25}))
    return deployment


def test_the_page_shows_where_the_time_went_with_the_batches_and_the_advice(alice: Person,
                                                                             deployment: Deployment) -> None:
    _traffic(deployment)

    content = signed_in(alice).get(PAGE).content.decode()

    assert 'id="performance"' in content and "last 15m" in content
    assert "200 requests, 1 errors; whole request p50" in content and "its own time 2.00 ms (mean)" in content
    row = content.split('id="perf-r1-digits"')[1].split("</tr>")[0]
    assert ">200<" in row and ">6.000<" in row and ">1.000<" in row and "8 × 25" in row and "86%" in row
    assert 'class="perf-queue"' in content and "<title>digits: queue 6.000 ms</title>" in content
    assert 'id="perf-advice-r1-digits"' in content and "wait in Triton&#x27;s queue" in content


def test_a_window_is_chosen_by_its_link_and_one_not_offered_is_the_default(alice: Person,
                                                                           deployment: Deployment) -> None:
    _traffic(deployment)
    client = signed_in(alice)

    hour = client.get(PAGE + "?window=1h").content.decode()
    odd = client.get(PAGE + "?window=1y").content.decode()

    assert "last 1h" in hour and '<a href="?window=15m#performance">15m</a>' in hour
    assert "last 15m" in odd and "<strong>15m</strong>" in odd


def test_a_deployment_that_never_served_says_so(alice: Person, deployment: Deployment) -> None:
    content = signed_in(alice).get(PAGE).content.decode()

    assert "No revision served in the last 15m." in content


def test_charlie_gets_no_panel_of_alices_deployment(charlie: Person, deployment: Deployment) -> None:
    _traffic(deployment)

    response = signed_in(charlie).get(PAGE)

    assert response.status_code == 404 and b"perf-r1" not in response.content


def test_each_models_row_has_the_gateways_share_and_its_bar_the_gateways_own_time(alice: Person) -> None:
    from tests.support.gateway_calls import make_deployment

    made = make_deployment(alice, "two-models", "http://127.0.0.1:9", ("digits", "resnet"))
    deployment = serve(Deployment.objects.get(pk=made.pk))
    snapshot(deployment, 10, triton_row("digits", 0, batches={}), triton_row("resnet", 0, batches={}))
    gateway_rows(deployment, 5, requests=200, latency_ms=9.0, model="digits", errors=2)
    gateway_rows(deployment, 5, requests=50, latency_ms=4.0, model="resnet", errors=0)
    snapshot(deployment, 1, triton_row("digits", 200, queue_ns=200 * 6_000_000, infer_ns=200 * 1_000_000),
             triton_row("resnet", 50, infer_ns=50 * 1_000_000))

    content = signed_in(alice).get("/deployments/two-models/").content.decode()

    digits = content.split('id="perf-r1-digits"')[1].split("</tr>")[0]
    resnet = content.split('id="perf-r1-resnet"')[1].split("</tr>")[0]
    assert 'id="perf-r1-digits-gateway">200<' in digits and ">2<" in digits and ">2.00<" in digits
    assert 'id="perf-r1-resnet-gateway">50<' in resnet and ">3.00<" in resnet
    # Each bar's gateway part is the gateway's own time on that model: 9 ms less 7.003 in Triton on digits, 4 ms
    # less 1.003 on resnet.
    assert "<title>digits: gateway (own) 1.997 ms</title>" in content
    assert "<title>resnet: gateway (own) 2.997 ms</title>" in content
    assert "250 requests, 2 errors" in content  # the revision's: the sum over its models
