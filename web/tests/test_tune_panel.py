"""The deployment page's Tune panel (form, progress through the live refresh, chart, table, Apply) and the deploy
form's suggestion of the last tune's settings. The worker is not run: tunes are made as it leaves them."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment, Revision
from models_registry.models import ModelVersion
from tests.support.deploying import huge_input
from tests.support.people import Person, signed_in
from tuning.models import TuneRun
from web.tune_chart import frontier_svg

PAGE = "/deployments/digits-prod/"
POINTS = [{"concurrency": 1, "throughput": 100.0, "p50_ms": 5.0, "p99_ms": 8.0, "errors": 0},
          {"concurrency": 4, "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0, "errors": 0},
          {"concurrency": 8, "throughput": 320.0, "p50_ms": 20.0, "p99_ms": 40.0, "errors": 0}]
RECOMMENDATION = {"settings": {"instances": 2, "batching": True, "max_batch_size": 16, "queue_delay_us": 500},
                  "label": "2 inst, batch 16, delay 500 µs", "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0,
                  "concurrency": 4}


def finished(deployment: Deployment, **fields: Any) -> TuneRun:
    values: dict[str, Any] = {
        "deployment": deployment, "team": deployment.team, "model_version": ModelVersion.objects.get(number=1),
        "p99_target_ms": 20, "budget_seconds": 60, "status": "done", "request_body": {"inputs": []},
        "host": "box", "machine": {"hostname": "box", "cpu_model": "Test CPU", "cores": 2, "gpu": "none"},
        "results": [{"settings": RECOMMENDATION["settings"], "label": RECOMMENDATION["label"], "error": "",
                     "meets_target": True, "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0, "concurrency": 4,
                     "errors": 0, "points": POINTS}],
        "frontier": [{"throughput": p["throughput"], "p99_ms": p["p99_ms"], "concurrency": p["concurrency"]}
                     for p in POINTS],
        "recommendation": RECOMMENDATION, "message": "Recommended.",
    }
    values.update(fields)
    return TuneRun.objects.create(**values)


def test_the_panel_offers_a_tune_and_queues_one(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    content = client.get(PAGE).content.decode()
    assert 'id="tune-form"' in content and 'id="tune-none"' in content
    response = client.post(f"{PAGE}tune/", {"p99_ms": "25", "budget_seconds": "300", "concurrency_max": "8"})
    assert response.status_code == 302
    tune = TuneRun.objects.get()
    assert (tune.p99_target_ms, tune.budget_seconds, tune.concurrency_max) == (25, 300, 8)
    assert tune.request_body["inputs"][0]["name"] == "x"
    live = client.get(f"{PAGE}live/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="tune-status" hx-swap-oob="true"' in live and "Waiting to start." in live


def test_bad_tune_input_is_reported_not_queued(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    response = client.post(f"{PAGE}tune/", {"p99_ms": "0", "budget_seconds": "5", "concurrency_max": "x"},
                           follow=True)
    content = response.content.decode()
    assert "Not tuned:" in content and "p99 target" in content
    assert not TuneRun.objects.exists()


def test_progress_shows_while_it_runs(alice: Person, deployment: Deployment) -> None:
    finished(deployment, status="running", configs_done=3, configs_planned=9, eta_seconds=42.0, recommendation=None,
             results=[], frontier=[])
    content = signed_in(alice).get(PAGE).content.decode()
    assert "Settings measured: 3 of about 9, about 42 s left." in content
    assert 'id="tune-cancel"' in content and 'id="tune-start" disabled' in content


def test_a_finished_tune_shows_chart_table_and_apply_that_makes_a_revision(alice: Person,
                                                                           deployment: Deployment) -> None:
    tune = finished(deployment)
    client = signed_in(alice)
    content = client.get(PAGE).content.decode()
    assert '<svg class="tune-chart" id="tune-chart"' in content
    assert 'id="tune-results"' in content and "2 inst, batch 16, delay 500 µs" in content
    assert "Measured on box (Test CPU, 2 cores, GPU: none)" in content
    assert 'id="tune-apply"' in content
    # Every change shows before Apply; the one that narrows what clients may send needs its own checkbox.
    assert "digits: max_batch_size 64 → 16 (a request of more than 16 rows, accepted today, would be refused" in content
    assert "digits: instances 1 → 2" in content and "digits: max_queue_delay_microseconds 0 → 500" in content
    assert 'id="tune-apply-narrow" required' in content
    refused = client.post(f"{PAGE}tunes/{tune.pk}/apply/", follow=True).content.decode()
    assert "would narrow what clients may send: digits: max_batch_size 64 → 16" in refused
    assert Revision.objects.filter(deployment=deployment).count() == 1
    applied = client.post(f"{PAGE}tunes/{tune.pk}/apply/", {"narrow": "on"}, follow=True).content.decode()
    assert "Changed: digits: max_batch_size 64 → 16" in applied
    [entry] = Revision.objects.get(deployment=deployment, number=2).spec.models
    assert entry.instance_group.count == 2 and entry.max_batch_size == 16
    assert "Applied as revision 2." in client.get(PAGE).content.decode()


def test_applying_what_serves_already_says_nothing_changed_not_applied_as_a_revision(alice: Person,
                                                                                   deployment: Deployment) -> None:
    first, second = finished(deployment), finished(deployment)
    client = signed_in(alice)
    client.post(f"{PAGE}tunes/{first.pk}/apply/", {"narrow": "on"})
    assert Revision.objects.filter(deployment=deployment).count() == 2
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", serving_revision=Revision.objects.get(number=2))

    applied = client.post(f"{PAGE}tunes/{second.pk}/apply/", {"narrow": "on"}, follow=True).content.decode()

    assert Revision.objects.filter(deployment=deployment).count() == 2  # nothing to roll out
    assert "nothing to roll out" in applied
    content = client.get(PAGE).content.decode()
    assert "Applied: nothing changed, revision 2 serves these settings already." in content
    assert "Applied as revision" not in content

def test_apply_as_a_canary_from_the_panel(alice: Person, deployment: Deployment) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", serving_revision=deployment.revision,
                                                       upstream_url="http://127.0.0.1:9")
    tune = finished(deployment)
    client = signed_in(alice)
    assert 'id="tune-apply-canary"' in client.get(PAGE).content.decode()
    for bad in ("0", "100", "ten", "²", "9" * 5000, "0" * 5000 + "15"):
        content = client.post(f"{PAGE}tunes/{tune.pk}/apply/", {"canary_percent": bad}, follow=True).content.decode()
        assert "A canary takes 1 to 99 percent of the requests" in content
    assert Revision.objects.filter(deployment=deployment).count() == 1
    content = client.post(f"{PAGE}tunes/{tune.pk}/apply/", {"canary_percent": "15", "narrow": "on"},
                          follow=True).content.decode()
    assert "rolls out the tuned settings as a canary for 15% of the requests" in content
    deployment.refresh_from_db()
    assert deployment.canary_revision.number == 2 and deployment.canary_percent == 15
    assert deployment.serving_revision.number == 1


def test_charlie_cannot_tune_apply_or_cancel(charlie: Person, deployment: Deployment) -> None:
    tune = finished(deployment, status="running")
    client = signed_in(charlie)
    assert client.post(f"{PAGE}tune/", {"p99_ms": "25", "budget_seconds": "300", "concurrency_max": "8"}
                       ).status_code == 404
    assert client.post(f"{PAGE}tunes/{tune.pk}/apply/").status_code == 404
    assert client.post(f"{PAGE}tunes/{tune.pk}/cancel/").status_code == 404
    tune.refresh_from_db()
    assert tune.status == "running" and not tune.cancel_requested


def test_the_deploy_form_suggests_the_last_tune_and_uses_it(alice: Person, deployment: Deployment) -> None:
    finished(deployment)
    client = signed_in(alice)
    content = client.get("/deployments/new/?model=digits").content.decode()
    assert 'id="tuned-suggestion"' in content and "Tuned on box" in content
    assert "2 inst, batch 16, delay 500 µs" in content and 'id="tuned-use"' in content
    response = client.get("/deployments/new/?model=digits&version=1&tuned=1")
    [form] = response.context["model_forms"]
    assert form.initial["instance_count"] == 2
    assert form.initial["max_batch_size"] == 16
    assert form.initial["max_queue_delay_microseconds"] == 500
    assert form.initial["dynamic_batching"] is True


def test_the_chart_escapes_and_scales() -> None:
    svg = str(frontier_svg([{"points": POINTS}], [{"throughput": 300.0, "p99_ms": 15.0}], 20.0,
                           {**RECOMMENDATION, "label": "<script>x</script>"}))
    assert svg.startswith("<svg") and "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count("<circle") == len(POINTS) + 1
    assert str(frontier_svg([], [], 20.0, None)) == ""


def test_a_generated_request_the_gateway_would_refuse_is_reported_not_queued(alice: Person,
                                                                            deployment: Deployment) -> None:
    huge_input(deployment)
    content = signed_in(alice).post(f"{PAGE}tune/", {"p99_ms": "25", "budget_seconds": "300", "concurrency_max": "8"},
                                    follow=True).content.decode()
    assert "Not tuned: the generated request cannot be sent" in content
    assert not TuneRun.objects.exists()


def test_applying_the_settings_that_serve_already_from_the_panel_rolls_nothing_out(
        alice: Person, deployment: Deployment) -> None:
    first, second = finished(deployment), finished(deployment)
    client = signed_in(alice)
    client.post(f"{PAGE}tunes/{first.pk}/apply/", {"narrow": "on"})  # the tune's batch size is below the default
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", serving_revision=Revision.objects.get(number=2),
                                                       upstream_url="http://127.0.0.1:9")
    content = client.post(f"{PAGE}tunes/{second.pk}/apply/", {"canary_percent": "15"}, follow=True).content.decode()
    assert "A canary needs a change: these are the settings in effect already: apply it to every request" in content
    content = client.post(f"{PAGE}tunes/{second.pk}/apply/", follow=True).content.decode()
    assert "The tuned settings are the ones serving already: nothing to roll out." in content
    assert Revision.objects.filter(deployment=deployment).count() == 2
    assert Deployment.objects.get().canary_revision_id is None


def test_the_tune_form_keeps_the_values_the_last_tune_ran_with(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    client.post(f"{PAGE}tune/", {"p99_ms": "12.5", "budget_seconds": "600", "concurrency_max": "32"})
    form = client.get(PAGE).context["tune_form"]
    assert (form["p99_ms"].value(), form["budget_seconds"].value(), form["concurrency_max"].value()) == (12.5, 600, 32)
    content = client.get(PAGE).content.decode()
    assert 'value="12.5"' in content and 'value="32"' in content
    assert '<option value="600" selected>' in content


def test_the_charts_labels_are_legible() -> None:
    import re

    points = [{**p, "throughput": p["throughput"] * 10} for p in POINTS]  # thousands of requests per second
    svg = str(frontier_svg([{"points": points}], [], 20.0, None))
    sizes = {name: int(size) for name, size in re.findall(r"\.(tick|axis)\{font-size:(\d+)px", svg)}
    assert sizes["tick"] >= 12 and sizes["axis"] >= 13
    ticks = re.findall(r'class="tick">([^<]+)<', svg)
    assert "2,500" in ticks and "12.5" in ticks and "0" in ticks, ticks
    assert not any(re.search(r"\.\d{3}", t) for t in ticks), ticks
    assert "p99 latency (ms)" in svg and "requests/s" in svg
