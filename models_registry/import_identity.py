"""What makes two imports "the same source twice" (issue 35): the key a version's `source_identity` holds.

A pinned source (an MLflow registry version, a Hugging Face commit) is its own key, by its text. A moving reference
(an MLflow alias, a Hugging Face branch or tag) is keyed by what it names: the API asks the source once, briefly,
what that is now (the fetcher's `pinned`), so that importing `models:/fraud@champion` twice while the alias stays on
version 3 is one version, and again after it moved is a new one; the worker, which resolves the reference again
when it fetches, keys the version by what it fetched (the fetcher's `pinned_from`), so that an alias moved in between
never leaves a version keyed by a target it does not hold. An object under an s3 key or a URL names no target one
could ask for cheaply (its bytes can be replaced): no key, a new version each time. The declared options are part of
the key: the same bytes with another signature or decoupled flag are another version.

Plain functions over the fetchers (models_registry/sources/); no database.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from modelport.core.errors import ArtifactRejected
from modelport.core.signature import Signature
from models_registry.sources import fetcher_for
from models_registry.sources.base import TransientFetchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Declared:
    """What the team declared beside the source, as for an upload; each wins over what the source says."""

    format: str = ""
    signature: Signature | None = None
    max_batch_size: int | None = None
    decoupled: bool = False
    chat_template: str = ""

    def as_identity(self) -> dict[str, Any]:
        """The options given, each one left at its default left out."""
        options = {"format": self.format, "signature": self.signature.to_json() if self.signature else None,
                   "max_batch_size": self.max_batch_size, "decoupled": self.decoupled,
                   "chat_template": self.chat_template}
        defaults = {"format": "", "signature": None, "max_batch_size": None, "decoupled": False, "chat_template": ""}
        return {key: value for key, value in options.items() if value != defaults[key]}


def identity_of(kind: str, canonical: dict[str, Any], declared: Declared | None = None) -> str | None:
    """The sha256 of a pinned source's canonical text and of what the team declared with it. None for a moving
    reference (pinned_identity keys those)."""
    text = fetcher_for(kind).identity(canonical)
    if text is None:
        return None
    options = (declared or Declared()).as_identity()
    # Without options the text is what it was before they counted, so versions imported then still match.
    if options:
        text = f"{text}\ndeclared:{json.dumps(options, sort_keys=True, separators=(',', ':'))}"
    return hashlib.sha256(f"{kind}\n{text}".encode()).hexdigest()


def pinned_identity(kind: str, canonical: dict[str, Any], declared: Declared, team_id: int) -> str | None:
    """At the API, a moving reference's key: the identity of the pinned source it names now, asked of the source
    within a few seconds. None when it names nothing one can ask for (an s3 or https object), or the source did not
    say in time or refused: the import is then a version of its own, and its worker says what went wrong."""
    try:
        pinned = fetcher_for(kind).pinned(canonical, team_id)
    except (TransientFetchError, ArtifactRejected) as exc:  # ArtifactRejected: SourceRefused, SourceForbidden
        log.info("a %s source could not be pinned at the API: %s", kind, exc)
        return None
    return identity_of(kind, pinned, declared) if pinned is not None else None


def fetched_identity(kind: str, canonical: dict[str, Any], record: dict[str, Any], declared: Declared) -> str | None:
    """On the worker, once fetched: the key of what a moving reference named when it was fetched (from the
    fetcher's record), None for a source that names nothing pinned."""
    pinned = fetcher_for(kind).pinned_from(canonical, record)
    return identity_of(kind, pinned, declared) if pinned is not None else None
