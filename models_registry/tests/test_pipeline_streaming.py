"""Pipelines with a streaming (decoupled) step (issue 33): which ones validate_pipeline accepts, the 400 that names the
step when Triton would refuse the ensemble at load (the rules verified on Triton 2.51, ../shared/notes/triton-local.md,
"Streaming"), and the ensemble's config. Plain values, no database
(the API's side: test_pipeline_streaming_api.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deployments.render import build_model_config
from deployments.spec import EnsembleStep
from deployments.tests.values import model, steps
from modelport.core.signature import Tensor
from models_registry.pipelines import Pipeline, PipelineError, validate_pipeline
from models_registry.tests.streaming_pipelines import (
    CLEAN,
    OUT,
    TEXTGEN,
    definition,
    lookup,
    step,
)


def refusal(raw: dict[str, Any], field: str) -> str:
    with pytest.raises(PipelineError) as caught:
        validate_pipeline(raw, lookup, pipeline_model="story")
    assert field in caught.value.errors, caught.value.errors
    return " ".join(caught.value.errors[field])


def test_a_pipeline_that_ends_in_a_streaming_step_streams() -> None:
    pipeline = validate_pipeline(definition(CLEAN, TEXTGEN), lookup, pipeline_model="story")
    assert pipeline.decoupled is True
    assert pipeline.max_batch_size == 8


def test_a_pipeline_without_a_streaming_step_does_not_stream() -> None:
    raw = definition(CLEAN, outputs=(Tensor("prompt", "BYTES", (-1, 1)),))
    assert validate_pipeline(raw, lookup).decoupled is False


def test_a_streaming_step_may_leave_its_optional_inputs_unmapped_but_not_its_required_ones() -> None:
    # max_tokens is optional: textgen keeps its default. text_input is not.
    assert validate_pipeline(definition(CLEAN, TEXTGEN), lookup).steps[1].input_map == {"text_input": "prompt"}
    unfed = step("textgen", {"max_tokens": "prompt"}, {"text_output": "text_output"})
    message = refusal(definition(CLEAN, unfed), "definition.steps[1].input_map")
    assert "input 'text_input' of 'textgen' is not fed" in message


def test_steps_after_the_streaming_one_run_on_each_piece() -> None:
    # Verified on Triton: every response of the streaming step goes through the step after it, and streams on.
    shout = step("shout", {"piece": "text_output"}, {"loud": "loud"})
    pipeline = validate_pipeline(definition(CLEAN, TEXTGEN, shout, outputs=(Tensor("loud", "BYTES", (-1, 1)),)),
                                 lookup)
    assert pipeline.decoupled is True


def test_a_step_that_joins_the_stream_with_a_tensor_from_outside_it_is_refused_naming_it() -> None:
    join = step("join", {"piece": "text_output", "prompt": "prompt"}, {"joined": "joined"})
    message = refusal(definition(CLEAN, TEXTGEN, join, outputs=(Tensor("joined", "BYTES", (-1, 1)),)),
                      "definition.steps[2].input_map")
    assert message.startswith("step 3 (join): input(s) 'piece' come from step 2 (textgen), which streams, and "
                              "'prompt' from outside its stream")
    assert "runs once per piece" in message


def test_a_pipeline_output_from_outside_the_stream_is_refused_naming_its_step() -> None:
    raw = definition(CLEAN, TEXTGEN, outputs=(OUT, Tensor("prompt", "BYTES", (-1, 1))))
    message = refusal(raw, "definition.outputs[1]")
    assert message.startswith("pipeline output 'prompt' comes from step 1 (clean), outside the stream of step 2 "
                              "(textgen)")
    assert "every output must come from that step" in message


def test_a_streaming_step_whose_pieces_reach_no_output_is_refused() -> None:
    # Its stream would be dropped: the pipeline's outputs all come from the one-answer step before it.
    raw = definition(CLEAN, TEXTGEN, outputs=(Tensor("prompt", "BYTES", (-1, 1)),))
    assert "outside the stream of step 2 (textgen)" in refusal(raw, "definition.outputs[0]")


def test_two_streaming_steps_are_refused_naming_both() -> None:
    chatter = step("chatter", {"prompt": "prompt"}, {"more": "more"})
    raw = definition(CLEAN, TEXTGEN, chatter, outputs=(OUT, Tensor("more", "BYTES", (-1, 1))))
    message = refusal(raw, "definition.steps")
    assert message == ("step 2 (textgen), step 3 (chatter) all stream (decoupled): a pipeline may have one "
                       "streaming step")


def test_a_streaming_pipeline_renders_an_ensemble_with_triton_s_decoupled_policy() -> None:
    pipeline: Pipeline = validate_pipeline(definition(CLEAN, TEXTGEN), lookup)
    ensemble = model(name="story", format="ensemble", artifact_path=None, dynamic_batching=None,
                     max_batch_size=pipeline.max_batch_size, signature=pipeline.signature,
                     decoupled=pipeline.decoupled, definition=steps(
                         EnsembleStep(s.model, s.version, s.input_map, s.output_map) for s in pipeline.steps))
    config = build_model_config(ensemble, "local")
    assert config.platform == "ensemble" and config.model_transaction_policy.decoupled is True
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["clean", "textgen"]
    assert dict(config.ensemble_scheduling.step[1].input_map) == {"text_input": "prompt"}  # max_tokens left out
    assert not config.instance_group

    one_answer = build_model_config(dataclasses.replace(ensemble, decoupled=False), "local")
    assert not one_answer.HasField("model_transaction_policy")
