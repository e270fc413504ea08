"""The deployment page's "Settings in effect" and "Revisions": a revision's spec in words, and what changed from one
revision to the next. Plain functions over the spec snapshot a Revision stores (deployments/snapshot.py)."""

from __future__ import annotations

from typing import Any

FORMAT_NAMES = {
    "onnx": "ONNX", "torchscript": "TorchScript", "tensorflow_savedmodel": "TensorFlow SavedModel",
    "tensorrt_plan": "TensorRT plan", "python": "Python", "tnn": "TNN", "ensemble": "pipeline",
}


def _us(value: int) -> str:
    return f"{value:,} µs" + (f" ({value / 1000:g} ms)" if value >= 1000 else "")


def batching_words(entry: dict[str, Any]) -> str:
    if entry.get("format") == "ensemble":
        size = int(entry.get("max_batch_size") or 0)
        return (f"batches of up to {size}, each step batching with its own settings" if size
                else "no batching (its steps do not batch)")
    size = int(entry.get("max_batch_size") or 0)
    if size <= 0:
        return "no batching (max batch size 0)"
    batching = entry.get("dynamic_batching")
    if not batching:
        return f"max batch size {size}, no dynamic batching (each request runs as it comes)"
    words = f"max batch size {size}, dynamic batching with a queue delay of {_us(int(batching.get('max_queue_delay_microseconds', 0)))}"
    preferred = batching.get("preferred_batch_size") or []
    if preferred:
        words += f", preferred batch sizes {', '.join(str(s) for s in preferred)}"
    return words


def instances_words(entry: dict[str, Any]) -> str:
    if entry.get("format") == "ensemble":
        return "runs in its steps' instances"
    group = entry.get("instance_group") or {}
    count, kind = int(group.get("count", 1)), str(group.get("kind", "cpu")).upper()
    words = f"{count} {kind} instance{'s' if count != 1 else ''}"
    if group.get("gpus"):
        words += f" on GPU {', '.join(str(g) for g in group['gpus'])}"
    return words


def settings_in_effect(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per served model: its name, version, format and its settings as sentences."""
    rows = []
    for entry in spec.get("models", []):
        extras = []
        if entry.get("response_cache"):
            extras.append("response cache on")
        if entry.get("warmup"):
            extras.append("warm-up before serving")
        rows.append({
            "name": entry.get("name") or entry.get("model"),
            "version": entry.get("version"),
            "format": FORMAT_NAMES.get(str(entry.get("format")), str(entry.get("format"))),
            "batching": batching_words(entry),
            "instances": instances_words(entry),
            "extras": extras,
        })
    return rows


def deployment_words(spec: dict[str, Any], runtime: str) -> list[str]:
    """Settings of the whole deployment that a user chose (none for the local runtime's single server)."""
    if runtime != "kubernetes":
        return []
    words = [f"{spec.get('replicas', 1)} replica{'s' if spec.get('replicas', 1) != 1 else ''}"]
    resources = spec.get("resources") or {}
    if resources.get("gpu"):
        words.append(f"{resources['gpu']} GPU per replica" + (f" ({resources['gpu_type']})" if resources.get("gpu_type") else ""))
    for key, label in (("cpu", "CPU"), ("memory", "memory")):
        if resources.get(key):
            words.append(f"{label} {resources[key]}")
    if spec.get("autoscaling"):
        scaling = spec["autoscaling"]
        words.append(f"autoscaling {scaling.get('min_replicas')}–{scaling.get('max_replicas')} replicas")
    return words


def _entry_changes(name: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changes = []
    if old.get("version") != new.get("version"):
        changes.append(f"{name}: version {old.get('version')} → {new.get('version')}")
    if old.get("max_batch_size") != new.get("max_batch_size"):
        changes.append(f"{name}: max batch size {old.get('max_batch_size')} → {new.get('max_batch_size')}")
    old_b, new_b = old.get("dynamic_batching"), new.get("dynamic_batching")
    if bool(old_b) != bool(new_b):
        changes.append(f"{name}: dynamic batching {'on' if new_b else 'off'}")
    elif old_b and new_b:
        if old_b.get("max_queue_delay_microseconds") != new_b.get("max_queue_delay_microseconds"):
            changes.append(f"{name}: queue delay {_us(int(old_b.get('max_queue_delay_microseconds', 0)))} → "
                           f"{_us(int(new_b.get('max_queue_delay_microseconds', 0)))}")
        if list(old_b.get("preferred_batch_size") or []) != list(new_b.get("preferred_batch_size") or []):
            changes.append(f"{name}: preferred batch sizes {_sizes(old_b)} → {_sizes(new_b)}")
    if instances_words(old) != instances_words(new):
        changes.append(f"{name}: {instances_words(old)} → {instances_words(new)}")
    for key, label in (("response_cache", "response cache"), ("warmup", "warm-up")):
        if bool(old.get(key)) != bool(new.get(key)):
            changes.append(f"{name}: {label} {'on' if new.get(key) else 'off'}")
    return changes


def _sizes(batching: dict[str, Any]) -> str:
    return ", ".join(str(s) for s in batching.get("preferred_batch_size") or []) or "none"


def changes_between(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """What `new` changed compared with `old`, one short line each; ["first revision"] without `old`."""
    if old is None:
        return ["first revision"]
    before = {e.get("name") or e.get("model"): e for e in old.get("models", [])}
    after = {e.get("name") or e.get("model"): e for e in new.get("models", [])}
    changes = [f"{name}: added (version {after[name].get('version')})" for name in after if name not in before]
    changes += [f"{name}: removed" for name in before if name not in after]
    for name in after:
        if name in before:
            changes += _entry_changes(name, before[name], after[name])
    if old.get("replicas", 1) != new.get("replicas", 1):
        changes.append(f"replicas {old.get('replicas', 1)} → {new.get('replicas', 1)}")
    if (old.get("resources") or {}) != (new.get("resources") or {}):
        changes.append("resources changed")
    if old.get("autoscaling") != new.get("autoscaling"):
        changes.append("autoscaling changed")
    return changes or ["no change of settings (the same spec rendered again)"]


def history(revisions: list[Any]) -> list[dict[str, Any]]:
    """Revisions newest first, each with what it changed from the one before it."""
    ordered = sorted(revisions, key=lambda r: r.number)
    rows = []
    previous: dict[str, Any] | None = None
    for revision in ordered:
        rows.append({"revision": revision, "changes": changes_between(previous, revision.spec)})
        previous = revision.spec
    return list(reversed(rows))
