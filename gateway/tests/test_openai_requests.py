"""Parsing OpenAI requests into one typed value, and the generate request a text model gets (gateway/openai/)."""

from __future__ import annotations

import pytest

from gateway.contract import Contract, TensorContract
from gateway.openai import inputs, requests
from gateway.openai.requests import OpenAIError

TEXTGEN = Contract("textgen", 32, tuple(TensorContract(n, d, (-1, 1)) for n, d in (
    ("text_input", "BYTES"), ("max_tokens", "INT32"), ("temperature", "FP32"), ("top_p", "FP32"),
    ("stream", "BOOL"), ("stop", "BYTES"), ("seed", "INT64"))), (TensorContract("text_output", "BYTES", (-1, 1)),))
PLAIN = Contract("echo", 0, (TensorContract("text_input", "BYTES", (1,)),), (TensorContract("text_output", "BYTES",
                                                                                            (-1,)),))


def test_a_chat_request_parses_with_text_parts_joined() -> None:
    parsed = requests.parse({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "stream": True,
        "stream_options": {"include_usage": True}, "max_completion_tokens": 3, "stop": "\n", "n": 1,
        "logprobs": False, "tools": []}, chat=True)
    assert parsed.messages[0].content == "ab" and parsed.include_usage and parsed.max_tokens == 3
    assert parsed.stop == ("\n",)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": [1, 2]}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "temperature": 3}, "temperature"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "stop": ["a"] * 5}, "stop"), ({"prompt": "x", "n": True}, "n"),
])
def test_a_completion_that_cannot_be_honoured_names_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        requests.parse({"model": "m", **body}, chat=False)
    assert refused.value.status == 400 and refused.value.param == param


def test_declared_settings_are_sent_with_openais_defaults_and_undeclared_ones_refused() -> None:
    parsed = requests.parse({"model": "m", "prompt": "hi", "stop": ["."]}, chat=False)
    body = inputs.generate_body(parsed, "hi", TEXTGEN)
    assert body["text_input"] == "hi" and body["max_tokens"] == inputs.DEFAULT_MAX_TOKENS
    assert body["stop"] == ["."] and body["stream"] is True and 0 <= body["seed"] < 2**31
    with pytest.raises(OpenAIError, match="cannot honour 'stop'"):
        inputs.generate_body(parsed, "hi", PLAIN)
    neutral = requests.parse({"model": "m", "prompt": "hi", "temperature": 1}, chat=False)
    assert inputs.generate_body(neutral, "hi", PLAIN) == {"text_input": "hi"}


def test_a_model_without_the_text_contract_or_with_inputs_the_api_cannot_fill_is_refused() -> None:
    image = Contract("img", 0, (TensorContract("image", "FP32", (3,)),), (TensorContract("s", "FP32", (1,)),))
    with pytest.raises(OpenAIError, match="must declare the input 'text_input'"):
        inputs.check_model(image, "img")
    extra = Contract("x", 0, (*PLAIN.inputs, TensorContract("mask", "INT32", (1,))), PLAIN.outputs)
    with pytest.raises(OpenAIError, match="'mask'"):
        inputs.check_model(extra, "x")
    assert inputs.check_model(TEXTGEN, "textgen") is TEXTGEN


def test_a_setting_left_out_for_an_optional_input_is_not_sent_and_one_given_is() -> None:
    optional = Contract("textgen", 32, tuple(TensorContract(t.name, t.datatype, t.shape, t.name != "text_input")
                                             for t in TEXTGEN.inputs), TEXTGEN.outputs)
    parsed = requests.parse({"model": "m", "prompt": "hi"}, chat=False)
    assert inputs.generate_body(parsed, "hi", optional) == {"text_input": "hi", "stream": True}
    given = requests.parse({"model": "m", "prompt": "hi", "stop": ["."], "seed": 3, "max_tokens": 5,
                            "temperature": 0.5, "top_p": 0.9}, chat=False)
    assert inputs.generate_body(given, "hi", optional) == {
        "text_input": "hi", "stream": True, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": ["."],
        "seed": 3}
    # A setting still names itself against a model that lacks the input: nothing is dropped silently.
    seeded = requests.parse({"model": "m", "prompt": "hi", "seed": 3}, chat=False)
    with pytest.raises(OpenAIError, match="cannot honour 'seed'"):
        inputs.generate_body(seeded, "hi", PLAIN)
