"""Step versions and pipeline definitions shared by the streaming-pipeline tests (test_pipeline_streaming.py, plain
values; test_pipeline_streaming_api.py, through the API): a one-answer python step, the sample text generator's
contract, and steps that take its pieces."""

from __future__ import annotations

from typing import Any

from modelport.core.signature import Signature, Tensor
from models_registry.pipelines import StepVersion

TEXT = Tensor("text_input", "BYTES", (-1, 1))
OUT = Tensor("text_output", "BYTES", (-1, 1))

VERSIONS = {
    # A one-answer python step: text in, a prompt out.
    "clean": StepVersion("clean", 1, "python", "ready", Signature(
        inputs=(TEXT,), outputs=(Tensor("prompt", "BYTES", (-1, 1)),)), max_batch_size=8),
    # The sample text generator's contract: one required input, optional settings, pieces out.
    "textgen": StepVersion("textgen", 1, "python", "ready", Signature(
        inputs=(TEXT, Tensor("max_tokens", "INT32", (-1, 1), optional=True)), outputs=(OUT,)),
        max_batch_size=8, decoupled=True),
    # A one-answer step that takes a piece, and one that takes a piece and something else.
    "shout": StepVersion("shout", 1, "python", "ready", Signature(
        inputs=(Tensor("piece", "BYTES", (-1, 1)),), outputs=(Tensor("loud", "BYTES", (-1, 1)),)), max_batch_size=8),
    "join": StepVersion("join", 1, "python", "ready", Signature(
        inputs=(Tensor("piece", "BYTES", (-1, 1)), Tensor("prompt", "BYTES", (-1, 1))),
        outputs=(Tensor("joined", "BYTES", (-1, 1)),)), max_batch_size=8),
    "chatter": StepVersion("chatter", 1, "python", "ready", Signature(
        inputs=(Tensor("prompt", "BYTES", (-1, 1)),), outputs=(Tensor("more", "BYTES", (-1, 1)),)),
        max_batch_size=8, decoupled=True),
}


def lookup(name: str, number: int | None) -> StepVersion | str:
    return VERSIONS.get(name) or f"no model named {name!r} in your team"


def tensor(t: Tensor) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "dims": list(t.dims)}


def definition(*step_list: dict[str, Any], outputs: tuple[Tensor, ...] = (OUT,)) -> dict[str, Any]:
    return {"inputs": [tensor(TEXT)], "outputs": [tensor(t) for t in outputs], "steps": list(step_list)}


def step(name: str, input_map: dict[str, str], output_map: dict[str, str]) -> dict[str, Any]:
    return {"model": name, "version": 1, "input_map": input_map, "output_map": output_map}


CLEAN = step("clean", {"text_input": "text_input"}, {"prompt": "prompt"})
TEXTGEN = step("textgen", {"text_input": "prompt"}, {"text_output": "text_output"})
