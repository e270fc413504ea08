"""Imported versions (issue 35): the version a `source` makes, for the API and the pages; the fetch itself is the
import lane's (models_registry/import_worker.py).

The API validates the source (its kind's fetcher, models_registry/sources/) and `start_import` records a version in
IMPORTING with the source, then queues `tasks.import_version` after commit. The same source into the same model again
is the version that imported it (models_registry/import_identity.py): a pinned one (a registry version, a commit) by
its text, an MLflow alias or a Hugging Face branch or tag by what it names when asked; an object under an s3 key or
a URL is a new version each time. `cancel_import` ends one under way: its fetch stops at its next
chunk.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.log import record as audit
from infra.api_errors import Conflict
from models_registry import quota
from models_registry.import_identity import Declared, identity_of, pinned_identity
from models_registry.models import Model, ModelVersion
from models_registry.sources import fetcher_for
from models_registry.sources.base import SourceRefused

log = logging.getLogger(__name__)

def validate_source(source: Any, team_id: int) -> dict[str, Any]:
    """The API's check of a `source` object: its kind's fetcher validates the rest (SourceRefused, SourceForbidden).
    Returns {"kind": ..., **canonical fields}."""
    if not isinstance(source, dict):
        raise SourceRefused('source must be an object such as {"kind": "mlflow", "uri": "models:/fraud/3"}.')
    kind = source.get("kind")
    fetcher = fetcher_for(kind)
    fields = {key: value for key, value in source.items() if key != "kind"}
    return {"kind": kind, **fetcher.validate(fields, team_id)}


def existing_import(model: Model, identity: str | None) -> ModelVersion | None:
    """The version of `model` that imported this source already and did not fail (importing, validating, ready);
    never one for a moving reference (identity None)."""
    if model.pk is None or not identity:
        return None
    return (ModelVersion.objects.filter(model=model, source_identity=identity)
            .exclude(status=ModelVersion.Status.INVALID).order_by("-number").first())


def start_import(model: Model, user: Any, source: dict[str, Any], *, new_version: bool = False,
                 example_request: dict[str, Any] | None = None,
                 declared: Declared | None = None) -> tuple[ModelVersion, bool]:
    """The version importing `source` (validated), and whether it is new: the same source with the same declared
    options into the same model again gives the version that imported it (unless `new_version`), so that a retried
    CI job makes one version; an alias or a branch is the same source while it names the same target
    (pinned_identity). A source with other declared options is another version (identity_of)."""
    from models_registry.actions import _save_new_model  # the registry's one way to save a model with its first version

    kind = source["kind"]
    canonical = {key: value for key, value in source.items() if key != "kind"}
    declared = declared or Declared()
    identity = identity_of(kind, canonical, declared)
    if identity is None:
        # A moving reference's lookup (a call of a few seconds at most) before the transaction, so it holds no lock;
        # and not for a team at its cap of imports, which would be refused anyway.
        check_active_imports(model.team)
        identity = pinned_identity(kind, canonical, declared, model.team_id)
    with transaction.atomic():
        # Two requests at once: the second sees the first's version, and the count of the team's imports.
        quota.lock_team(model.team)
        if not new_version:
            found = existing_import(model, identity)
            if found is not None:
                return found, False
        check_active_imports(model.team)
        model = _save_new_model(model, user)
        version = ModelVersion.objects.create(
            model=model, number=model.next_version_number(), status=ModelVersion.Status.IMPORTING,
            source=source, source_identity=identity or "", original_filename=_shown_name(source),
            example_request=example_request, created_by=user, declared_format=declared.format,
            declared_signature=declared.signature.to_json() if declared.signature else None,
            declared_max_batch_size=declared.max_batch_size, decoupled=declared.decoupled,
            chat_template=declared.chat_template)
        audit(user, model.team, "model_version.import", f"{model.name}:{version.number}", kind=kind)
        transaction.on_commit(lambda: _queue(version.pk))
    return version, True


class TooManyImports(SourceRefused):
    """The team has IMPORT_MAX_ACTIVE_PER_TEAM imports under way (HTTP 429)."""


def check_active_imports(team: Any) -> None:
    """TooManyImports when the team may start no import now: the import lane's threads are every team's, so one team's
    queue of imports (each up to IMPORT_TIME_LIMIT_SECONDS) must not hold them for the others."""
    active = ModelVersion.objects.filter(model__team=team, status=ModelVersion.Status.IMPORTING).count()
    cap = settings.IMPORT_MAX_ACTIVE_PER_TEAM
    if active >= cap:
        raise TooManyImports(f"Team {team.name!r} has {active} imports under way, the most it may have at once "
                             f"(IMPORT_MAX_ACTIVE_PER_TEAM = {cap}). Wait for one to end, or cancel one "
                             "(POST .../versions/<n>/cancel/).")


def _shown_name(source: dict[str, Any]) -> str:
    """What the version shows as its file until the fetch names one: the source's own address."""
    text = source.get("uri") or "@".join(str(source.get(k)) for k in ("repo", "revision") if source.get(k))
    return str(text)[:255]


def _queue(version_id: int) -> None:
    from models_registry import tasks

    tasks.import_version.delay(version_id)


def cancel_import(version: ModelVersion, user: Any) -> ModelVersion:
    """Cancel an import under way: the version becomes invalid at once (its reservation is given back) and the fetch
    stops at its next chunk. 409 when the version is not importing."""
    who = getattr(user, "username", "") or "someone"
    cancelled = ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.IMPORTING).update(
        status=ModelVersion.Status.INVALID, error=f"Import cancelled by {who}.", size=0,
        validated_at=timezone.now())
    if cancelled != 1:
        version.refresh_from_db()
        raise Conflict(f"Version {version.number} is {version.status}, not importing: only an import under way can be "
                       "cancelled (delete the version instead).")
    audit(user, version.model.team, "model_version.import_cancel", f"{version.model.name}:{version.number}")
    version.refresh_from_db()
    return version
