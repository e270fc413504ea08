"""Only the protocol users need reaches Triton: the KServe v2 inference surface that tritonclient.http calls
(health, server and model metadata, config, ready, infer, statistics). Triton's admin APIs answer 403 here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.protocol import Refusal, classify
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

# What tritonclient.http.InferenceServerClient calls for the inference surface (its _client.py builds these).
ALLOWED = [
    ("GET", "/v2"),  # get_server_metadata
    ("GET", "/v2/health/live"),  # is_server_live
    ("GET", "/v2/health/ready"),  # is_server_ready
    ("GET", "/v2/models/digits"),  # get_model_metadata
    ("GET", "/v2/models/digits/versions/1"),
    ("GET", "/v2/models/digits/ready"),  # is_model_ready
    ("GET", "/v2/models/digits/versions/1/ready"),
    ("GET", "/v2/models/digits/config"),  # get_model_config
    ("GET", "/v2/models/digits/versions/12/config"),
    ("GET", "/v2/models/digits/stats"),  # get_inference_statistics
    ("GET", "/v2/models/digits/versions/1/stats"),
    ("GET", "/v2/models/stats"),  # get_inference_statistics() for all of the deployment's models
    ("POST", "/v2/models/digits/infer"),  # infer
    ("POST", "/v2/models/digits/versions/1/infer"),
    ("HEAD", "/v2/health/ready"),
    # Triton's generate extension (issue 33): one JSON answer, or Server-Sent Events from a streaming model.
    ("POST", "/v2/models/digits/generate"),
    ("POST", "/v2/models/digits/generate_stream"),
    ("POST", "/v2/models/digits/versions/1/generate_stream"),
]
# Triton's admin endpoints (tritonclient's repository, logging, trace and shared-memory calls) and other paths.
REFUSED = [
    ("GET", "/v2/logging"), ("POST", "/v2/logging"),
    ("GET", "/v2/trace/setting"), ("POST", "/v2/trace/setting"),
    ("GET", "/v2/models/digits/trace/setting"), ("POST", "/v2/models/digits/trace/setting"),
    ("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/digits/load"),
    ("POST", "/v2/repository/models/digits/unload"),
    ("GET", "/v2/systemsharedmemory/status"), ("POST", "/v2/systemsharedmemory/region/r/register"),
    ("POST", "/v2/systemsharedmemory/unregister"), ("GET", "/v2/cudasharedmemory/status"),
    ("POST", "/v2/cudasharedmemory/region/r/register"),
    ("POST", "/v2/models/digits/generate/x"), ("GET", "/v2/models/digits/versions/1/generate_stream/x"),
    ("GET", "/v2/models/digits/versions/x/config"), ("GET", "/v2/models/digits/versions"),
    ("GET", "/v2/models/../logging"), ("GET", "/v2/models//ready"), ("GET", "/v2/models/digits/"),
    ("GET", "/v2/health"), ("GET", "/v2/health/live/x"), ("GET", "/v2/models"),
]


@pytest.mark.parametrize(("method", "path"), ALLOWED)
def test_the_inference_surface_is_classified_with_its_model(method: str, path: str) -> None:
    endpoint = classify(method, path)
    assert endpoint.model in ("", "digits")
    assert endpoint.kind in ("server", "health", "model", "ready", "config", "stats", "infer", "generate",
                             "generate_stream")


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_everything_else_under_v2_is_refused_with_403_and_what_is_allowed(method: str, path: str) -> None:
    with pytest.raises(Refusal) as refused:
        classify(method, path)
    assert refused.value.status == 403
    assert "KServe v2 inference protocol only" in refused.value.message and "infer" in refused.value.message


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v2/models/digits/infer", "POST"),
    ("POST", "/v2/models/digits", "GET, HEAD"),
    ("DELETE", "/v2/health/ready", "GET, HEAD"),
    ("PUT", "/v2/models/digits/infer", "POST"),
])
def test_the_wrong_method_is_405_with_allow(method: str, path: str, allow: str) -> None:
    with pytest.raises(Refusal) as refused:
        classify(method, path)
    assert refused.value.status == 405 and refused.value.headers == {"Allow": allow}


def test_admin_endpoints_never_reach_triton_while_the_surface_does(people: dict[str, Person], gateway_app: Any) -> None:
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            for method, path in REFUSED:
                reply = await call(app, method, f"/serve/digits-prod{path}", token=alice.token, body=b"{}")
                assert reply.status == 403, (method, path, reply.body)
            assert upstream.requests == []
            for method, path in ALLOWED:
                body = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}'
                reply = await call(app, method, f"/serve/digits-prod{path}", token=alice.token,
                                   body=body if method == "POST" else b"")
                assert reply.status == 200, (method, path, reply.body)
            assert [r.target.decode() for r in upstream.requests] == [path for _, path in ALLOWED]

    run(scenario)


def test_another_teams_deployment_is_404_before_any_endpoint_check(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            reply = await call(gateway_app(), "GET", "/serve/digits-prod/v2/logging", token=people["charlie"].token)
            assert reply.status == 404 and reply.json() == {"error": (
                "There is no deployment named 'digits-prod' in team 'globex', the team this request acts for. "
                "GET /api/v1/deployments/ lists the team's deployments.")}
            assert upstream.requests == []

    run(scenario)
