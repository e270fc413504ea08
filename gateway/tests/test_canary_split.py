"""A canary through the gateway: each request is drawn on its own (the share is exact in expectation, and a client
is not stuck to one revision), the answer names the revision (Modelport-Revision), a client pins the serving or
the canary revision with the same header and nothing else, and the statistics are kept per revision. Two scripted
upstreams stand in for the two Tritons; tests/test_canary_e2e.py does it with real ones."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from deployments.models import Deployment, Revision
from gateway.access import Route, choose
from gateway.protocol import Refusal
from gateway.tests.fake_upstream import FakeUpstream, Request, json_response
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person


def answering(number: int) -> Any:
    def answer(request: Request) -> bytes:
        return json_response({"revision": number})

    return answer


def add_canary(deployment: Any, upstream_url: str, percent: int) -> None:
    revision = Revision.objects.create(deployment=deployment, number=2,
                                       spec={"models": [{"name": "digits", "version": 1, "format": "onnx"}]})
    Deployment.objects.filter(pk=deployment.pk).update(canary_revision=revision, canary_upstream_url=upstream_url,
                                                       canary_grpc_upstream="127.0.0.1:1", canary_percent=percent)


def test_the_split_follows_the_percent_and_every_answer_names_its_revision(
        people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(answering(1)) as stable, FakeUpstream(answering(2)) as canary:
            deployment = await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", stable.url)
            await asyncio.to_thread(add_canary, deployment, canary.url, 20)
            app = gateway_app()
            token = people["bob"].token
            seen = {1: 0, 2: 0}
            runs = []  # how long a client stays on one revision: the draws are independent
            for _ in range(1000):
                reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=token)
                assert reply.status == 200
                number = reply.json()["revision"]
                assert reply.headers[b"modelport-revision"] == str(number).encode()
                seen[number] += 1
                runs.append(number)
            # 20% of 1000: sd = sqrt(1000 * 0.2 * 0.8) ~ 12.6; 5 sd either side.
            assert abs(seen[2] - 200) < 5 * math.sqrt(1000 * 0.2 * 0.8), seen
            switches = sum(a != b for a, b in zip(runs, runs[1:], strict=False))
            assert switches > 200  # 2 * 0.2 * 0.8 * 999 ~ 320 expected; sticky routing would switch ~never

            # Pinned: every answer from the revision asked for.
            for number in (1, 2):
                for _ in range(20):
                    reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=token,
                                       headers={"Modelport-Revision": str(number)})
                    assert reply.json()["revision"] == number
                    assert reply.headers[b"modelport-revision"] == str(number).encode()

            buckets = app.collector.take()
            counted = {revision: 0 for revision in (0, 1, 2)}
            for (_, revision, _, _), bucket in buckets.items():
                counted[revision] += bucket.requests
            assert counted == {0: 0, 1: seen[1] + 20, 2: seen[2] + 20}

    run(scenario, timeout=60)


def test_a_pin_names_the_serving_or_the_canary_revision_and_nothing_else(
        people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(answering(1)) as stable:
            deployment = await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", stable.url)
            app = gateway_app()
            token = people["alice"].token
            for value, status, message in [
                ("3", 404, "Revision 3 does not serve 'digits-prod' (serving: 1)."),
                ("0", 404, "Revision 0 does not serve 'digits-prod' (serving: 1)."),
                ("two", 400, "Modelport-Revision must be a revision number of this deployment, e.g. 3."),
                ("-1", 400, "Modelport-Revision must be a revision number of this deployment, e.g. 3."),
                ("9" * 40, 400, "Modelport-Revision must be a revision number of this deployment, e.g. 3."),
                ("\u00b2", 400, "Modelport-Revision must be a revision number of this deployment, e.g. 3."),
            ]:
                reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=token,
                                   headers={"Modelport-Revision": value})
                assert (reply.status, reply.json()["error"]) == (status, message), value
                assert len(stable.requests) == 0  # refused before anything reached Triton
            # Without a canary nothing goes elsewhere, and the answer names revision 1.
            reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=token)
            assert reply.headers[b"modelport-revision"] == b"1"
            # Charlie's team sees no such deployment, pinned or not.
            reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=people["charlie"].token,
                               headers={"Modelport-Revision": "1"})
            assert reply.status == 404 and b"modelport-revision" not in reply.headers
            del deployment

    run(scenario)


def test_the_choice_without_a_gateway() -> None:
    route = Route(deployment_id=1, name="d", upstream_url="http://a", status="ready", grpc_target="a:1", revision=4,
                  canary_revision=5, canary_url="", canary_grpc_target="", canary_percent=50)
    # A canary still starting takes nothing, and a pin to it says so.
    assert {choose(route, None).revision for _ in range(200)} == {4}
    try:
        choose(route, "5")
        raise AssertionError("a pin to a starting canary must be refused")
    except Refusal as exc:
        assert exc.status == 503 and "is starting" in exc.message
    serving = Route(deployment_id=1, name="d", upstream_url="http://a", status="ready", grpc_target="a:1", revision=4,
                    canary_revision=5, canary_url="http://b", canary_grpc_target="b:1", canary_percent=50)
    assert choose(serving, "5", grpc=True).upstream == "b:1"
    assert choose(serving, " 4 ", grpc=True).upstream == "a:1"
    assert {choose(serving, None).upstream for _ in range(200)} == {"http://a", "http://b"}


# --- gRPC ----------------------------------------------------------------------------------------------------------


def test_grpc_calls_are_split_named_and_pinned_like_http(people: dict[str, Person], settings: Any) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    from gateway.tests.grpc_fake_upstream import FakeTriton
    from gateway.tests.grpc_support import PREFIX, infer_request, meta, next_answer, open_stream, stack

    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = settings.GATEWAY_RATE_LIMIT_BURST = 10_000

    async def scenario() -> None:
        async with stack() as (gateway, stable, channel):
            canary = await FakeTriton().start()
            try:
                def setup() -> None:
                    deployment = make_deployment(people["alice"], "digits-prod", "http://127.0.0.1:9")
                    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=stable.target)
                    add_canary(deployment, "http://127.0.0.1:10", 30)
                    Deployment.objects.filter(pk=deployment.pk).update(canary_grpc_upstream=canary.target)

                await asyncio.to_thread(setup)
                method = channel.unary_unary(PREFIX + "ModelReady")
                ready = pb.ModelReadyRequest(name="digits").SerializeToString()
                named = {"1": 0, "2": 0}
                for _ in range(300):
                    call = method(ready, metadata=meta(people["bob"]), timeout=10)
                    await call
                    named[dict(await call.initial_metadata())["modelport-revision"]] += 1
                assert (named["1"], named["2"]) == (len(stable.calls), len(canary.calls))
                assert abs(named["2"] - 90) < 5 * math.sqrt(300 * 0.3 * 0.7), named
                # Pinned to the canary: every call goes there.
                before = len(canary.calls)
                for _ in range(10):
                    await method(ready, metadata=meta(people["bob"], **{"modelport-revision": "2"}), timeout=10)
                assert len(canary.calls) == before + 10
                # A pin to another revision is NOT_FOUND, a made-up value INVALID_ARGUMENT; neither is forwarded.
                for value, code in (("7", grpc.StatusCode.NOT_FOUND), ("x", grpc.StatusCode.INVALID_ARGUMENT)):
                    try:
                        await method(ready, metadata=meta(people["bob"], **{"modelport-revision": value}), timeout=10)
                        raise AssertionError("refused pins must fail")
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == code, exc
                assert len(stable.calls) + len(canary.calls) == 310
                # A stream is split per request too, and keeps both upstream streams open.
                stream = await open_stream(channel, meta(people["alice"]))
                for n in range(60):
                    await stream.write(infer_request([1], b"\0" * 4, request_id=str(n)))
                    assert (await next_answer(stream)).infer_response.id == str(n)
                await stream.done_writing()
                assert await stream.code() == grpc.StatusCode.OK
                streamed = [c for c in canary.calls if c.method == "ModelStreamInfer"]
                assert len(streamed) > 0 and len([c for c in stable.calls if c.method == "ModelStreamInfer"]) > 0
                counted: dict[int, int] = {}
                for (_, revision, _, _), bucket in gateway.collector.take().items():
                    counted[revision] = counted.get(revision, 0) + bucket.requests
                assert counted.get(1, 0) + counted.get(2, 0) == 370
            finally:
                await canary.stop()

    run(scenario, timeout=60)
