"""The deployment page's streaming Try it for a decoupled model (issue 33): what the panel sends (a prompt for the
model's text input, and max_tokens where the model declares it) and the snippets that stream the same request from a
shell: curl -N on /generate_stream, the `openai` SDK on the deployment's OpenAI-compatible API (for a model with the
contract of Triton's OpenAI frontend: text_input in, text_output out) and tritonclient's gRPC stream. Plain
functions, no Django; web/deployment_page.py puts them in the page's context, templates/web/_try_stream.html
renders them and static/js/try_stream.js sends the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deployments.examples import example_shape

# The OpenAI-compatible API's model contract (Triton's OpenAI frontend, for models other than vLLM's).
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
MAX_TOKENS = "max_tokens"
DEFAULT_PROMPT = "Hello"
# Pieces asked for by the panel and the snippets: enough to watch them arrive, few enough to end in a second or two.
DEFAULT_MAX_TOKENS = 48
_NUMPY = {"INT32": "int32", "INT64": "int64", "FP32": "float32", "UINT32": "uint32"}


@dataclass(frozen=True)
class StreamRequest:
    """One streaming request as the panel and every snippet send it."""

    prompt_input: str  # the BYTES input the prompt goes to
    prompt: str
    max_tokens_input: dict[str, Any] | None  # the served signature's max_tokens input, when the model declares it
    max_tokens: int
    openai: bool  # text_input in, text_output out: the OpenAI-compatible API can call it

    def body(self) -> dict[str, Any]:
        """The JSON body of /generate and /generate_stream (Triton's generate extension: one value per input)."""
        body: dict[str, Any] = {self.prompt_input: self.prompt}
        if self.max_tokens_input is not None:
            body[MAX_TOKENS] = self.max_tokens
        return body


def stream_request(signature: dict[str, Any], example: dict[str, list[Any]]) -> StreamRequest | None:
    """The request for a served signature (inference.served_signature), its prompt the version's example text where
    there is one; None when the model takes no text (no BYTES input) or needs inputs other than a prompt and
    max_tokens, which the panel cannot fill in."""
    inputs = {t["name"]: t for t in signature.get("inputs", [])}
    texts = [name for name, t in inputs.items() if t.get("datatype") == "BYTES"]
    if not texts:
        return None
    prompt_input = TEXT_INPUT if TEXT_INPUT in texts else texts[0]
    max_tokens = inputs.get(MAX_TOKENS) if inputs.get(MAX_TOKENS, {}).get("datatype") in _NUMPY else None
    sent = {prompt_input} | ({MAX_TOKENS} if max_tokens is not None else set())
    if any(not t.get("optional") for name, t in inputs.items() if name not in sent):
        return None
    given = example.get(prompt_input) or []
    prompt = given[0] if given and isinstance(given[0], str) and given[0].strip() else DEFAULT_PROMPT
    outputs = {t["name"] for t in signature.get("outputs", [])}
    return StreamRequest(prompt_input=prompt_input, prompt=prompt, max_tokens_input=max_tokens,
                         max_tokens=DEFAULT_MAX_TOKENS, openai=prompt_input == TEXT_INPUT and TEXT_OUTPUT in outputs)


def stream_url(base_url: str, deployment: str, model: str) -> str:
    return f"{base_url.rstrip('/')}/serve/{deployment}/v2/models/{model}/generate_stream"


def openai_base_url(base_url: str, deployment: str) -> str:
    return f"{base_url.rstrip('/')}/serve/{deployment}/v1"


def curl_snippet(base_url: str, deployment: str, model: str, request: StreamRequest) -> str:
    """Runs as copied after `export MODELPORT_TOKEN=...`: -N prints each Server-Sent Event as it arrives."""
    inline = json.dumps(request.body(), separators=(",", ":")).replace("'", "'\\''")
    return (
        "# export MODELPORT_TOKEN=<an API token> first; -N prints each piece (one `data:` event) as it arrives\n"
        f"curl -sS -N -X POST {stream_url(base_url, deployment, model)} \\\n"
        '  -H "Authorization: Bearer $MODELPORT_TOKEN" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f"  -d '{inline}'"
    )


def openai_snippet(base_url: str, deployment: str, model: str, request: StreamRequest) -> str:
    """The official `openai` SDK against the deployment's OpenAI-compatible API, streamed."""
    return "\n".join([
        "import os",
        "",
        "from openai import OpenAI",
        "",
        f'client = OpenAI(base_url="{openai_base_url(base_url, deployment)}", api_key=os.environ["MODELPORT_TOKEN"])',
        "stream = client.chat.completions.create(",
        f"    model={json.dumps(model)},",
        f'    messages=[{{"role": "user", "content": {json.dumps(request.prompt)}}}],',
        f"    max_tokens={request.max_tokens},",
        "    stream=True,",
        ")",
        "for chunk in stream:",
        "    if chunk.choices:",
        '        print(chunk.choices[0].delta.content or "", end="", flush=True)',
        "print()",
    ])


def grpc_snippet(address: str, ssl: bool, deployment: str, model: str, signature: dict[str, Any],
                 request: StreamRequest) -> str:
    """tritonclient.grpc's stream (ModelStreamInfer) through the gRPC gateway: each piece printed as it comes,
    until the final response."""
    inputs = {t["name"]: t for t in signature.get("inputs", [])}
    prompt_shape = example_shape(list(inputs[request.prompt_input].get("dims", [])))
    output = TEXT_OUTPUT if any(t["name"] == TEXT_OUTPUT for t in signature.get("outputs", [])) else (
        signature["outputs"][0]["name"])
    lines = [
        "import os",
        "import queue",
        "",
        "import numpy as np",
        "import tritonclient.grpc as grpcclient",
        "",
        f'client = grpcclient.InferenceServerClient(url="{address}"{", ssl=True" if ssl else ""})',
        "# gRPC metadata keys are lower case; the deployment is named in one.",
        'headers = {"authorization": "Bearer " + os.environ["MODELPORT_TOKEN"],',
        f'           "modelport-deployment": "{deployment}"}}',
        "answers = queue.Queue()",
        "client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)",
        f'prompt = grpcclient.InferInput("{request.prompt_input}", {prompt_shape}, "BYTES")',
        f"prompt.set_data_from_numpy(np.array([{request.prompt.encode()!r}] * {_count(prompt_shape)}, "
        f"dtype=np.object_).reshape({prompt_shape}))",
        "inputs = [prompt]",
    ]
    if request.max_tokens_input is not None:
        shape = example_shape(list(request.max_tokens_input.get("dims", [])))
        numpy = _NUMPY[request.max_tokens_input["datatype"]]
        lines += [
            f'max_tokens = grpcclient.InferInput("{MAX_TOKENS}", {shape}, "{request.max_tokens_input["datatype"]}")',
            f"max_tokens.set_data_from_numpy(np.full({shape}, {request.max_tokens}, dtype=np.{numpy}))",
            "inputs.append(max_tokens)",
        ]
    lines += [
        f'client.async_stream_infer("{model}", inputs, enable_empty_final_response=True)',
        "while True:",
        "    result, error = answers.get(timeout=60)",
        "    if error is not None:",
        "        raise SystemExit(error)",
        "    response = result.get_response()",
        "    if response.outputs:",
        # Every element: a response may carry several pieces (a model whose sending fell behind sends them at once).
        f'        print("".join(v.decode() for v in result.as_numpy("{output}").reshape(-1)), end="", flush=True)',
        '    if response.parameters["triton_final_response"].bool_param:',
        "        break",
        "print()",
        "client.stop_stream()",
    ]
    return "\n".join(lines)


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count

