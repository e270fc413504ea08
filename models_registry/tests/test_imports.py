"""Imported versions (issue 35, models_registry/imports.py): the API contract every source kind shares, the worker's
fetch through the fake kind of the tests (models_registry/tests/import_support.py), and the upload's own inspection
after it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from models_registry import imports, quota
from models_registry.models import Model, ModelVersion, TeamStorageQuota
from models_registry.tests import import_support
from models_registry.tests.import_support import hooks
from tests.artifacts import tiny_onnx
from tests.support.people import Person

URL = "/api/v1/models/digits/versions/"


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(tiny_onnx())
    return path


@pytest.fixture
def fake_hooks(settings: Any) -> Iterator[import_support.Hooks]:
    settings.IMPORT_RETRY_BACKOFF_SECONDS = 0
    hooks.reset()
    yield hooks
    hooks.reset()


def post(person: Person, source: dict[str, Any], **fields: Any) -> Any:
    return person.client().post(URL, {"source": source, **fields}, format="json")


def fake(path: Path, **fields: Any) -> dict[str, Any]:
    return {"kind": "fake", "path": str(path), **fields}


def test_an_import_is_created_importing_and_the_same_source_again_answers_that_version(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any) -> None:
    first = post(alice, fake(onnx_file))
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["status"] == "importing"
    assert body["source"] == {"kind": "fake", "path": str(onnx_file), "filename": "model.onnx",
                              "declared_total": None, "extra_bytes": 0}
    assert body["import"] == {"done_bytes": 0, "total_bytes": None}
    again = post(alice, fake(onnx_file))
    assert again.status_code == 200, again.json()
    assert again.json()["number"] == body["number"]
    another = post(alice, fake(onnx_file), new_version=True)
    assert another.status_code == 201
    assert another.json()["number"] == body["number"] + 1
    assert ModelVersion.objects.count() == 2
    assert AuditEntry.objects.filter(action="model_version.import").count() == 2


def test_an_import_becomes_ready_through_the_upload_s_inspection(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, eager_tasks: Any) -> None:
    response = post(alice, fake(onnx_file), create_model=True)
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert version.format == "onnx"
    assert version.size == len(tiny_onnx())
    assert version.original_filename == "model.onnx"
    assert version.source["fetched_bytes"] == len(tiny_onnx())
    detail = alice.client().get(f"{URL}{version.number}/").json()
    assert detail["import"] is None
    assert detail["signature"]["inputs"][0]["name"] == "x"
    # A failed import does not hold the source: the same one again makes a new version.
    ModelVersion.objects.filter(pk=version.pk).update(status="invalid")
    assert post(alice, fake(onnx_file)).status_code == 201


def test_create_model_with_an_import(alice: Person, onnx_file: Path, fake_hooks: Any) -> None:
    assert post(alice, fake(onnx_file)).status_code == 404
    response = post(alice, fake(onnx_file), create_model=True)
    assert response.status_code == 201, response.json()
    assert Model.objects.filter(name="digits").exists()


@pytest.mark.parametrize(("source", "status", "says"), [
    ({"kind": "fake", "path": "/x", "forbidden": True}, 403, "not allowed"),
    ({"kind": "fake"}, 400, "source.path"),
    ({"kind": "nosuch"}, 400, "source.kind must be one of"),
    ({"kind": 3}, 400, '"kind"'),
    ({"path": "/x"}, 400, '"kind"'),
    ("text", 400, '"kind"'),
])
def test_refused_sources_say_why(alice: Person, digits_model: Model, source: Any, status: int, says: str,
                                 fake_hooks: Any) -> None:
    response = post(alice, source)
    assert response.status_code == status, response.json()
    assert says in str(response.json())
    assert not ModelVersion.objects.exists()


def test_a_kind_whose_fetcher_cannot_be_loaded_is_a_400(alice: Person, digits_model: Model,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from models_registry import sources

    monkeypatch.setitem(sources.KINDS, "broken", "models_registry.sources.no_such_module")
    response = post(alice, {"kind": "broken"})
    assert response.status_code == 400
    assert "not available on this server" in response.json()["error"]["fields"]["source"][0]


def test_exactly_one_of_file_upload_and_source(alice: Person, digits_model: Model, onnx_file: Path) -> None:
    response = alice.client().post(URL, {"source": fake(onnx_file),
                                         "upload_id": "00000000-0000-0000-0000-000000000000"}, format="json")
    assert response.status_code == 400
    assert "exactly one of" in str(response.json())


def test_progress_is_recorded_and_the_quota_reserved_for_the_declared_total(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any) -> None:
    version = ModelVersion.objects.get(number=post(alice, fake(onnx_file)).json()["number"])
    progress = imports.make_progress(version, max_bytes=10_000)
    progress(0, 5000)
    version.refresh_from_db()
    assert (version.import_done_bytes, version.import_total_bytes, version.size) == (0, 5000, 5000)
    assert quota.usage_of(alice.team) == 5000
    body = alice.client().get(f"{URL}{version.number}/").json()
    assert body["import"] == {"done_bytes": 0, "total_bytes": 5000}
    with pytest.raises(imports.SourceRefused, match="more bytes"):
        progress(5001, None)
    with pytest.raises(imports.SourceRefused, match="more than this import may take"):
        progress(0, 10_001)


def test_a_source_declared_larger_than_the_quota_is_refused_before_any_byte(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, eager_tasks: Any) -> None:
    TeamStorageQuota.objects.create(team=alice.team, bytes=100)
    post(alice, fake(onnx_file, declared_total=len(tiny_onnx())))
    version = ModelVersion.objects.get()
    assert version.status == "invalid"
    assert "more than this import may take" in version.error
    assert fake_hooks.writes == []
    assert version.size == 0


def test_bytes_beyond_the_declared_total_are_refused(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, eager_tasks: Any) -> None:
    post(alice, fake(onnx_file, declared_total=len(tiny_onnx()), extra_bytes=100))
    version = ModelVersion.objects.get()
    assert version.status == "invalid"
    assert "more bytes" in version.error


def test_a_transient_fault_is_retried_then_the_import_succeeds(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, eager_tasks: Any) -> None:
    fake_hooks.faults_left = 2
    post(alice, fake(onnx_file))
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert fake_hooks.attempts == 3


def test_transient_faults_past_the_retries_leave_the_version_invalid_saying_so(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, settings: Any) -> None:
    settings.IMPORT_MAX_RETRIES = 1
    fake_hooks.faults_left = 5
    post(alice, fake(onnx_file))
    version = ModelVersion.objects.get()
    assert imports.run_import(version.pk, 0) is imports.Outcome.RETRY
    assert imports.run_import(version.pk, 1) is imports.Outcome.DONE
    version.refresh_from_db()
    assert version.status == "invalid"
    assert "reset the connection" in version.error and "gave up after 2 attempts" in version.error


def test_a_bug_in_a_fetcher_leaves_the_version_invalid_with_a_generic_message(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    post(alice, fake(onnx_file))
    version = ModelVersion.objects.get()

    def broken(*args: Any) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(import_support.fetcher, "fetch", broken)
    assert imports.run_import(version.pk) is imports.Outcome.DONE
    version.refresh_from_db()
    assert version.status == "invalid"
    assert version.error == imports.GENERIC_ERROR


def test_cancel_stops_the_fetch_at_its_next_progress_call(
        alice: Person, charlie: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any,
        settings: Any) -> None:
    number = post(alice, fake(onnx_file)).json()["number"]
    version = ModelVersion.objects.get()
    assert charlie.client().post(f"{URL}{number}/cancel/").status_code == 404
    assert charlie.client().get(f"{URL}{number}/").status_code == 404
    cancelled: list[Any] = []

    def cancel_once() -> None:
        if not cancelled:
            cancelled.append(alice.client().post(f"{URL}{number}/cancel/"))

    fake_hooks.between = cancel_once
    assert imports.run_import(version.pk) is imports.Outcome.DONE
    assert cancelled[0].status_code == 200, cancelled[0].json()
    assert cancelled[0].json()["error"] == "cancelled by alice"
    # Cancelled after the first chunk's progress: the second chunk's progress call stopped it.
    assert len(fake_hooks.writes) == 2 < len(tiny_onnx()) / import_support.CHUNK
    version.refresh_from_db()
    assert version.status == "invalid" and version.staged_key == "" and version.size == 0
    again = alice.client().post(f"{URL}{number}/cancel/")
    assert again.status_code == 409
    assert "not importing" in again.json()["error"]["message"]
    assert AuditEntry.objects.filter(action="model_version.import_cancel").count() == 1
    # A cancelled import does not hold its source.
    assert post(alice, fake(onnx_file)).status_code == 201


def test_an_importing_version_can_be_deleted_and_its_fetch_stops(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any) -> None:
    number = post(alice, fake(onnx_file)).json()["number"]
    version = ModelVersion.objects.get()
    fake_hooks.between = lambda: alice.client().delete(f"{URL}{number}/")
    assert imports.run_import(version.pk) is imports.Outcome.DONE
    assert not ModelVersion.objects.exists()
    assert len(fake_hooks.writes) == 2


def test_the_sweep_marks_an_import_stuck_past_the_time_limit_invalid(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any, settings: Any) -> None:
    post(alice, fake(onnx_file))
    version = ModelVersion.objects.get()
    ModelVersion.objects.filter(pk=version.pk).update(
        import_started_at=timezone.now() - timedelta(seconds=settings.IMPORT_TIME_LIMIT_SECONDS + 120))
    imports.sweep()
    version.refresh_from_db()
    assert version.status == "invalid"
    assert "IMPORT_TIME_LIMIT_SECONDS" in version.error


def test_a_version_fetched_once_is_not_fetched_again_by_a_second_delivery(
        alice: Person, digits_model: Model, onnx_file: Path, fake_hooks: Any) -> None:
    post(alice, fake(onnx_file))
    version = ModelVersion.objects.get()
    ModelVersion.objects.filter(pk=version.pk).update(import_started_at=timezone.now())
    assert imports.run_import(version.pk) is imports.Outcome.DONE
    assert fake_hooks.attempts == 0
