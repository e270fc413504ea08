"""The CLI against the portal's real API, in a thread of this process (pytest-django's live_server): what a CI job
that runs `modelport deploy` again gets from the rules of deployments.actions. No worker runs: what would be
queued for one is recorded instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployments import tasks
from deployments.models import Deployment
from modelport_cli import client as client_module
from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from tests.support.people import Person
from tests.support.versions import make_ready_version

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


# --- A deployment that exists takes the update path (issue 31) ------------------------------------------------
# The CLI used to POST first and PATCH only on a 409; the portal checks a create's body before its name, so anything
# a create would refuse (a placement option alone, a team at its memory ceiling) failed on an existing deployment.


def shown(capsys: pytest.CaptureFixture[str], name: str = "digits-prod") -> dict[str, Any]:
    """The deployment as GET /api/v1/deployments/{name}/ answers it (through `modelport status --json`)."""
    capsys.readouterr()
    assert main(["status", name, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_idle_unload_alone_on_a_shared_deployment_changes_only_the_idle_time(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "digits-prod", "--model", "digits:1", "--shared", "--instances", "2"]) == 0
    before = shown(capsys)
    assert before["placement"]["mode"] == "shared" and before["placement"]["idle_unload_seconds"] not in (300, 3600)

    # As a CI job runs it again (a create of this body is refused: an idle time without mode "shared")...
    assert main(["deploy", "digits-prod", "--model", "digits:1", "--idle-unload", "1h"]) == 0, \
        capsys.readouterr().err
    assert shown(capsys)["placement"] == {**before["placement"], "idle_unload_seconds": 3600}
    # ... and as the docs say: the option alone.
    code = main(["deploy", "digits-prod", "--idle-unload", "5m"])

    assert code == 0, capsys.readouterr().err
    assert "revision 1 updated in place (the idle time: nothing reloads)" in capsys.readouterr().out
    after = shown(capsys)
    assert after["placement"] == {**before["placement"], "idle_unload_seconds": 300}
    # Set in place: an idle time changes nothing of what is served, so no revision (nor a reload) is made for it.
    assert after["revision"] == before["revision"]
    unchanged = ("models", "resources", "replicas", "runtime", "autoscaling")
    assert {key: after[key] for key in unchanged} == {key: before[key] for key in unchanged}


def test_a_pool_given_again_on_a_shared_deployment_is_not_refused(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "digits-prod", "--model", "digits:1", "--shared"]) == 0
    before = shown(capsys)

    assert main(["deploy", "digits-prod", "--model", "digits:1", "--pool", "shared"]) == 0, capsys.readouterr().err
    assert "unchanged" in capsys.readouterr().out
    assert main(["deploy", "digits-prod", "--pool", "shared"]) == 0, capsys.readouterr().err
    assert "unchanged" in capsys.readouterr().out

    assert shown(capsys)["revision"] == before["revision"]


def test_more_instances_with_the_team_at_its_memory_ceiling_updates_the_deployment(
        cli: list[Any], capsys: pytest.CaptureFixture[str], settings: Any) -> None:
    """A CI re-run broke exactly when the team was full: the same body as a create asks for the memory again."""
    # Two deployments of a tiny ONNX model at their derived 384Mi (256Mi for Triton, 128Mi per instance): 768Mi, and
    # a third would not fit.
    settings.TEAM_MAX_MEMORY = "1Gi"
    settings.SANDBOX_SERVER_MEMORY = "256Mi"
    settings.POOL_MODEL_MEMORY_MIN = "128Mi"
    assert main(DEPLOY) == 0
    assert main(["deploy", "other", "--model", "digits:1"]) == 0  # the team is full now
    capsys.readouterr()

    code = main(["deploy", "digits-prod", "--model", "digits:1", "--instances", "2"])

    assert code == 0, capsys.readouterr().err
    deployment = Deployment.objects.get(name="digits-prod")
    assert deployment.revision.spec.models[0].instance_group.count == 2
    # Without --model: the models it serves, at their versions, with the option given.
    assert main(["deploy", "digits-prod", "--instances", "3"]) == 0, capsys.readouterr().err
    entry = Deployment.objects.get(name="digits-prod").revision.spec.models[0]
    assert (entry.name, entry.version, entry.instance_group.count) == ("digits", 1, 3)
    # A new deployment does not fit, and says so in the portal's words.
    assert main(["deploy", "third", "--model", "digits:1"]) == ExitCode.ERROR
    assert "TEAM_MAX_MEMORY" in capsys.readouterr().err


def test_status_shows_the_memory_limit_derived_and_how_and_a_full_team_is_told_the_flag(
        cli: list[Any], capsys: pytest.CaptureFixture[str], settings: Any) -> None:
    settings.TEAM_MAX_MEMORY = "512Mi"
    settings.SANDBOX_SERVER_MEMORY = "256Mi"
    settings.POOL_MODEL_MEMORY_MIN = "128Mi"
    assert main(DEPLOY) == 0
    capsys.readouterr()
    assert main(["status", "digits-prod"]) == 0
    out = capsys.readouterr().out
    assert "memory:    384Mi (derived: Triton's own 256 MiB + 128 MiB for 'digits' (not measured when planned" \
        in out, out
    # Too much for the team: the refusal names the flag that lowers it, with what is free.
    assert main(["deploy", "other", "--model", "digits:1"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "give this deployment at most 128Mi (resources.memory in the API, modelport deploy NAME --memory 128Mi)" \
        in err and "the largest: digits-prod 384Mi" in err, err
    # Measured since it was planned: status says what a new revision would take, and the command that takes it.
    from models_registry.models import ModelVersion, record_memory

    version = ModelVersion.objects.get(model__name="digits", number=1)
    assert record_memory(version.pk, 300 * 2**20, "its use in a dedicated deployment")
    assert main(["status", "digits-prod"]) == 0
    out = capsys.readouterr().out
    assert "measured since: a new revision would take 768Mi (resources.memory in the API, modelport deploy " \
        "digits-prod --memory 768Mi))" in out, out


def test_a_new_deployment_without_a_model_exits_2_saying_to_add_one(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["deploy", "digits-new", "--idle-unload", "5m"])

    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--model" in err and "digits-new" in err
    assert not Deployment.objects.exists()


def test_memory_and_cpu_reach_the_deployment_on_create_and_on_update(
        cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*DEPLOY, "--memory", "512Mi", "--cpu", "1"]) == 0
    assert shown(capsys)["resources"] == {"cpu": "1", "memory": "512Mi", "gpu": 0}

    assert main(["deploy", "digits-prod", "--cpu", "500m"]) == 0, capsys.readouterr().err
    after = shown(capsys)
    assert after["resources"] == {"cpu": "500m", "memory": "512Mi", "gpu": 0}  # the memory kept
    assert after["revision"] == 2
    assert Deployment.objects.get().revision.spec.resources.cpu == "500m"


def test_a_model_the_team_lacks_exits_2_naming_it(cli: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "digits-prod", "--model", "nosuch"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "nosuch" in err
    assert not Deployment.objects.exists()

    assert main(DEPLOY) == 0
    assert main(["deploy", "digits-prod", "--model", "nosuch:1"]) == ExitCode.USAGE  # on the update path too
    assert "nosuch" in capsys.readouterr().err
