"""The canary in the UI: the edit form offers "Roll out as canary: N%", the deployment page shows the stable and the
canary revision side by side (share, rate, errors, p50/p99) with Promote and Roll back, and another team sees none
of it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from deployments.models import Deployment
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from models_registry.models import ModelVersion
from tests.support.people import Person, signed_in
from web.tests.deploy_forms import EDIT, NEW, as_post, form_data


def ready(client: Any) -> Deployment:
    client.post(NEW, form_data())
    deployment = Deployment.objects.get()
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.READY, upstream_url="http://127.0.0.1:9",
                                                       serving_revision=deployment.revision)
    return Deployment.objects.get()


def start_canary(client: Any, percent: str = "25", **guardrails: str) -> Any:
    edit = client.get(EDIT)
    data = as_post(edit.context["form"], edit.context["model_forms"])
    data["m0-max_queue_delay_microseconds"] = "700"
    data["canary_percent"] = percent
    data.update(guardrails)
    return client.post(EDIT, data)


def test_the_edit_form_sets_the_canary_guardrails(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    ready(client)
    page = client.get(EDIT).content.decode()
    for name, default in (("canary_max_error_percent", "5.0"), ("canary_max_p99_ratio", "2.0"),
                          ("canary_window_seconds", "120"), ("canary_min_requests", "100")):
        assert f'name="{name}" value="{default}"' in page, name
    response = start_canary(client, canary_max_error_percent="1.5", canary_max_p99_ratio="3",
                            canary_window_seconds="300", canary_min_requests="500", canary_auto_promote="on")
    assert response.status_code == 302
    deployment = Deployment.objects.get()
    assert (deployment.canary_max_error_rate, deployment.canary_max_p99_ratio, deployment.canary_window_seconds,
            deployment.canary_min_requests, deployment.canary_auto_promote) == (0.015, 3.0, 300, 500, True)
    page = client.get(f"/deployments/{deployment.name}/").content.decode()
    assert "1.5% errors" in page and "3× the stable p99 over 300 s (errors judged from 500 canary requests" in page
    assert "the p99 from 500 requests of each revision, over a whole window" in page


def test_empty_guardrails_take_their_defaults(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    ready(client)
    assert start_canary(client, canary_max_error_percent="", canary_max_p99_ratio="", canary_window_seconds="",
                        canary_min_requests="").status_code == 302
    deployment = Deployment.objects.get()
    assert (deployment.canary_max_error_rate, deployment.canary_max_p99_ratio, deployment.canary_window_seconds,
            deployment.canary_min_requests, deployment.canary_auto_promote) == (0.05, 2.0, 120, 100, False)


def test_a_guardrail_out_of_range_is_shown_beside_its_field(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    ready(client)
    for field, value, message in (("canary_max_error_percent", "101", "less than or equal to 100"),
                                  ("canary_max_p99_ratio", "0.5", "greater than or equal to 1"),
                                  ("canary_max_p99_ratio", "nan", "Enter a number"),
                                  ("canary_window_seconds", "5", "greater than or equal to 10"),
                                  ("canary_window_seconds", "9" * 30, "less than or equal to 86400"),
                                  ("canary_min_requests", "-1", "greater than or equal to 1")):
        response = start_canary(client, **{field: value})
        assert response.status_code == 200, (field, value)
        assert message in " ".join(response.context["form"].errors[field]), (field, value)
    assert Deployment.objects.get().canary_revision_id is None


def test_the_edit_form_starts_a_canary(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    ready(client)
    assert 'name="canary_percent"' in client.get(EDIT).content.decode()
    assert 'name="canary_percent"' not in client.get(NEW).content.decode()  # nothing to compare a new one with
    response = start_canary(client)
    assert response.status_code == 302
    deployment = Deployment.objects.select_related("canary_revision").get()
    assert deployment.canary_revision.number == 2 and deployment.canary_percent == 25
    assert deployment.revision.number == 1 and deployment.status == Deployment.Status.READY


def test_a_canary_percent_out_of_range_is_shown_beside_the_field(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    ready(client)
    for value in ("0", "100", "x"):
        response = start_canary(client, value)
        assert response.status_code == 200 and response.context["form"].errors["canary_percent"]
    assert Deployment.objects.get().canary_revision_id is None


def test_the_page_shows_both_revisions_side_by_side_with_promote_and_rollback(
        alice: Person, bob: Person, charlie: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    deployment = ready(client)
    start_canary(client)
    page = client.get(f"/deployments/{deployment.name}/").content.decode()
    assert 'id="canary-panel"' in page and "Canary r2" in page and "starting" in page
    assert 'id="canary-promote"' not in page  # not serving yet: only a rollback is offered
    now = timezone.now()
    Deployment.objects.filter(pk=deployment.pk).update(canary_upstream_url="http://127.0.0.1:10",
                                                       canary_launch={"revision_id": 0, "url": "http://127.0.0.1:10",
                                                                      "description": "", "ref": 7},
                                                       canary_serving_since=now - timedelta(seconds=60))
    histogram = [0] * len(LATENCY_BUCKETS_MS)
    histogram[6] = 40  # 7.5-10 ms
    for number, requests, errors in ((1, 120, 0), (2, 40, 4)):
        RequestStats.objects.create(deployment=deployment, revision=number, bucket_start=now - timedelta(seconds=5),
                                    requests=requests, errors=errors, latency_histogram=histogram)
    page = signed_in(bob).get(f"/deployments/{deployment.name}/").content.decode()
    assert "Stable r1" in page and "75%" in page and "25%" in page
    # What the guardrails judge on these figures, and what not yet (a promotion now would not look at the p99).
    assert ("Judged now: error rate not judged: 40 of the 100 requests needed; p99 not judged: 40 of the 100 "
            "requests needed.") in page
    assert "4 (10%)" in page  # the canary's errors
    assert 'id="canary-promote"' in page and 'id="canary-rollback"' in page
    assert signed_in(charlie).post(f"/deployments/{deployment.name}/promote/").status_code == 404
    response = signed_in(bob).post(f"/deployments/{deployment.name}/promote/")
    assert response.status_code == 302
    assert Deployment.objects.select_related("serving_revision").get().serving_revision.number == 2
    assert 'id="canary-panel"' not in client.get(f"/deployments/{deployment.name}/").content.decode()


def test_rolling_back_from_the_page(alice: Person, digits: ModelVersion) -> None:
    client = signed_in(alice)
    deployment = ready(client)
    start_canary(client)
    assert client.post(f"/deployments/{deployment.name}/rollback/").status_code == 302
    row = Deployment.objects.get()
    assert row.canary_revision_id is None and row.serving_revision_id == row.revision_id
    # Without a canary, the buttons' actions say so instead of failing.
    response = client.post(f"/deployments/{deployment.name}/rollback/", follow=True)
    assert "There is no canary to roll back." in response.content.decode()


def test_both_revisions_are_counted_over_the_same_interval_since_the_canary_began(
        alice: Person, digits: ModelVersion) -> None:
    """An 80/20 canary 30 s old showed 14.42 against 0.51 req/s: its 30 s of requests over the panel's 5 minutes."""
    client = signed_in(alice)
    deployment = ready(client)
    start_canary(client, "20")
    now = timezone.now()
    began = now - timedelta(seconds=now.timestamp() % 10) - timedelta(seconds=30)
    Deployment.objects.filter(pk=deployment.pk).update(canary_upstream_url="http://127.0.0.1:10",
                                                       canary_serving_since=began)
    histogram = [0] * len(LATENCY_BUCKETS_MS)
    # Four minutes of the stable revision alone before the canary, then 80/20 for the 30 s since.
    for seconds in range(-240, 0, 10):
        RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=began + timedelta(seconds=seconds),
                                    requests=100, latency_histogram=[100, *histogram[1:]])
    for seconds in range(0, 40, 10):
        for number, requests in ((1, 80), (2, 20)):
            RequestStats.objects.create(deployment=deployment, revision=number,
                                        bucket_start=began + timedelta(seconds=seconds), requests=requests,
                                        latency_histogram=[requests, *histogram[1:]])
    response = client.get(f"/deployments/{deployment.name}/")
    context = response.context["canary"]
    stable, candidate = context["stable"], context["canary"]
    assert (stable["traffic"]["requests"], candidate["traffic"]["requests"]) == (320, 80)
    assert (stable["seen_percent"], candidate["seen_percent"]) == (80, 20)
    ratio = stable["traffic"]["requests_per_second"] / candidate["traffic"]["requests_per_second"]
    assert abs(ratio - 4) < 0.1
    page = response.content.decode()
    assert 'id="canary-since"' in page and "since the canary began serving" in page


def test_the_form_and_the_page_say_the_p99_rule_needs_a_hundred_requests_of_each(
        alice: Person, digits: ModelVersion) -> None:
    """The page promised "2x the stable p99 ... (at least 20 requests)" and a canary was promoted at 2.4x after 25:
    the p99 is judged on 100 requests of each only, which the form, the page and the event now say."""
    client = signed_in(alice)
    deployment = ready(client)
    form = client.get(EDIT).content.decode()
    assert "once each revision has at least 100 requests in it" in form
    start_canary(client, canary_min_requests="20", canary_window_seconds="15", canary_auto_promote="on")
    now = timezone.now()
    Deployment.objects.filter(pk=deployment.pk).update(canary_upstream_url="http://127.0.0.1:10",
                                                       canary_serving_since=now - timedelta(seconds=30))
    fast, slow = [0] * len(LATENCY_BUCKETS_MS), [0] * len(LATENCY_BUCKETS_MS)
    fast[6], slow[9] = 80, 25
    RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=now - timedelta(seconds=5),
                                requests=80, errors=0, latency_histogram=fast)
    RequestStats.objects.create(deployment=deployment, revision=2, bucket_start=now - timedelta(seconds=5),
                                requests=25, errors=0, latency_histogram=slow)
    page = client.get(f"/deployments/{deployment.name}/").content.decode()
    assert "the p99 from 100 requests of each revision, over a whole window" in page
    assert "Judged now: error rate judged on 25 requests; p99 not judged: 25 of the 100 requests needed." in page
    from gateway.canary import judge

    assert judge(deployment.pk).action == "promote"
    event = Deployment.objects.get().events.order_by("-id").values_list("message", flat=True).first()
    assert event is not None and "promoted automatically" in event
    assert "error rate judged on 25 requests; p99 not judged: 25 of the 100 requests needed" in event
