"""push --from against the portal's real API, in a thread of this process (pytest-django's live_server): the body
the CLI sends is the one the API takes (source, create_model, new_version), the same source twice is the same
version, and the API's refusal of a source reaches the user as one line. No worker runs: the import queued for one
is recorded instead; and the mlflow kind's fetcher (another part of issue 35, not merged here) is a stub that
accepts any models:/ URI, so what is checked is the API's front door and the CLI's handling of it, not a fetch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelport_cli import client as client_module
from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from models_registry import sources, tasks
from models_registry.models import ModelVersion
from tests.support.people import Person

pytestmark = pytest.mark.django_db(transaction=True)


class StubMlflowFetcher:
    kind = "mlflow"

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        return {"uri": source["uri"]}

    def identity(self, source: dict[str, Any]) -> str:
        return f"mlflow:{source['uri']}"


fetcher = StubMlflowFetcher()


@pytest.fixture
def push_cli(alice: Person, live_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, ...]]:
    monkeypatch.setenv("MODELPORT_URL", live_server.url)
    monkeypatch.setenv("MODELPORT_TOKEN", alice.token)
    monkeypatch.setenv("MODELPORT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(client_module, "RETRY_DELAYS", ())
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.import_version, "delay", lambda *args: sent.append(tuple(args)))
    return sent


def test_push_from_creates_an_importing_version_and_the_same_source_again_is_that_version(
    push_cli: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sources.KINDS, "mlflow", __name__)

    assert main(["push", "fraud", "--from", "models:/fraud/3", "--no-wait"]) == 0
    assert capsys.readouterr().out == "1\n"
    version = ModelVersion.objects.get(model__name="fraud")
    assert (version.status, version.source) == ("importing", {"kind": "mlflow", "uri": "models:/fraud/3"})
    assert push_cli == [(version.pk,)]

    assert main(["push", "fraud", "--from", "models:/fraud/3", "--no-wait", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert out == "1\n" and "was imported from this source already" in err

    assert main(["push", "fraud", "--from", "models:/fraud/3", "--no-wait", "--new-version"]) == 0
    assert capsys.readouterr().out == "2\n"
    assert ModelVersion.objects.filter(model__name="fraud").count() == 2


def test_a_source_the_portal_cannot_import_is_one_line_with_its_reason(
    push_cli: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real fetcher_for, with a kind whose fetcher this server cannot load: refused by the API, nothing created.
    monkeypatch.setitem(sources.KINDS, "huggingface", "models_registry.sources.not_installed_here")
    # A 403 (what this server does not offer is a refusal, exit 1), not a model the portal found invalid (3).
    assert main(["push", "fraud", "--from", "hf://org/name"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "error: Imports of kind 'huggingface' are not available on this server. (HTTP 403 from POST" in err
    assert not ModelVersion.objects.exists() and push_cli == []
