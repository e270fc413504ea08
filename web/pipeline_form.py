"""A pipeline created in the browser: the upload page recognises a definition (a .json file chosen, or JSON pasted),
draws it before anything is saved, and puts each problem beside the step and tensor it concerns. The rules are
models_registry.pipelines.validate_pipeline's, against the team's own models (the API's lookup)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from accounts.models import Team
from infra.names import name_error
from models_registry import actions as registry_actions
from models_registry import pipelines
from models_registry.models import Model, ModelVersion

# A definition of MAX_STEPS steps is a few kilobytes; this bounds what the page parses and draws.
MAX_DEFINITION_BYTES = 256 * 1024

_STEP_KEY = re.compile(r"^definition\.steps\[(\d+)\]\.?(.*)$")
_OUTPUT_KEY = re.compile(r"^definition\.outputs\[(\d+)\]")


@dataclass
class Problem:
    where: str  # "Step 1 · digits", "Pipeline output labels", "The definition", "Name"
    items: list[tuple[str, str]] = field(default_factory=list)  # (what: "input features", message)


@dataclass
class Checked:
    name: str
    definition: Any = None  # the parsed JSON, when it parsed
    pipeline: pipelines.Pipeline | None = None  # set when valid
    problems: list[Problem] = field(default_factory=list)
    graph: dict[str, Any] | None = None
    graph_down: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.pipeline is not None and not self.problems


def looks_like_pipeline(text: str) -> bool:
    """Whether `text` is JSON of a pipeline definition (an object with "steps"), however broken its steps are."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and "steps" in value


def check(team: Team, name: str, text: str, max_batch_size: int | None = None) -> Checked:
    result = Checked(name=name)
    error = name_error(name)
    if error:
        result.problems.append(Problem("Name", [("", error)]))
    if len(text.encode()) > MAX_DEFINITION_BYTES:
        result.problems.append(Problem("The definition", [("", f"it is {len(text.encode()):,} bytes; a pipeline "
                                                                f"definition is at most {MAX_DEFINITION_BYTES:,}")]))
        return result
    try:
        result.definition = json.loads(text)
    except RecursionError:
        result.problems.append(Problem("The definition", [("", "the JSON is nested too deeply")]))
        return result
    except ValueError as exc:
        result.problems.append(Problem("The definition", [("", f"not valid JSON: {exc}")]))
        return result
    try:
        pipeline = pipelines.validate_pipeline(result.definition, registry_actions.pipeline_step_lookup(team),
                                               pipeline_model=name,
                                               max_batch_size=max_batch_size)
    except pipelines.PipelineError as exc:
        result.problems.extend(_problems(exc.errors, result.definition))
        pipeline = None
    if pipeline is not None and not result.problems:
        result.pipeline = pipeline
    _draw(result)
    return result


def create(team: Team, user: Any, checked: Checked) -> ModelVersion:
    """The checked pipeline as a new version of its model (created with it when new)."""
    assert checked.pipeline is not None
    with transaction.atomic():
        model = (Model.objects.filter(team=team, name=checked.name).first()
                 or registry_actions.create_model(team, user, checked.name))
        return registry_actions.create_pipeline_version(model, user, checked.pipeline)


def _step_label(definition: Any, index: int) -> str:
    steps = definition.get("steps") if isinstance(definition, dict) else None
    model = (steps[index].get("model")
             if isinstance(steps, list) and index < len(steps) and isinstance(steps[index], dict) else None)
    # Counted from 1, as the messages count them.
    return f"Step {index + 1} · {model}" if isinstance(model, str) and model else f"Step {index + 1}"


def _what(rest: str) -> str:
    """"input_map.features" -> "input features"; "output_map" -> "outputs"; "version" -> "version"."""
    head, _, tensor = rest.partition(".")
    if head == "input_map":
        return f"input {tensor}" if tensor else "inputs"
    if head == "output_map":
        return f"output {tensor}" if tensor else "outputs"
    return head


def _problems(errors: dict[str, list[str]], definition: Any) -> list[Problem]:
    by_where: dict[str, Problem] = {}

    def add(where: str, what: str, messages: list[str]) -> None:
        problem = by_where.setdefault(where, Problem(where))
        problem.items.extend((what, message) for message in messages)

    for key, messages in errors.items():
        step = _STEP_KEY.match(key)
        output = _OUTPUT_KEY.match(key)
        if step:
            add(_step_label(definition, int(step.group(1))), _what(step.group(2)), messages)
        elif output:
            outputs = definition.get("outputs") if isinstance(definition, dict) else None
            index = int(output.group(1))
            tensor = (outputs[index].get("name")
                      if isinstance(outputs, list) and index < len(outputs) and isinstance(outputs[index], dict)
                      else index)
            add(f"Pipeline output {tensor}", "", messages)
        elif key == "max_batch_size":
            add("Max batch size", "", messages)
        else:
            add("The definition", "", messages)
    # Steps in their order, then the rest as they came.
    return sorted(by_where.values(), key=lambda p: (not p.where.startswith("Step "), _step_number(p.where)))


def _step_number(where: str) -> int:
    match = re.match(r"Step (\d+)", where)
    return int(match.group(1)) if match else 0


def _draw(result: Checked) -> None:
    """The diagram of whatever parsed well enough to draw, the steps and outputs with problems marked."""
    definition = result.pipeline.to_definition() if result.pipeline else result.definition
    steps = definition.get("steps") if isinstance(definition, dict) else None
    if not isinstance(steps, list) or len(steps) > pipelines.MAX_STEPS:
        return
    try:
        result.graph = pipelines.pipeline_graph(definition)
        result.graph_down = pipelines.pipeline_graph(definition, "down")
    except (AttributeError, KeyError, TypeError, ValueError):
        return  # not even the shape of a definition: the problems say why, there is nothing to draw
    flagged = {p.where: [message for _, message in p.items] for p in result.problems}
    for graph in (result.graph, result.graph_down):
        for node in graph["nodes"]:
            if node["kind"] == "step":
                node["errors"] = flagged.get(_step_label(definition, node["index"]), [])
            elif node["kind"] == "output":
                node["errors"] = flagged.get(f"Pipeline output {node['label']}", [])
