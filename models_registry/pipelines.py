"""Pipelines: model versions of format "ensemble" that chain other model versions (Triton ensembles).

A pipeline is defined by JSON, no artifact:

    {"inputs":  [{"name", "datatype", "dims"}],          # dims include the batch dimension (-1)
     "outputs": [{"name", "datatype", "dims"}],
     "steps":   [{"model", "version", "input_map": {step_input: tensor}, "output_map": {step_output: tensor}}]}

`validate_pipeline()` checks a definition against the step versions it names (looked up by the caller, so this
module needs no database) and returns the normalized pipeline, or raises `PipelineError` with one message per field
that names the offending step and tensor. `pipeline_graph()` turns a stored definition into nodes and edges, laid
out for the diagram partial templates/web/_pipeline_diagram.html.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelport.core import formats
from modelport.core.signature import Signature, SignatureError, Tensor, dims_compatible, parse_signature

STEP_KEYS = frozenset({"model", "version", "input_map", "output_map"})
DEFINITION_KEYS = frozenset({"inputs", "outputs", "steps"})
MAX_STEPS = 32


class PipelineError(ValueError):
    """An invalid definition; `errors` maps fields ("definition.steps[1].input_map") to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{key}: {' '.join(messages)}" for key, messages in errors.items()))


@dataclass(frozen=True)
class StepVersion:
    """What validation needs to know about a model version a step names."""

    model: str
    version: int
    format: str
    status: str
    signature: Signature
    max_batch_size: int
    error: str = ""
    id: int | None = None
    decoupled: bool = False  # it streams: any number of responses per request (uploaded with decoupled=true)


# (model name, version number or None for the latest ready one) -> the version, or a message why there is none.
Lookup = Callable[[str, int | None], "StepVersion | str"]


@dataclass(frozen=True)
class PipelineStep:
    model: str
    version: int
    input_map: dict[str, str]
    output_map: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "input_map": dict(self.input_map),
                "output_map": dict(self.output_map)}


@dataclass(frozen=True)
class Pipeline:
    signature: Signature
    steps: tuple[PipelineStep, ...]
    max_batch_size: int
    step_versions: tuple[StepVersion, ...] = field(default_factory=tuple)

    @property
    def decoupled(self) -> bool:
        """Whether the pipeline streams: one of its steps does, and Triton streams the ensemble (every response of
        that step goes on through the steps after it, docs/pipelines.md, "Streaming pipelines")."""
        return any(v.decoupled for v in self.step_versions)

    def to_definition(self) -> dict[str, Any]:
        return {**self.signature.to_json(), "steps": [s.to_json() for s in self.steps]}


def _step_name(index: int, model: object) -> str:
    """Steps are counted from 1 in messages, as people count them (the field keys keep the JSON index)."""
    return f"step {index + 1} ({model})" if isinstance(model, str) and model else f"step {index + 1}"


def _describe(tensor: Tensor) -> str:
    return f"{tensor.datatype} {list(tensor.dims)}"


def _parse_map(raw: object, where: str, what: str, errors: dict[str, list[str]]) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        errors.setdefault(where, []).append(f"{what} must be a non-empty object {{step tensor: pipeline tensor}}")
        return None
    if not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in raw.items()):
        errors.setdefault(where, []).append(f"{what} must map tensor names (non-empty strings) to tensor names")
        return None
    return dict(raw)


def _parse_structure(raw: object) -> tuple[Signature, list[dict[str, Any]]]:
    if not isinstance(raw, dict):
        raise PipelineError({"definition": ['must be an object {"inputs": [...], "outputs": [...], "steps": [...]}']})
    unknown = set(raw) - DEFINITION_KEYS
    if unknown:
        raise PipelineError({"definition": [f"unknown keys {sorted(unknown)}: use {sorted(DEFINITION_KEYS)}"]})
    try:
        signature = parse_signature({"inputs": raw.get("inputs"), "outputs": raw.get("outputs")})
    except SignatureError as exc:
        # parse_signature names its fields "signature.inputs[0]"; here they are the definition's.
        raise PipelineError({"definition": [str(exc).replace("signature.", "definition.")]}) from None
    if signature.optional_inputs:
        # An ensemble hands every one of its inputs to a step: one a request may leave out has nothing to hand.
        raise PipelineError({"definition.inputs": [
            f"a pipeline's inputs cannot be optional ({', '.join(signature.optional_inputs)}): leave 'optional' out"]})
    steps = raw.get("steps")
    if not isinstance(steps, list) or not steps:
        raise PipelineError({"definition.steps": ["a pipeline needs a non-empty list of steps"]})
    if len(steps) > MAX_STEPS:
        raise PipelineError({"definition.steps": [f"a pipeline has at most {MAX_STEPS} steps, got {len(steps)}"]})
    errors: dict[str, list[str]] = {}
    for index, step in enumerate(steps):
        where = f"definition.steps[{index}]"
        if not isinstance(step, dict):
            errors.setdefault(where, []).append(
                "each step must be an object with model, version, input_map, output_map")
            continue
        unknown = set(step) - STEP_KEYS
        if unknown:
            errors.setdefault(where, []).append(f"unknown keys {sorted(unknown)}: use {sorted(STEP_KEYS)}")
        model = step.get("model")
        if not isinstance(model, str) or not model:
            errors.setdefault(f"{where}.model", []).append("the model's name is required")
        version = step.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            errors.setdefault(f"{where}.version", []).append(
                f"{_step_name(index, model)}: the version must be a number of 1 or more (or left out for the latest "
                "ready version)")
        _parse_map(step.get("input_map"), f"{where}.input_map", f"{_step_name(index, model)}: input_map", errors)
        _parse_map(step.get("output_map"), f"{where}.output_map", f"{_step_name(index, model)}: output_map", errors)
    if errors:
        raise PipelineError(errors)
    return signature, steps


def validate_pipeline(raw: object, lookup: Lookup, *, pipeline_model: str = "",
                      max_batch_size: int | None = None) -> Pipeline:
    """The pipeline `raw` defines, checked against the step versions `lookup` finds; PipelineError if invalid.

    `pipeline_model` is the name of the model the pipeline becomes a version of (a step may not call it);
    `max_batch_size` the one asked for (default: the smallest of the steps').
    """
    signature, raw_steps = _parse_structure(raw)
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    # 1. The step versions.
    resolved: list[StepVersion] = []
    versions_of: dict[str, int] = {}
    for index, raw_step in enumerate(raw_steps):
        where, name = f"definition.steps[{index}]", _step_name(index, raw_step["model"])
        if raw_step["model"] == pipeline_model:
            add(f"{where}.model", f"{name}: a pipeline cannot call its own model {pipeline_model!r}")
            continue
        found = lookup(raw_step["model"], raw_step.get("version"))
        if isinstance(found, str):
            add(f"{where}.version" if raw_step.get("version") is not None else f"{where}.model", f"{name}: {found}")
            continue
        if found.status != "ready":
            detail = f": {found.error}" if found.error else ""
            add(f"{where}.version", f"{name}: version {found.version} of {found.model!r} is {found.status}, "
                                    f"not ready{detail}")
            continue
        if found.format == formats.ENSEMBLE:
            add(f"{where}.model", f"{name}: version {found.version} of {found.model!r} is itself a pipeline; "
                                  "pipelines of pipelines are not supported, list its steps instead")
            continue
        if versions_of.setdefault(found.model, found.version) != found.version:
            add(f"{where}.version", f"{name}: the pipeline uses version {versions_of[found.model]} of "
                                    f"{found.model!r} already; a deployment serves one version of each model")
            continue
        resolved.append(found)
    if errors:
        raise PipelineError(errors)
    steps = tuple(
        PipelineStep(model=v.model, version=v.version, input_map=dict(s["input_map"]), output_map=dict(s["output_map"]))
        for v, s in zip(resolved, raw_steps, strict=True)
    )

    # 2. Each step's maps against its model's signature.
    for index, (step, version) in enumerate(zip(steps, resolved, strict=True)):
        where, name = f"definition.steps[{index}]", _step_name(index, step.model)
        inputs = {t.name: t for t in version.signature.inputs}
        outputs = {t.name: t for t in version.signature.outputs}
        for step_input in step.input_map:
            if step_input not in inputs:
                add(f"{where}.input_map", f"{name}: {step.model!r} version {step.version} has no input "
                                          f"{step_input!r} (its inputs: {', '.join(map(repr, inputs))})")
        # An optional input left unmapped is left out of the step's request (Triton 2.51 loads such an ensemble and
        # the step reads None for it), so a streaming step keeps its defaults for max_tokens, temperature, ...
        for missing in [n for n, t in inputs.items() if n not in step.input_map and not t.optional]:
            add(f"{where}.input_map", f"{name}: input {missing!r} of {step.model!r} is not fed: map it to a "
                                      "pipeline input or an earlier step's output")
        for step_output in step.output_map:
            if step_output not in outputs:
                add(f"{where}.output_map", f"{name}: {step.model!r} version {step.version} has no output "
                                           f"{step_output!r} (its outputs: {', '.join(map(repr, outputs))})")
    if errors:
        raise PipelineError(errors)

    # 3. Who produces each tensor: a pipeline input, or exactly one step output.
    pipeline_inputs = {t.name: t for t in signature.inputs}
    producer: dict[str, tuple[int, Tensor]] = {}  # tensor -> (step index, the step's output tensor)
    for index, (step, version) in enumerate(zip(steps, resolved, strict=True)):
        outputs = {t.name: t for t in version.signature.outputs}
        for step_output, tensor in step.output_map.items():
            name = _step_name(index, step.model)
            if tensor in pipeline_inputs:
                add(f"definition.steps[{index}].output_map",
                    f"{name}: output {step_output!r} is mapped to {tensor!r}, which is a pipeline input")
            elif tensor in producer:
                other = producer[tensor][0]
                add(f"definition.steps[{index}].output_map",
                    f"{name}: output {step_output!r} writes tensor {tensor!r}, which "
                    f"{_step_name(other, steps[other].model)} writes already")
            else:
                producer[tensor] = (index, outputs[step_output])
    if errors:
        raise PipelineError(errors)

    # 4. No cycles: a step that (through other steps) feeds itself.
    depends_on = {
        index: sorted({producer[t][0] for t in step.input_map.values() if t in producer})
        for index, step in enumerate(steps)
    }
    cycle = _find_cycle(depends_on)
    if cycle:
        path = " -> ".join(_step_name(i, steps[i].model) for i in cycle)
        add("definition.steps", f"the steps form a cycle: {path} (each feeds the next through its outputs)")
        raise PipelineError(errors)

    # 5. Every step input is fed, in order, with a matching datatype and shape.
    for index, (step, version) in enumerate(zip(steps, resolved, strict=True)):
        name = _step_name(index, step.model)
        inputs = {t.name: t for t in version.signature.inputs}
        for step_input, tensor in step.input_map.items():
            wanted = inputs[step_input]
            key = f"definition.steps[{index}].input_map.{step_input}"
            if tensor in pipeline_inputs:
                source, given = f"pipeline input {tensor!r}", pipeline_inputs[tensor]
            elif tensor in producer:
                other, given = producer[tensor]
                source = f"tensor {tensor!r} (from {_step_name(other, steps[other].model)})"
                if other >= index:
                    add(key, f"{name}: input {step_input!r} is fed by {source}, which comes later: list the steps "
                             "in the order they run")
                    continue
            else:
                add(key, f"{name}: input {step_input!r} is mapped to tensor {tensor!r}, which is neither a pipeline "
                         "input nor an earlier step's output")
                continue
            if given.datatype != wanted.datatype:
                add(key, f"{name}: input {step_input!r} is {wanted.datatype} but {source} is {given.datatype}")
            elif not dims_compatible(given.dims, wanted.dims):
                add(key, f"{name}: input {step_input!r} has shape {list(wanted.dims)} but {source} has shape "
                         f"{list(given.dims)}")

    # 6. Every pipeline output is produced by a step, as declared.
    for position, output in enumerate(signature.outputs):
        key = f"definition.outputs[{position}]"
        if output.name not in producer:
            add(key, f"pipeline output {output.name!r} is not produced by any step: map a step output to it")
            continue
        other, given = producer[output.name]
        source = f"output {output.name!r} of {_step_name(other, steps[other].model)} is {_describe(given)}"
        if given.datatype != output.datatype or not dims_compatible(given.dims, output.dims):
            add(key, f"pipeline output {output.name!r} is declared {_describe(output)} but {source}")
    if errors:
        raise PipelineError(errors)

    # 7. Batching: all steps batch or none does; the pipeline batches no more than any step.
    batching = [v.max_batch_size > 0 for v in resolved]
    if any(batching) and not all(batching):
        unbatched = [_step_name(i, s.model) for i, s in enumerate(steps) if not batching[i]]
        batched = [_step_name(i, s.model) for i, s in enumerate(steps) if batching[i]]
        add("definition.steps", f"{', '.join(unbatched)} cannot batch (max_batch_size 0) while {', '.join(batched)} "
                                "can: all steps must batch, or none")
        raise PipelineError(errors)
    smallest = min(v.max_batch_size for v in resolved)
    if all(batching):
        unbatched_tensors = [t.name for t in signature.inputs + signature.outputs if not t.dims or t.dims[0] != -1]
        if unbatched_tensors:
            add("definition", f"the steps batch, so every pipeline input and output needs the batch dimension -1 "
                              f"first; {', '.join(map(repr, unbatched_tensors))} has not")
        if max_batch_size is not None and max_batch_size > smallest:
            limiting = next(i for i, v in enumerate(resolved) if v.max_batch_size == smallest)
            add("max_batch_size", f"max_batch_size {max_batch_size} is larger than that of "
                                  f"{_step_name(limiting, steps[limiting].model)} ({smallest})")
    elif max_batch_size:
        add("max_batch_size", "the steps do not batch (max_batch_size 0), so neither can the pipeline: send 0")
    if errors:
        raise PipelineError(errors)

    # 8. A streaming step: its every response is the rest of the pipeline's input, so what joins it must stream too.
    _check_streaming(signature, steps, resolved, producer, add)
    if errors:
        raise PipelineError(errors)
    chosen = (smallest if max_batch_size is None else max_batch_size) if all(batching) else 0
    return Pipeline(signature=signature, steps=steps, max_batch_size=chosen, step_versions=tuple(resolved))


def _check_streaming(signature: Signature, steps: tuple[PipelineStep, ...], resolved: list[StepVersion],
                     producer: dict[str, tuple[int, Tensor]], add: Callable[[str, str], None]) -> None:
    """The rules Triton 2.51 loads an ensemble with a decoupled (streaming) step by (verified, ../shared/notes/
    triton-local.md, "Streaming"): each response the step sends runs the steps it feeds once, so a step, or the
    pipeline's outputs, may take tensors of that stream only, never a stream's tensor beside a pipeline input or a
    one-answer step's output ("receives inputs originated from different decoupled models", at load). One streaming
    step per pipeline: two in a row are not verified, two side by side meet at the outputs."""
    streaming = [i for i, v in enumerate(resolved) if v.decoupled]
    if not streaming:
        return
    if len(streaming) > 1:
        names = ", ".join(_step_name(i, steps[i].model) for i in streaming)
        add("definition.steps", f"{names} all stream (decoupled): a pipeline may have one streaming step")
        return
    (source,) = streaming
    source_name = _step_name(source, steps[source].model)
    streamed = set(steps[source].output_map.values())  # the tensors each of the step's responses carries anew
    for index in range(source + 1, len(steps)):
        step = steps[index]
        taken = [k for k, t in step.input_map.items() if t in streamed]
        if not taken:
            continue
        once = [k for k, t in step.input_map.items() if t not in streamed]
        if once:
            add(f"definition.steps[{index}].input_map",
                f"{_step_name(index, step.model)}: input(s) {', '.join(map(repr, taken))} come from {source_name}, "
                f"which streams, and {', '.join(map(repr, once))} from outside its stream; a step after a streaming "
                f"one runs once per piece and may take only tensors of that stream (Triton refuses to join them)")
        # Its outputs are of the stream either way: one mistake is reported once, not again at each later step.
        streamed.update(step.output_map.values())
    for position, output in enumerate(signature.outputs):
        if output.name not in streamed:
            other = producer[output.name][0]
            add(f"definition.outputs[{position}]",
                f"pipeline output {output.name!r} comes from {_step_name(other, steps[other].model)}, outside the "
                f"stream of {source_name}: a pipeline with a streaming step sends each piece as one response, so "
                "every output must come from that step or a step after it that it feeds")


def _find_cycle(depends_on: dict[int, list[int]]) -> list[int]:
    """A cycle among steps as [a, b, ..., a], or [] (depth-first search; steps are few)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    path: list[int] = []

    def visit(node: int) -> list[int]:
        state[node] = 1
        path.append(node)
        for dep in depends_on.get(node, []):
            if state.get(dep) == 1:
                start = path.index(dep)
                # Dependencies point backwards (consumer -> producer): reverse to read in data-flow order.
                return list(reversed(path[start:] + [dep]))
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(depends_on):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


# --- the diagram -----------------------------------------------------------------------------------------------

NODE_WIDTH = 150
NODE_HEIGHT = 44
COLUMN_GAP = 90
ROW_GAP = 26
MARGIN = 12
# Top to bottom (phones): data-flow levels become rows, with room between them for the tensor names.
LEVEL_GAP = 40
SIDE_GAP = 16


def pipeline_graph(definition: dict[str, Any], direction: str = "across") -> dict[str, Any]:
    """Nodes (pipeline inputs, steps, pipeline outputs) and edges (one per tensor hop) of a stored definition.

    Each node carries a position (x, y, width, height) by data-flow depth, left to right ("across") or top to
    bottom ("down", narrow screens), each edge its end points, and the graph its `width` and `height`, so a
    template can draw it as SVG without any layout code of its own.
    """
    inputs = list(definition.get("inputs", []))
    outputs = list(definition.get("outputs", []))
    steps = list(definition.get("steps", []))
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    produced_by: dict[str, str] = {}
    column: dict[str, int] = {}

    for tensor in inputs:
        node_id = f"input:{tensor['name']}"
        nodes.append({"id": node_id, "kind": "input", "label": tensor["name"],
                      "detail": f"{tensor['datatype']} {list(tensor['dims'])}"})
        produced_by[tensor["name"]] = node_id
        column[node_id] = 0
    for index, step in enumerate(steps):
        node_id = f"step:{index}"
        sources = []
        for step_input, tensor in step.get("input_map", {}).items():
            source = produced_by.get(tensor)
            if source is not None:
                sources.append(source)
                edges.append({"source": source, "target": node_id, "tensor": tensor, "to": step_input})
        column[node_id] = 1 + max((column[s] for s in sources), default=0)
        nodes.append({"id": node_id, "kind": "step", "label": step["model"],
                      "detail": f"version {step['version']}" if step.get("version") is not None else "latest version",
                      "model": step["model"], "version": step.get("version"), "index": index})
        for tensor in step.get("output_map", {}).values():
            produced_by[tensor] = node_id
    last = 1 + max((column[n["id"]] for n in nodes if n["kind"] == "step"), default=0)
    for tensor in outputs:
        node_id = f"output:{tensor['name']}"
        nodes.append({"id": node_id, "kind": "output", "label": tensor["name"],
                      "detail": f"{tensor['datatype']} {list(tensor['dims'])}"})
        column[node_id] = last
        source = produced_by.get(tensor["name"])
        if source is not None:
            edges.append({"source": source, "target": node_id, "tensor": tensor["name"], "to": tensor["name"]})
    # What a step writes that nothing reads is not drawn; the tensor names on edges say what flows.
    outputs_of = {s_index: s.get("output_map", {}) for s_index, s in enumerate(steps)}
    for edge in edges:
        if edge["source"].startswith("step:"):
            mapping = outputs_of[int(edge["source"].split(":", 1)[1])]
            edge["from"] = next((k for k, v in mapping.items() if v == edge["tensor"]), edge["tensor"])
        else:
            edge["from"] = edge["tensor"]

    down = direction == "down"
    rows: dict[int, int] = {}
    for node in nodes:
        col = column[node["id"]]
        row = rows.get(col, 0)
        rows[col] = row + 1
        if down:
            x, y = MARGIN + row * (NODE_WIDTH + SIDE_GAP), MARGIN + col * (NODE_HEIGHT + LEVEL_GAP)
        else:
            x, y = MARGIN + col * (NODE_WIDTH + COLUMN_GAP), MARGIN + row * (NODE_HEIGHT + ROW_GAP)
        node.update(column=col, row=row, width=NODE_WIDTH, height=NODE_HEIGHT, x=x, y=y)
    by_id = {n["id"]: n for n in nodes}
    for edge in edges:
        a, b = by_id[edge["source"]], by_id[edge["target"]]
        if down:
            edge.update(x1=a["x"] + a["width"] // 2, y1=a["y"] + a["height"], x2=b["x"] + b["width"] // 2, y2=b["y"])
            edge.update(label_x=(edge["x1"] + edge["x2"]) // 2 + 6, label_y=(edge["y1"] + edge["y2"]) // 2 + 4,
                        anchor="start")
        else:
            edge.update(x1=a["x"] + a["width"], y1=a["y"] + a["height"] // 2, x2=b["x"], y2=b["y"] + b["height"] // 2)
            edge.update(label_x=(edge["x1"] + edge["x2"]) // 2, label_y=(edge["y1"] + edge["y2"]) // 2 - 4,
                        anchor="middle")
    widest = max(rows.values(), default=1)
    if down:
        width = MARGIN * 2 + widest * (NODE_WIDTH + SIDE_GAP) - SIDE_GAP
        height = MARGIN * 2 + (last + 1) * NODE_HEIGHT + last * LEVEL_GAP
    else:
        width = MARGIN * 2 + (last + 1) * NODE_WIDTH + last * COLUMN_GAP
        height = MARGIN * 2 + widest * (NODE_HEIGHT + ROW_GAP) - ROW_GAP
    return {"nodes": nodes, "edges": edges, "width": width, "height": height, "direction": "down" if down else "across"}
