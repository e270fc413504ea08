"""The CLI against the portal's real API, in a thread of this process (pytest-django's live_server): what a CI job
that runs `modelport deploy` again gets from the rules of deployments.actions. No worker runs: what would be
queued for one is recorded instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Person
from deployments import tasks
from deployments.models import Deployment
from deployments.tests.conftest import make_ready_version
from modelport_cli import client as client_module
from modelport_cli.errors import ExitCode
from modelport_cli.main import main

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(alice: Person, live_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, ...]]:
    """The environment a CI job sets, and the reconcile tasks the portal would hand a worker."""
    monkeypatch.setenv("MODELPORT_URL", live_server.url)
    monkeypatch.setenv("MODELPORT_TOKEN", alice.token)
    monkeypatch.setenv("MODELPORT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(client_module, "RETRY_DELAYS", ())
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", lambda args, **options: sent.append(tuple(args)))
    make_ready_version(alice, "digits")
    return sent


DEPLOY = ["deploy", "digits-prod", "--model", "digits:1", "--instances", "1"]


def test_deploying_the_same_settings_again_makes_no_revision_and_says_unchanged(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(DEPLOY) == 0
    assert capsys.readouterr().out == "digits-prod: revision 1 created (pending)\n"
    Deployment.objects.update(status=Deployment.Status.READY, reconcile_due_at=None)
    cli.clear()

    assert main(DEPLOY) == 0

    assert capsys.readouterr().out == ("digits-prod: revision 1 unchanged (these are the settings in effect already) "
                                       "(ready)\n")
    deployment = Deployment.objects.get()
    assert deployment.revisions.count() == 1 and deployment.status == Deployment.Status.READY
    assert cli == []  # nothing rolls out


def test_a_canary_of_the_same_settings_exits_1_saying_a_canary_needs_a_change(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(DEPLOY) == 0
    deployment = Deployment.objects.get()
    Deployment.objects.update(status=Deployment.Status.READY, serving_revision=deployment.revision)
    capsys.readouterr()

    assert main([*DEPLOY, "--canary", "10"]) == ExitCode.ERROR

    err = capsys.readouterr().err
    assert "a canary needs a change: these are the settings in effect already" in err and "HTTP 400" in err
    assert Deployment.objects.get().canary_revision_id is None


def test_a_changed_setting_makes_the_next_revision(cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(DEPLOY) == 0
    capsys.readouterr()

    assert main(["deploy", "digits-prod", "--model", "digits:1", "--instances", "2"]) == 0

    assert capsys.readouterr().out == "digits-prod: revision 2 updated (pending)\n"
    assert Deployment.objects.get().revision.spec.models[0].instance_group.count == 2
