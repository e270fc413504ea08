"""What applying a tune changes, setting by setting, before and after, and which changes narrow what clients may
send (issue 25: an Apply lowered the max batch size from 64 to 8 without a word, and a client's batches of 16 got
400s). Plain functions over two revision specs, no Django."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.revision_spec import ModelEntry, RevisionSpec


@dataclass(frozen=True)
class Change:
    model: str
    setting: str
    before: Any
    after: Any
    narrows: bool  # a request clients may send today would be refused after it
    why: str = ""  # for a narrowing change: what a client loses

    def text(self) -> str:
        line = f"{self.model}: {self.setting} {_value(self.before)} → {_value(self.after)}"
        return f"{line} ({self.why})" if self.why else line

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "setting": self.setting, "before": self.before, "after": self.after,
                "narrows": self.narrows, "why": self.why}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _tensors(entry: ModelEntry) -> dict[str, tuple[str, list[int]]]:
    signature = entry.signature
    return {t.name: (t.datatype, list(t.dims)) for t in (*signature.inputs, *signature.outputs)}


def _entry_changes(old: ModelEntry, new: ModelEntry) -> list[Change]:
    name = new.name
    out: list[Change] = []
    if old.max_batch_size != new.max_batch_size:
        narrows = new.max_batch_size < old.max_batch_size
        why = (f"a request of more than {new.max_batch_size} rows, accepted today, would be refused with a 400"
               if narrows and new.max_batch_size > 0 else
               "requests would no longer carry a batch dimension" if narrows else "")
        out.append(Change(name, "max_batch_size", old.max_batch_size, new.max_batch_size, narrows, why))
    old_batching, new_batching = old.dynamic_batching is not None, new.dynamic_batching is not None
    if old_batching != new_batching:
        out.append(Change(name, "dynamic_batching", old_batching, new_batching, False))
    old_delay = old.dynamic_batching.max_queue_delay_microseconds if old.dynamic_batching else None
    new_delay = new.dynamic_batching.max_queue_delay_microseconds if new.dynamic_batching else None
    if old_delay != new_delay and old_delay is not None and new_delay is not None:
        out.append(Change(name, "max_queue_delay_microseconds", old_delay, new_delay, False))
    if old.instance_group.count != new.instance_group.count:
        out.append(Change(name, "instances", old.instance_group.count, new.instance_group.count, False))
    before, after = _tensors(old), _tensors(new)
    for tensor in sorted(set(before) | set(after)):
        if before.get(tensor) != after.get(tensor):
            was, now = before.get(tensor), after.get(tensor)
            out.append(Change(name, f"tensor {tensor}", list(was[1]) if was else None, list(now[1]) if now else None,
                              True, "clients shaped for the old signature would be refused"))
    return out


def spec_changes(before: RevisionSpec, after: RevisionSpec) -> list[Change]:
    """Every serving setting that differs between the two specs, per model (pipelines included: one not given a
    max_batch_size of its own follows its steps', so lowering a step's narrows the pipeline too)."""
    old = {m.name: m for m in before.models}
    out: list[Change] = []
    for entry in after.models:
        if entry.name in old:
            out.extend(_entry_changes(old[entry.name], entry))
    return out


def narrowing(changes: list[Change]) -> list[Change]:
    return [c for c in changes if c.narrows]
