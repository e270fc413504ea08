"""The Tune panel says why a setting missed the target and why the current setting was kept (issue 31, item 9):
the rows are what tuning.search records, the message what the runner writes."""

from __future__ import annotations

from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.people import Person, signed_in
from tuning.models import TuneRun
from tuning.search import Config, ConfigResult, Measurement


def test_the_panel_shows_why_a_setting_missed_and_that_the_current_one_was_kept(alice: Person,
                                                                                deployment: Deployment) -> None:
    kept = ConfigResult(Config(1, True, 8, 0), points=[Measurement(8, 1000.0, 4.0, 9.0)], current=True)
    missed = ConfigResult(Config(2), points=[Measurement(16, 900.0, 20.0, 31.0), Measurement(8, 700.0, 15.0, 24.5)])
    dead = ConfigResult(Config(4), error="its Triton did not start: out of memory")
    message = ("Keep the current setting: 1 inst, batch 8, delay 0 µs: 1000 req/s at p99 9.0 ms. 1 inst, batching "
               "off measured 3.0% more than the current setting, within noise (3.0% apart, spread 5.0%): the "
               "current setting is kept.")
    TuneRun.objects.create(
        deployment=deployment, team=deployment.team, model_version=ModelVersion.objects.get(number=1),
        p99_target_ms=20, budget_seconds=60, status="done", request_body={"inputs": []}, message=message,
        results=[r.to_json(20.0) for r in (kept, missed, dead)], frontier=[],
        recommendation={"settings": kept.config.to_json(), "label": kept.config.label(), "throughput": 1000.0,
                        "p50_ms": 4.0, "p99_ms": 9.0, "concurrency": 8, "current": True})
    content = signed_in(alice).get(f"/deployments/{deployment.name}/").content.decode()
    assert "within noise (3.0% apart, spread 5.0%): the current setting is kept." in content
    assert ("p99 ≤ 20 ms not met at any concurrency measured (16 clients: p99 31.0 ms; 8 clients: p99 24.5 ms)"
            in content)
    assert "its Triton did not start: out of memory" in content
    assert "(missed the target)" not in content
