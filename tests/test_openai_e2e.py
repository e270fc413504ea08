"""The OpenAI-compatible API end to end (issue 33): the sample text generator deployed with the portal's one-click
button on a real Triton, called with the official `openai` SDK (base_url <portal>/serve/<deployment>/v1, the team's
API token as its key): chat and completions, whole and streamed (the chunks timed as they arrive: a buffered answer
fails), the models list, another team's and a bad token, what the deployment cannot honour, the model's own
refusal, and the deployment page's `openai` and gRPC snippets run as copied."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import openai
import pytest
from django.test import Client

from tests.deploying import wait_status
from tests.processes import GrpcGatewayProcess, wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def openai_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "100")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "100")


def sdk(portal_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{portal_url}/serve/textgen/v1", api_key=token, max_retries=0, timeout=60)


def timed(stream: Any) -> list[tuple[float, Any]]:
    started = time.monotonic()
    return [(time.monotonic() - started, chunk) for chunk in stream]


def test_the_openai_sdk_calls_the_sample_text_generator_through_the_deployments_api(
    openai_settings: None, people: dict[str, Person], portal_url: str, grpc_gateway: GrpcGatewayProcess
) -> None:
    alice = people["alice"]
    browser = Client()
    browser.force_login(alice.user)
    response = browser.post("/samples/deploy/", {"sample": "textgen"})
    assert response.status_code == 302, response.content[:500]
    wait_for(lambda: alice.client().get("/api/v1/deployments/textgen/").status_code == 200, 60,
             what="the worker to create the sample's deployment")
    wait_status(alice, "textgen", "ready", timeout=240)
    client = sdk(portal_url, alice.token)

    # models.list(): the deployment's one model.
    assert [m.id for m in client.models.list()] == ["textgen"]

    # Chat, whole: the pieces joined, a finish reason, the usage filled in.
    chat = client.chat.completions.create(model="textgen", messages=[{"role": "user", "content": "MENENIUS:"}],
                                          max_tokens=12, seed=7)
    (choice,) = chat.choices
    assert choice.message.content and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage is not None and chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 12
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

    # Chat, streamed: the pieces arrive one by one as the model makes them (a buffered answer would have its first
    # piece arrive with its last), then a finish reason, and the stream ends. Long, so that a first piece slowed by a
    # loaded machine still comes well before the last (0.004 s and 0.37 s for 400 pieces, idle).
    got = timed(client.chat.completions.create(model="textgen", messages=[{"role": "user", "content": "MENENIUS:"}],
                                               max_tokens=1000, seed=7, stream=True,
                                               stream_options={"include_usage": True}))
    pieces = [(at, c.choices[0].delta.content) for at, c in got if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 50
    first, last = pieces[0][0], pieces[-1][0]
    print(f"streamed chat: {len(pieces)} pieces, the first at {first:.3f} s, the last at {last:.3f} s")
    assert first < last / 2, (first, last)
    finishes = [c.choices[0].finish_reason for _, c in got if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    usage = got[-1][1].usage
    # A chunk carries one piece, or several the model sent in one response when its sending fell behind.
    assert usage is not None and len(pieces) <= usage.completion_tokens <= 1000
    assert (finishes == ["length"]) == (usage.completion_tokens == 1000)

    # Completions, whole and streamed: the same seed, the same text.
    whole = client.completions.create(model="textgen", prompt="First Citizen:\n", max_tokens=16, seed=3)
    assert whole.choices[0].text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    streamed = timed(client.completions.create(model="textgen", prompt="First Citizen:\n", max_tokens=16, seed=3,
                                               stream=True))
    texts = [c.choices[0].text for _, c in streamed if c.choices and c.choices[0].text]
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].text
    assert streamed[-1][0] > streamed[0][0]

    # Another team's token: as if the deployment did not exist; a made-up token: not signed in.
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(portal_url, people["charlie"].token).chat.completions.create(
            model="textgen", messages=[{"role": "user", "content": "hi"}])
    assert "textgen" in str(missing.value)
    with pytest.raises(openai.AuthenticationError):
        sdk(portal_url, "mp_not-a-token").models.list()

    # What this deployment cannot honour: a 400 naming the parameter, before Triton is asked.
    refused: list[tuple[str, dict[str, Any]]] = [
        ("n", {"n": 2}), ("logprobs", {"logprobs": True}),
        ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})]
    for name, extra in refused:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="textgen", messages=[{"role": "user", "content": "hi"}], **extra)
        assert name in str(bad.value), (name, str(bad.value))

    # The model's own refusal (max_tokens over its limit of 1024): a 400 with its words, streamed or not.
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as over:
            answer = client.chat.completions.create(model="textgen", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=5000, stream=stream)
            list(answer)  # type: ignore[call-overload]
        assert "max_tokens must be between 1 and 1024, got 5000" in str(over.value), str(over.value)

    # Every setting left out: none is sent (the sample declares them optional), the model's own defaults apply (16
    # tokens); a stop list reaches its [-1, -1] BYTES input.
    plain = client.completions.create(model="textgen", prompt="CORIOLANUS:\n")
    assert plain.choices[0].text and plain.usage is not None and plain.usage.completion_tokens == 16
    stopped = client.completions.create(model="textgen", prompt="CORIOLANUS:\n", max_tokens=200, seed=1,
                                        stop=[" ", "\n"])
    assert stopped.choices[0].finish_reason == "stop" and " " not in stopped.choices[0].text

    # The deployment page's snippets, run as copied with the token exported.
    from models_registry.samples import TEXTGEN_EXAMPLE_REQUEST, TEXTGEN_SIGNATURE
    from web import stream_panel

    signature = TEXTGEN_SIGNATURE.to_json()
    example = {i["name"]: i["data"] for i in TEXTGEN_EXAMPLE_REQUEST["inputs"]}
    request = stream_panel.stream_request(signature, example)
    assert request is not None and request.openai
    host, port = grpc_gateway.address.rsplit(":", 1)
    snippets = {"openai": stream_panel.openai_snippet(portal_url, "textgen", "textgen", request),
                "grpc": stream_panel.grpc_snippet(grpc_gateway.address, False, "textgen", "textgen", signature,
                                                  request)}
    for which, code in snippets.items():
        ran = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MODELPORT_TOKEN": alice.token},
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (which, ran.stderr[-2000:])
        assert len(ran.stdout.strip()) > 10, (which, ran.stdout, ran.stderr[-2000:])
