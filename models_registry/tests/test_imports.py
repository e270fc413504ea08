"""Imported versions (issue 35): the backbone every source kind goes through, driven by a fake source kind
(models_registry/tests/import_support.py). The real kinds have their own tests against real servers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from models_registry import import_worker, quota
from models_registry.inspection import inspect_here
from models_registry.models import ModelVersion, TeamSources
from models_registry.sources import KINDS
from models_registry.tests import import_support
from tests.artifacts import tiny_onnx
from tests.support.people import Person

URL = "/api/v1/models/digits/versions/"


@pytest.fixture
def fake_source(monkeypatch: pytest.MonkeyPatch, settings: Any) -> import_support.Script:
    """The "fake" kind registered, a fresh script for it, and tasks run in the test's process (the import task
    queued after commit runs at once, eagerly, retries included, without their countdown)."""
    monkeypatch.setitem(KINDS, "fake", "models_registry.tests.import_support")
    script = import_support.Script()
    monkeypatch.setattr(import_support, "SCRIPT", script)
    settings.IMPORT_RETRY_BACKOFF_SECONDS = 0
    settings.IMPORT_MAX_ACTIVE_PER_TEAM = 10  # the cap has a test of its own
    return script


def _import(person: Person, source: dict[str, Any], **extra: Any) -> Any:
    return person.client().post(URL, {"source": source, "create_model": True, **extra}, format="json")


def _queued(person: Person, capture: Any) -> int:
    """The id of a new import of the fake source "x", its task not run (the test runs it)."""
    with capture(execute=False):
        number = _import(person, {"kind": "fake", "name": "x"}).json()["number"]
    return ModelVersion.objects.get(number=number).pk  # type: ignore[no-any-return]


def _run(version_id: int, attempts: int = 5) -> None:
    """The import task as a worker runs it, retries included (their countdown skipped)."""
    for attempt in range(attempts):
        try:
            import_worker.run_import(version_id, attempt)
            return
        except import_worker.RetryLater:
            continue


@pytest.mark.django_db(transaction=True)
def test_an_imported_version_is_fetched_then_inspected_like_an_upload(alice: Person, fake_source: Any,
                                                                     django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        created = _import(alice, {"kind": "fake", "name": "digits-v1"})
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["status"] == "importing"
    assert body["import"] == {"done_bytes": 0, "total_bytes": None}
    assert body["source"] == {"kind": "fake", "name": "digits-v1"}
    version = ModelVersion.objects.get()
    _run(version.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.VALIDATING
    assert version.source["fetched"]["files"]["model.onnx"]
    version = inspect_here(version.pk)
    assert version.status == ModelVersion.Status.READY, version.error
    assert version.format == "onnx" and version.size == len(tiny_onnx())
    shown = alice.client().get(f"{URL}{version.number}/").json()
    assert shown["import"] is None and shown["source"]["fetched"]["name"] == "digits-v1"
    # Progress was reported as the bytes came, the total first.
    assert fake_source.progress_seen[0] == (0, len(tiny_onnx()))
    assert fake_source.progress_seen[-1][0] == len(tiny_onnx())


@pytest.mark.django_db
def test_the_same_source_twice_gives_the_one_version_unless_asked_for_another(alice: Person, fake_source: Any) -> None:
    first = _import(alice, {"kind": "fake", "name": "same"})
    again = _import(alice, {"kind": "fake", "name": "same"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["number"] == first.json()["number"]
    forced = _import(alice, {"kind": "fake", "name": "same"}, new_version=True)
    assert forced.status_code == 201 and forced.json()["number"] == first.json()["number"] + 1
    other = _import(alice, {"kind": "fake", "name": "another"})
    assert other.status_code == 201


SIGNATURE = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 3]}],
             "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 3]}]}


@pytest.mark.django_db
@pytest.mark.parametrize("options", [
    {"signature": SIGNATURE}, {"decoupled": True}, {"max_batch_size": 4}, {"format": "onnx"},
    {"chat_template": "{{ messages[0].content }}"},
])
def test_the_same_source_with_other_declared_options_is_another_version(alice: Person, fake_source: Any,
                                                                         options: dict[str, Any]) -> None:
    """The options make another version of the same bytes: the earlier version, made without them, is not it."""
    plain = _import(alice, {"kind": "fake", "name": "same"})
    declared = _import(alice, {"kind": "fake", "name": "same"}, **options)
    assert (plain.status_code, declared.status_code) == (201, 201), declared.json()
    assert declared.json()["number"] == plain.json()["number"] + 1
    version = ModelVersion.objects.get(number=declared.json()["number"])
    assert (version.declared_signature, version.decoupled, version.declared_max_batch_size) == (
        options.get("signature"), options.get("decoupled", False), options.get("max_batch_size"))
    # The same options again are the same import; and without them, the first one.
    again = _import(alice, {"kind": "fake", "name": "same"}, **options)
    assert (again.status_code, again.json()["number"]) == (200, declared.json()["number"])
    assert _import(alice, {"kind": "fake", "name": "same"}).json()["number"] == plain.json()["number"]


def test_a_source_without_declared_options_keeps_the_identity_it_had_before_they_counted(fake_source: Any) -> None:
    import hashlib

    from models_registry import imports

    # Versions imported before the options were part of the identity still answer "the same source twice".
    assert imports.identity_of("fake", {"name": "x"}) == hashlib.sha256(b"fake\nx").hexdigest()
    assert imports.identity_of("fake", {"name": "x"}, imports.Declared()) == imports.identity_of("fake", {"name": "x"})
    assert imports.identity_of("fake", {"name": "x"}, imports.Declared(decoupled=True)) != \
        imports.identity_of("fake", {"name": "x"})


@pytest.mark.django_db
def test_a_moving_reference_the_source_cannot_pin_is_a_new_version_each_time_and_a_pinned_one_is_not(
        alice: Person, settings: Any) -> None:
    """An alias, a branch or tag, an object under a key may name another target by the second import: returning the
    first import's version would serve the old target as if it were the new one. The API asks MLflow and the hub what
    an alias or a branch names now (test_mlflow_fetch.py, test_import_huggingface.py); here neither answers (closed
    ports, the object store's too), so each import is a version of its own."""
    settings.MLFLOW_TRACKING_URI = "http://127.0.0.1:9"  # never reached
    settings.HF_ENDPOINT = "http://127.0.0.1:9"
    settings.IMPORT_S3_ENDPOINT_URL = "http://127.0.0.1:9"
    settings.IMPORT_MLFLOW_MODELS = "*"
    settings.IMPORT_HUGGINGFACE_REPOS = "acme/*"
    settings.IMPORT_MAX_ACTIVE_PER_TEAM = 20
    TeamSources.objects.create(team=alice.team, mlflow_models="*", huggingface_repos="acme/*",
                               s3_buckets="models")
    moving = [{"kind": "mlflow", "uri": "models:/fraud@prod"},
              {"kind": "huggingface", "repo": "acme/digits", "revision": "main"},
              {"kind": "huggingface", "repo": "acme/digits"},  # main, by default
              {"kind": "huggingface", "repo": "acme/digits", "revision": "v1"},
              {"kind": "uri", "uri": "s3://models/fraud/model.onnx"}]
    for source in moving:
        first, again = _import(alice, source), _import(alice, source)
        assert (first.status_code, again.status_code) == (201, 201), (source, again.json())
        assert again.json()["number"] == first.json()["number"] + 1
    pinned = [{"kind": "mlflow", "uri": "models:/fraud/3"},
              {"kind": "huggingface", "repo": "acme/digits", "revision": "a" * 40}]
    for source in pinned:
        first, again = _import(alice, source), _import(alice, source)
        assert (first.status_code, again.status_code) == (201, 200), (source, again.json())
        assert again.json()["number"] == first.json()["number"]


@pytest.mark.django_db
def test_a_failed_import_is_not_the_one_the_same_source_returns(alice: Person, fake_source: Any) -> None:
    first = _import(alice, {"kind": "fake", "name": "same"}).json()
    ModelVersion.objects.filter(number=first["number"]).update(status=ModelVersion.Status.INVALID)
    again = _import(alice, {"kind": "fake", "name": "same"})
    assert again.status_code == 201 and again.json()["number"] == first["number"] + 1


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "field_text"), [
    ({"kind": "nope"}, "source.kind must be one of"),
    ({"name": "x"}, "source.kind must be one of"),
    ({"kind": "fake", "name": ""}, "A fake source is"),
    ({"kind": "fake", "name": "x", "extra": 1}, "A fake source is"),
])
def test_a_malformed_source_is_a_400_naming_it(alice: Person, fake_source: Any, source: dict[str, Any],
                                               field_text: str) -> None:
    refused = _import(alice, source)
    assert refused.status_code == 400, refused.json()
    assert field_text in str(refused.json()["error"]["fields"]["source"])
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_a_source_that_is_not_an_object_or_mixed_with_a_file_is_refused(alice: Person, fake_source: Any) -> None:
    assert _import(alice, "models:/fraud/3").status_code == 400  # type: ignore[arg-type]
    mixed = alice.client().post(URL, {"source": {"kind": "fake", "name": "x"}, "upload_id": "x", "create_model": True},
                                format="json")
    assert mixed.status_code == 400 and "upload_id" in str(mixed.json())


@pytest.mark.django_db
def test_a_source_the_operator_did_not_allow_is_a_403(alice: Person, settings: Any) -> None:
    settings.MLFLOW_TRACKING_URI = ""
    TeamSources.objects.create(team=alice.team)  # nothing allowed
    refused = _import(alice, {"kind": "huggingface", "repo": "acme/digits"})
    assert refused.status_code == 403, refused.json()
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_another_team_sees_neither_the_import_nor_its_source(alice: Person, charlie: Person, fake_source: Any) -> None:
    number = _import(alice, {"kind": "fake", "name": "private"}).json()["number"]
    assert charlie.client().get(f"{URL}{number}/").status_code == 404
    assert charlie.client().post(f"{URL}{number}/cancel/").status_code == 404
    # The same source in charlie's team is charlie's own import, not alice's version.
    theirs = _import(charlie, {"kind": "fake", "name": "private"})
    assert theirs.status_code == 201 and theirs.json()["number"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_transient_fault_is_retried_and_then_succeeds(alice: Person, fake_source: Any,
                                                       django_capture_on_commit_callbacks: Any) -> None:
    fake_source.transient_failures = 2
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    with pytest.raises(import_worker.RetryLater):
        import_worker.run_import(version_id, 0)
    assert "Retrying" in ModelVersion.objects.get(pk=version_id).error
    _run(version_id)
    assert ModelVersion.objects.get(pk=version_id).status == ModelVersion.Status.VALIDATING
    assert fake_source.calls == 3


@pytest.mark.django_db(transaction=True)
def test_a_fault_that_persists_ends_invalid_after_the_retries(alice: Person, fake_source: Any, settings: Any,
                                                             django_capture_on_commit_callbacks: Any) -> None:
    settings.IMPORT_MAX_RETRIES = 2
    fake_source.transient_failures = 10
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    _run(version_id)
    version = ModelVersion.objects.get(pk=version_id)
    assert version.status == ModelVersion.Status.INVALID
    assert "after 3 attempts" in version.error and "connection reset" in version.error
    assert fake_source.calls == 3


@pytest.mark.django_db(transaction=True)
def test_a_source_declaring_more_than_the_quota_is_refused_before_its_bytes(alice: Person, fake_source: Any,
                                                                          settings: Any,
                                                                          django_capture_on_commit_callbacks: Any
                                                                          ) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 10_000
    fake_source.declared_total = 50_000
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    _run(version_id)
    version = ModelVersion.objects.get(pk=version_id)
    assert version.status == ModelVersion.Status.INVALID
    assert "storage quota" in version.error and "The source is" in version.error
    assert fake_source.progress_seen == [(0, 50_000)]  # not one byte was read
    assert quota.usage_of(alice.team) == 0  # nothing reserved once refused


@pytest.mark.django_db(transaction=True)
def test_a_source_sending_more_than_it_declared_is_counted_as_it_comes(alice: Person, fake_source: Any, settings: Any,
                                                                      django_capture_on_commit_callbacks: Any) -> None:
    size = len(tiny_onnx())
    settings.TEAM_STORAGE_QUOTA_BYTES = size + 1000
    fake_source.declared_total = 100
    fake_source.extra_bytes = 5000  # far past the quota once it arrives
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    _run(version_id)
    version = ModelVersion.objects.get(pk=version_id)
    assert version.status == ModelVersion.Status.INVALID and "storage quota" in version.error
    assert max(done for done, _ in fake_source.progress_seen) <= size + 1000 + fake_source.chunk


@pytest.mark.django_db(transaction=True)
def test_an_import_reserves_the_quota_while_it_runs(alice: Person, fake_source: Any,
                                                   django_capture_on_commit_callbacks: Any) -> None:
    fake_source.declared_total = 4096
    fake_source.pause = threading.Event()
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    worker = threading.Thread(target=_run, args=(version_id,))
    worker.start()
    try:
        assert fake_source.paused.wait(10)
        assert quota.usage_of(alice.team) == 4096
        shown = alice.client().get(f"{URL}1/").json()
        assert shown["import"]["total_bytes"] == 4096
    finally:
        fake_source.pause.set()
        worker.join(10)


@pytest.mark.django_db(transaction=True)
def test_cancelling_an_import_stops_its_fetch_and_gives_back_its_reservation(alice: Person, bob: Person,
                                                                            fake_source: Any,
                                                                            django_capture_on_commit_callbacks: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(import_worker, "_PROGRESS_EVERY_SECONDS", 0)  # each chunk writes (and so sees the cancel)
    fake_source.declared_total = 4096
    fake_source.chunk = 16
    fake_source.pause = threading.Event()
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    worker = threading.Thread(target=_run, args=(version_id,))
    worker.start()
    try:
        assert fake_source.paused.wait(10)
        cancelled = bob.client().post(f"{URL}1/cancel/")
        assert cancelled.status_code == 200, cancelled.json()
        assert cancelled.json()["status"] == "invalid" and "cancelled by bob" in cancelled.json()["error"]
        assert quota.usage_of(alice.team) == 0
    finally:
        fake_source.pause.set()
        worker.join(10)
    assert not worker.is_alive()
    version = ModelVersion.objects.get(pk=version_id)
    assert version.status == ModelVersion.Status.INVALID and version.staged_key == ""
    # The fetch stopped at its next chunk: the first, then the one that saw the cancel.
    assert len(fake_source.progress_seen) == 3 < len(tiny_onnx()) // fake_source.chunk
    again = bob.client().post(f"{URL}1/cancel/")
    assert again.status_code == 409 and "not importing" in again.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_deleting_an_importing_version_stops_its_fetch(alice: Person, fake_source: Any,
                                                      django_capture_on_commit_callbacks: Any) -> None:
    fake_source.pause = threading.Event()
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    worker = threading.Thread(target=_run, args=(version_id,))
    worker.start()
    try:
        assert fake_source.paused.wait(10)
        assert alice.client().delete(f"{URL}1/").status_code == 204
    finally:
        fake_source.pause.set()
        worker.join(10)
    assert not ModelVersion.objects.filter(pk=version_id).exists()


@pytest.mark.django_db
def test_an_import_whose_worker_died_is_marked_invalid_by_the_sweep(alice: Person, fake_source: Any,
                                                                   settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    _import(alice, {"kind": "fake", "name": "x"})
    long_ago = timezone.now() - timedelta(seconds=settings.IMPORT_TIME_LIMIT_SECONDS + 600)
    ModelVersion.objects.update(import_started_at=long_ago, size=100)
    assert import_worker.sweep_stuck_imports() == 1
    version = ModelVersion.objects.get()
    assert version.status == ModelVersion.Status.INVALID and "IMPORT_TIME_LIMIT_SECONDS" in version.error
    assert quota.usage_of(alice.team) == 0


@pytest.mark.django_db(transaction=True)
def test_what_the_team_declares_with_a_source_wins_over_the_sources_own(alice: Person, fake_source: Any,
                                                                       django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        created = _import(alice, {"kind": "fake", "name": "x"}, format="onnx", max_batch_size=4)
    assert created.status_code == 201, created.json()
    version = ModelVersion.objects.get()
    _run(version.pk)
    version.refresh_from_db()
    assert (version.status, version.declared_format, version.declared_max_batch_size) == (
        ModelVersion.Status.VALIDATING, "onnx", 4)
    assert inspect_here(version.pk).max_batch_size == 4


@pytest.mark.django_db
def test_decoupled_with_a_source_of_another_format_is_refused(alice: Person, fake_source: Any) -> None:
    refused = _import(alice, {"kind": "fake", "name": "x"}, format="onnx", decoupled=True)
    assert refused.status_code == 400 and "decoupled" in refused.json()["error"]["fields"]


@pytest.mark.django_db(transaction=True)
def test_a_source_without_a_declared_total_reserves_ahead_of_its_bytes_but_never_past_the_quota(
        alice: Person, fake_source: Any, settings: Any, django_capture_on_commit_callbacks: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    locks: list[int] = []
    real_lock = quota.lock_team
    monkeypatch.setattr(quota, "lock_team", lambda team: (locks.append(1), real_lock(team))[1])
    monkeypatch.setattr(import_worker, "_RESERVE_AHEAD_BYTES", 1000)
    fake_source.declared_total = 0  # "not declared": the fake passes no total
    fake_source.chunk = 16
    version_id = _queued(alice, django_capture_on_commit_callbacks)
    locks.clear()
    _run(version_id)
    assert ModelVersion.objects.get(pk=version_id).status == ModelVersion.Status.VALIDATING
    assert len(locks) == 1  # one reservation ahead covered every chunk of the 149-byte model


@pytest.mark.django_db
def test_a_team_with_its_most_imports_under_way_gets_a_429_and_another_team_is_not_held(
        alice: Person, charlie: Person, fake_source: Any, settings: Any) -> None:
    settings.IMPORT_MAX_ACTIVE_PER_TEAM = 2
    assert _import(alice, {"kind": "fake", "name": "a"}).status_code == 201
    assert _import(alice, {"kind": "fake", "name": "b"}).status_code == 201
    refused = _import(alice, {"kind": "fake", "name": "c"})
    assert refused.status_code == 429 and "IMPORT_MAX_ACTIVE_PER_TEAM" in refused.json()["error"]["message"]
    assert _import(alice, {"kind": "fake", "name": "a"}).status_code == 200  # the same source is still its version
    assert _import(charlie, {"kind": "fake", "name": "c"}).status_code == 201
    assert alice.client().post(f"{URL}1/cancel/").status_code == 200  # an ended import frees its place
    assert _import(alice, {"kind": "fake", "name": "c"}).status_code == 201
