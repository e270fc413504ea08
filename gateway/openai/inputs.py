"""What a model must declare to be served by the OpenAI-compatible API, and the generate request sent to it.

The contract is Triton's OpenAI frontend's for models other than vLLM's: `text_input` (BYTES) in, `text_output`
(BYTES) out, and any of the setting inputs below, each sent only when the model declares it. A declared setting the
request leaves out is left out of the call when the signature marks the input optional (the model's own default
applies), and otherwise sent with OpenAI's default for it (_DEFAULT_VALUE); an input this API cannot fill is refused
before anything reaches Triton. A setting the request gives for an input the model does not declare is a 400 naming
it: the model could not honour it.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.contract import Contract
from gateway.openai.requests import Generation, OpenAIError, invalid

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
SETTINGS = ("stream", "max_tokens", "temperature", "top_p", "stop", "seed")
# Sent when the model declares the input and the request leaves it out: OpenAI's defaults (max_tokens: 16, the
# completions endpoint's), and a fresh seed per request below 2**31, which any integer datatype holds (OpenAI's
# answers differ from one request to the next).
DEFAULT_MAX_TOKENS = 16
_DEFAULT_VALUE = {"max_tokens": DEFAULT_MAX_TOKENS, "temperature": 1.0, "top_p": 1.0}
# A request value that the model would treat as "not set" even without the input: no refusal for these.
_NEUTRAL = {"temperature": 1.0, "top_p": 1.0}


def check_model(contract: Contract | None, model: str) -> Contract:
    """The model's contract, or a 400 saying what it must declare to be served here."""
    if contract is None:
        raise invalid(f"Model '{model}' has no signature the gateway knows: it cannot be served by the "
                      "OpenAI-compatible API.", "model")
    declared = {t.name: t.datatype for t in contract.inputs}
    outputs = {t.name: t.datatype for t in contract.outputs}
    if declared.get(TEXT_INPUT) != "BYTES" or outputs.get(TEXT_OUTPUT) != "BYTES":
        raise invalid(f"Model '{model}' is not a text model for the OpenAI-compatible API: it must declare the input "
                      f"'{TEXT_INPUT}' (BYTES) and the output '{TEXT_OUTPUT}' (BYTES), and may declare "
                      f"{', '.join(SETTINGS)}. It takes {contract.inputs_text()} and gives "
                      f"{contract.outputs_text()}; use /v2/models/{model}/infer for it.", "model")
    others = [name for name in declared if name != TEXT_INPUT and name not in SETTINGS]
    if others:
        raise invalid(f"Model '{model}' takes inputs the OpenAI-compatible API cannot fill: "
                      f"{', '.join(repr(n) for n in others)} (it fills '{TEXT_INPUT}' and {', '.join(SETTINGS)}).",
                      "model")
    refused = wrong_datatypes(contract)
    if refused is not None:
        raise refused
    return contract


def generate_body(request: Generation, prompt: str, contract: Contract) -> dict[str, Any]:
    """The JSON body of Triton's /generate_stream for this request: input names to values."""
    declared = {t.name for t in contract.inputs}
    optional = {t.name for t in contract.inputs if t.optional}
    given: dict[str, Any] = {"max_tokens": request.max_tokens, "temperature": request.temperature,
                             "top_p": request.top_p, "stop": list(request.stop) or None, "seed": request.seed}
    for name, value in given.items():
        if value is not None and name not in declared and _NEUTRAL.get(name) != value:
            raise invalid(f"Model '{contract.model}' cannot honour '{name}': it declares no '{name}' input. Leave "
                          f"'{name}' out.", name)
    body: dict[str, Any] = {TEXT_INPUT: prompt}
    if "stream" in declared:
        # Always pieces, streamed to the caller or not: the gateway joins them for a whole answer, and usage counts
        # them (a model asked not to stream sends its text as one piece: completion_tokens 1).
        body["stream"] = True
    for name, value in given.items():
        if name not in declared:
            continue
        if value is None:
            if name in optional:
                continue  # the model's own default applies
            value = (secrets.randbelow(2**31) if name == "seed" else [] if name == "stop"
                     else _DEFAULT_VALUE[name])
        body[name] = value
    return body


def wrong_datatypes(contract: Contract) -> OpenAIError | None:
    """A setting input whose datatype cannot take the value the API sends (e.g. max_tokens as FP32)."""
    kinds = {"stream": ("BOOL",), "max_tokens": ("INT32", "INT64", "UINT32", "UINT64"),
             "temperature": ("FP32", "FP64", "FP16"), "top_p": ("FP32", "FP64", "FP16"), "stop": ("BYTES",),
             "seed": ("INT64", "UINT64", "INT32", "UINT32")}
    for tensor in contract.inputs:
        allowed = kinds.get(tensor.name)
        if allowed is not None and tensor.datatype not in allowed:
            return invalid(f"Model '{contract.model}' declares '{tensor.name}' as {tensor.datatype}; the "
                           f"OpenAI-compatible API sends it as {' or '.join(allowed)}.", "model")
    return None
