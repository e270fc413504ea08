"""The deployment page's "Settings in effect" and "Revisions": a revision's spec in words, and what changed from one
revision to the next. Plain functions over the spec a Revision stores (deployments/revision_spec.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deployments import server_memory
from deployments.revision_spec import ModelEntry, Placement, RevisionSpec
from deployments.spec import DynamicBatching
from modelport.core import formats
from models_registry.models import ModelVersion

FORMAT_NAMES = {fmt.name: fmt.short_label for fmt in formats.REGISTRY.values()}


def _us(value: int) -> str:
    return f"{value:,} µs" + (f" ({value / 1000:g} ms)" if value >= 1000 else "")


def batching_words(entry: ModelEntry) -> str:
    size = entry.max_batch_size
    if entry.is_pipeline:
        return (f"batches of up to {size}, each step batching with its own settings" if size
                else "no batching (its steps do not batch)")
    if size <= 0:
        return "no batching (max batch size 0)"
    batching = entry.dynamic_batching
    if not batching:
        return f"max batch size {size}, no dynamic batching (each request runs as it comes)"
    words = (f"max batch size {size}, dynamic batching with a queue delay of "
             f"{_us(batching.max_queue_delay_microseconds)}")
    if batching.preferred_batch_size:
        words += f", preferred batch sizes {', '.join(str(s) for s in batching.preferred_batch_size)}"
    return words


def instances_words(entry: ModelEntry) -> str:
    if entry.is_pipeline:
        return "runs in its steps' instances"
    group = entry.instance_group
    words = f"{group.count} {group.kind.upper()} instance{'s' if group.count != 1 else ''}"
    if group.gpus:
        words += f" on GPU {', '.join(str(g) for g in group.gpus)}"
    return words


def settings_in_effect(spec: RevisionSpec | None) -> list[dict[str, Any]]:
    """Per served model: its name, version, format and its settings as sentences."""
    rows = []
    for entry in spec.models if spec else ():
        extras = []
        if entry.response_cache:
            extras.append("response cache on")
        if entry.warmup is not None:
            extras.append("warm-up before serving")
        rows.append({
            "name": entry.name,
            "version": entry.version,
            "format": FORMAT_NAMES.get(entry.format, entry.format),
            "batching": batching_words(entry),
            "instances": instances_words(entry),
            "extras": extras,
        })
    return rows


def placement_words(placement: Placement) -> str:
    if not placement.shared:
        return "dedicated"
    idle = placement.idle_unload_seconds
    return f"shared in pool {placement.pool}, " + (f"unloaded after {idle:,} s unused" if idle else "never unloaded")


def memory_words(spec: RevisionSpec, versions: Iterable[ModelVersion] | None = None, name: str = "NAME") -> str:
    """A dedicated local server's memory limit and how it was chosen (issue 31: derived ones are shown with their
    figures, so a user sees what to raise when a model outgrows it); with the revision's `versions`, what a new
    revision of deployment `name` would take where they were measured since."""
    memory = server_memory.in_effect(spec, versions, name)
    limit = memory["limit"] or "none"
    if memory["source"] == "given":
        return f"memory limit {limit}, as given"
    if memory["source"] == "derived":
        return (f"memory limit {limit}, derived from what its models were measured to take: {memory['basis']}; set "
                "Memory (modelport deploy --memory) to give it another")
    return f"memory limit {limit}: {memory['basis']}"


def deployment_words(spec: RevisionSpec | None, runtime: str, versions: Iterable[ModelVersion] | None = None,
                     name: str = "NAME") -> list[str]:
    """Settings of the whole deployment that a user chose (for the local runtime's single server, only where its
    models run when shared; `versions` and `name`: see memory_words)."""
    if spec is None:
        return []
    shared = [placement_words(spec.placement)] if spec.placement.shared else []
    if runtime != "kubernetes":
        return shared or [memory_words(spec, versions, name)]
    words = [*shared, f"{spec.replicas} replica{'s' if spec.replicas != 1 else ''}"]
    resources = spec.resources
    if resources.gpu:
        words.append(f"{resources.gpu} GPU per replica" + (f" ({resources.gpu_type})" if resources.gpu_type else ""))
    for value, label in ((resources.cpu, "CPU"), (resources.memory, "memory")):
        if value:
            words.append(f"{label} {value}")
    if spec.autoscaling:
        scaling = spec.autoscaling
        words.append(f"autoscaling {scaling.min_replicas}–{scaling.max_replicas} replicas")
    return words


def _entry_changes(name: str, old: ModelEntry, new: ModelEntry) -> list[str]:
    changes = []
    if old.version != new.version:
        changes.append(f"{name}: version {old.version} → {new.version}")
    if old.max_batch_size != new.max_batch_size:
        changes.append(f"{name}: max batch size {old.max_batch_size} → {new.max_batch_size}")
    old_b, new_b = old.dynamic_batching, new.dynamic_batching
    if bool(old_b) != bool(new_b):
        changes.append(f"{name}: dynamic batching {'on' if new_b else 'off'}")
    elif old_b and new_b:
        if old_b.max_queue_delay_microseconds != new_b.max_queue_delay_microseconds:
            changes.append(f"{name}: queue delay {_us(old_b.max_queue_delay_microseconds)} → "
                           f"{_us(new_b.max_queue_delay_microseconds)}")
        if old_b.preferred_batch_size != new_b.preferred_batch_size:
            changes.append(f"{name}: preferred batch sizes {_sizes(old_b)} → {_sizes(new_b)}")
    if instances_words(old) != instances_words(new):
        changes.append(f"{name}: {instances_words(old)} → {instances_words(new)}")
    for old_value, new_value, label in ((old.response_cache, new.response_cache, "response cache"),
                                        (old.warmup is not None, new.warmup is not None, "warm-up")):
        if old_value != new_value:
            changes.append(f"{name}: {label} {'on' if new_value else 'off'}")
    return changes


def _sizes(batching: DynamicBatching) -> str:
    return ", ".join(str(s) for s in batching.preferred_batch_size) or "none"


def changes_between(old: RevisionSpec | None, new: RevisionSpec) -> list[str]:
    """What `new` changed compared with `old`, one short line each; ["first revision"] without `old`."""
    if old is None:
        return ["first revision"]
    before = {e.name: e for e in old.models}
    after = {e.name: e for e in new.models}
    changes = [f"{name}: added (version {after[name].version})" for name in after if name not in before]
    changes += [f"{name}: removed" for name in before if name not in after]
    for name in after:
        if name in before:
            changes += _entry_changes(name, before[name], after[name])
    if old.placement != new.placement:
        changes.append(f"placement {placement_words(old.placement)} → {placement_words(new.placement)}")
    if old.replicas != new.replicas:
        changes.append(f"replicas {old.replicas} → {new.replicas}")
    if old.resources != new.resources:
        changes.append("resources changed")
    if old.autoscaling != new.autoscaling:
        changes.append("autoscaling changed")
    return changes or ["no change of settings (the same spec rendered again)"]


def history(revisions: list[Any]) -> list[dict[str, Any]]:
    """Revisions newest first, each with what it changed from the one before it."""
    ordered = sorted(revisions, key=lambda r: r.number)
    rows = []
    previous: RevisionSpec | None = None
    for revision in ordered:
        rows.append({"revision": revision, "changes": changes_between(previous, revision.spec)})
        previous = revision.spec
    return list(reversed(rows))
