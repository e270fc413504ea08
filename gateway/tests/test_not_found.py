"""The gateway's 404s (gateway/not_found.py) read as the REST API's: a deployment the caller's team lacks names that
team and where its deployments are listed, and another team's reads exactly the same; a model the deployment does
not serve gets one message for a dedicated and a shared deployment, over HTTP and gRPC (NOT_FOUND), in a stream too,
and never reaches Triton. Scripted upstreams stand in for Triton here, to see that nothing reached it; the real one
answers the same in tests/test_gateway_e2e.py and tests/test_grpc_gateway_e2e.py."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from asgiref.sync import sync_to_async
from tritonclient.grpc import service_pb2 as pb

from gateway.tests.fake_upstream import FakeUpstream, echo
from gateway.tests.grpc_support import PREFIX, infer_request, meta, next_answer, open_stream, stack
from gateway.tests.pool_support import shared_deployment
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person, browser_cookies

NO_MODEL = "Deployment '{deployment}' in team 'acme' serves no model named 'nosuch'. Its models: {models}."


def api_404(person: Person, name: str) -> str:
    response = person.client().get(f"/api/v1/deployments/{name}/")
    assert response.status_code == 404, response.content
    return str(response.json()["error"]["message"])


@pytest.fixture(autouse=True)
def _generous_rate_limits(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000


def test_an_unknown_deployment_is_the_apis_404_naming_the_team_for_tokens_and_sessions(
    people: dict[str, Person], gateway_app: Any
) -> None:
    alice, charlie = people["alice"], people["charlie"]
    make_deployment(alice, "digits-prod", "http://127.0.0.1:9")
    missing = api_404(alice, "ghost")
    theirs = api_404(charlie, "digits-prod")
    cookies = browser_cookies(alice)
    assert missing == (
        "There is no deployment named 'ghost' in team 'acme', the team this request acts for. "
        "GET /api/v1/deployments/ lists the team's deployments."
    )

    async def scenario() -> None:
        app = gateway_app()
        by_token = await call(app, "GET", "/serve/ghost/v2/models/digits", token=alice.token)
        by_session = await call(app, "GET", "/serve/ghost/v2/models/digits", headers={"cookie": cookies})
        other_team = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=charlie.token)
        assert by_token.status == by_session.status == other_team.status == 404
        assert by_token.json() == by_session.json() == {"error": missing}
        assert other_team.json() == {"error": theirs}
        assert "'globex'" in theirs and "acme" not in theirs
        await app.close()

    run(scenario)


def test_a_model_a_dedicated_deployment_lacks_is_the_gateways_404_and_never_reaches_triton(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream(echo) as triton:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", triton.url, ("digits", "text"))
            app = gateway_app()
            for method, path in [
                ("GET", "/v2/models/nosuch"),
                ("GET", "/v2/models/nosuch/ready"),
                ("POST", "/v2/models/nosuch/versions/1/infer"),
            ]:
                reply = await call(
                    app,
                    method,
                    f"/serve/digits-prod{path}",
                    token=people["alice"].token,
                    body=b"{}" if method == "POST" else b"",
                )
                assert reply.status == 404, (path, reply.body)
                assert reply.json() == {"error": NO_MODEL.format(deployment="digits-prod", models="'digits', 'text'")}
            assert triton.requests == []
            own = await call(app, "GET", "/serve/digits-prod/v2/models/text", token=people["alice"].token)
            assert own.status == 200 and len(triton.requests) == 1
            await app.close()

    run(scenario)


def test_a_shared_deployment_says_the_same_as_a_dedicated_one(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            app = gateway_app()
            reply = await call(app, "GET", "/serve/mine/v2/models/nosuch", token=people["alice"].token)
            assert reply.status == 404
            assert reply.json() == {"error": NO_MODEL.format(deployment="mine", models="'digits'")}
            assert pool_triton.requests == []
            await app.close()

    run(scenario)


def test_many_models_are_listed_up_to_ten_and_where_to_see_the_rest(
    people: dict[str, Person], gateway_app: Any
) -> None:
    names = tuple(f"m{n:02d}" for n in range(12))

    async def scenario() -> None:
        async with FakeUpstream(echo) as triton:
            await asyncio.to_thread(make_deployment, people["alice"], "many", triton.url, names)
            app = gateway_app()
            reply = await call(app, "GET", "/serve/many/v2/models/nosuch", token=people["alice"].token)
            listed = ", ".join(f"'{n}'" for n in names[:10])
            assert reply.json() == {
                "error": NO_MODEL.format(
                    deployment="many", models=f"{listed} and 2 more (GET /api/v1/deployments/many/ lists them)"
                )
            }
            await app.close()

    run(scenario)


def deploy_grpc(person: Person, name: str, target: str) -> None:
    from deployments.models import Deployment

    deployment = make_deployment(person, name, "http://127.0.0.1:9")
    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=target)


def test_grpc_says_the_same_with_not_found_in_unary_calls_and_in_a_stream(people: dict[str, Person]) -> None:
    alice = people["alice"]
    missing = api_404(alice, "ghost")
    theirs = api_404(people["charlie"], "digits-prod")
    no_model = NO_MODEL.format(deployment="digits-prod", models="'digits'")

    async def failure(
        channel: grpc.aio.Channel, method: str, request: bytes, metadata: tuple[tuple[str, str], ...]
    ) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await channel.unary_unary(PREFIX + method)(request, metadata=metadata, timeout=10)
        return raised.value

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_grpc, alice, "digits-prod", fake.target)
            ready = pb.ModelReadyRequest(name="digits").SerializeToString()
            ghost = await failure(channel, "ModelReady", ready, meta(alice, "ghost"))
            other = await failure(channel, "ModelReady", ready, meta(people["charlie"]))
            assert (ghost.code(), ghost.details()) == (grpc.StatusCode.NOT_FOUND, missing)
            assert (other.code(), other.details()) == (grpc.StatusCode.NOT_FOUND, theirs)
            for method, request in [
                ("ModelInfer", infer_request([1], b"\0" * 4, model="nosuch")),
                ("ModelMetadata", pb.ModelMetadataRequest(name="nosuch").SerializeToString()),
                ("ModelConfig", pb.ModelConfigRequest(name="nosuch").SerializeToString()),
            ]:
                exc = await failure(channel, method, request, meta(alice))
                assert (exc.code(), exc.details()) == (grpc.StatusCode.NOT_FOUND, no_model), method
            stream = await open_stream(channel, meta(alice))
            await stream.write(infer_request([1], b"\0" * 4, model="nosuch", request_id="7"))
            refused = await next_answer(stream)
            assert refused.error_message == no_model and refused.infer_response.id == "7"
            await stream.write(infer_request([1], b"\0" * 4, request_id="8"))
            assert (await next_answer(stream)).infer_response.id == "8"  # the stream goes on
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK
            # Only the stream's second request reached Triton.
            assert [(c.method, pb.ModelInferRequest.FromString(c.request).id) for c in fake.calls] == [
                ("ModelStreamInfer", "8")
            ]

    run(scenario)
