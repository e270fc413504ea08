"""A shared revision's model names in its pool (issue 24): in a pool's Triton, its models are loaded as
`d<deployment>-r<revision>-<model>`, unique to deployment and revision, so that two teams' `digits` never collide and
a rollout loads the new revision beside the old. Callers use the model's own name.

The one place these names are made, recognised and taken off again: both runtimes' pools (what they render, load and
filter from their logs), the planning, and the gateway (gateway/pool_names.py maps requests and answers over HTTP
and gRPC with these functions). Plain functions: no Django.
"""

from __future__ import annotations

import re
from dataclasses import replace

from deployments.revision_spec import ModelEntry, RevisionSpec
from modelport.core.definitions import PipelineDefinition


def name_prefix(deployment_id: int, revision_number: int) -> str:
    return f"d{deployment_id}-r{revision_number}-"


def loaded_name(deployment_id: int, revision_number: int, model: str) -> str:
    """The model's name inside a pool's Triton."""
    return f"{name_prefix(deployment_id, revision_number)}{model}"


def revision_key(deployment_id: int, revision_number: int) -> str:
    """The revision's own key in a pool (`d1-r2`): its entry in a cluster pool's loads Secret, its marker files."""
    return name_prefix(deployment_id, revision_number).rstrip("-")


def pooled_spec(spec: RevisionSpec, prefix: str) -> RevisionSpec:
    """`spec` with every model (and every ensemble step it names) renamed with `prefix`."""
    return replace(spec, models=tuple(_renamed(entry, prefix) for entry in spec.models))


def _renamed(entry: ModelEntry, prefix: str) -> ModelEntry:
    definition = entry.definition
    if isinstance(definition, PipelineDefinition):
        definition = replace(definition, steps=tuple(replace(step, model=prefix + step.model)
                                                     for step in definition.steps))
    return replace(entry, name=prefix + entry.name, definition=definition)


def load_order(spec: RevisionSpec, prefix: str) -> list[str]:
    """The pool names of the revision's models, steps before the pipelines that use them."""
    plain = sorted(prefix + m.name for m in spec.models if not m.is_pipeline)
    return plain + sorted(prefix + m.name for m in spec.models if m.is_pipeline)


_PREFIX_RE = re.compile(r"d[0-9]{1,12}-r[0-9]{1,9}-")


def prefix_of(name: str) -> str | None:
    """The revision prefix a pool name starts with (`d1-r2-` of `d1-r2-digits`), None for a name without one. Says
    nothing of whether that revision exists: the caller looks it up."""
    found = _PREFIX_RE.match(name)
    return found.group(0) if found else None


def own_name(name: str, prefix: str) -> str:
    """A pool name back to the model's own name (a name without the prefix as it was)."""
    return name.removeprefix(prefix)


def without_names(text: str, prefix: str) -> str:
    """A message (Triton's error, an agent's refusal) with the revision's pool names as the caller's own."""
    return text.replace(prefix, "")


def any_revision(deployment_id: int) -> re.Pattern[bytes]:
    """The prefix of any revision of the deployment (a stream may carry the serving and the canary revision's)."""
    return re.compile(rb"d%d-r[0-9]+-" % deployment_id)


def files_of(deployment_id: int, revision_number: int | None = None) -> re.Pattern[str]:
    """A pool directory's entries (models, markers) of one revision of the deployment, or with None of any, each
    matched with a "-" after its name."""
    return re.compile(rf"^d{deployment_id}-r{revision_number if revision_number is not None else r'[0-9]+'}-")


def names_in(prefix: str) -> re.Pattern[str]:
    """The revision's pool names where they start a name in a log line (never inside another name)."""
    return re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(prefix)}")


# A revision named in a line: its key or its models' names, never a longer name that ends alike.
NAMED_DEPLOYMENT_RE = re.compile(r"(?<![A-Za-z0-9_-])d([0-9]{1,12})-r[0-9]{1,9}(?![0-9])")


def deployments_named(line: str) -> set[int]:
    """The deployments whose revisions or models a log line names."""
    return {int(found) for found in NAMED_DEPLOYMENT_RE.findall(line)}
