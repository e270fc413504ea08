"""The gRPC gateway (gateway/grpc_app.py) on real sockets: the real GrpcGateway, the real access checks on the test
database, a stock gRPC client, and a scripted gRPC server in place of Triton (grpc_fake_upstream.py) so that each
test can see what was forwarded and what never arrived. The real Triton runs in tests/test_grpc_gateway_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway.tests.grpc_fake_upstream import FakeTriton
from gateway.tests.grpc_support import PREFIX, infer_request, meta, next_answer, open_stream, stack
from tests.support.gateway_calls import make_deployment, run
from tests.support.people import Person

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _grpc_gateway_settings(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000
    settings.GATEWAY_MAX_BODY_BYTES = 2 * MB
    settings.GATEWAY_MAX_TENSOR_BYTES = 2 * MB
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 5


def deploy(person: Person, name: str, target: str, models: tuple[str, ...] = ("digits",)) -> Any:
    from deployments.models import Deployment

    deployment = make_deployment(person, name, "http://127.0.0.1:9", models)
    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=target)
    return deployment


async def call(channel: grpc.aio.Channel, method: str, request: bytes,
               metadata: tuple[tuple[str, str], ...], **kwargs: Any) -> bytes:
    response: bytes = await channel.unary_unary(PREFIX + method)(request, metadata=metadata, timeout=10, **kwargs)
    return response


async def failure(channel: grpc.aio.Channel, method: str, request: bytes,
                  metadata: tuple[tuple[str, str], ...], **kwargs: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(channel, method, request, metadata, **kwargs)
    return raised.value


def retry_after(exc: grpc.aio.AioRpcError) -> str | None:
    return dict(exc.trailing_metadata() or ()).get("retry-after")


READY = pb.ModelReadyRequest(name="digits").SerializeToString()


# --- Forwarding -----------------------------------------------------------------------------------------------


def test_it_forwards_the_exact_bytes_and_none_of_the_callers_metadata(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            sent = infer_request([2, 2], bytes(range(16)), request_id="r1")
            answer = await call(channel, "ModelInfer", sent, meta(people["bob"], **{"modelport-admin-key": "guess",
                                                                                     "x-team": "globex"}))
            assert pb.ModelInferResponse.FromString(answer).raw_output_contents == [bytes(range(16))]
            assert fake.calls[0].method == "ModelInfer" and fake.calls[0].request == sent
            forwarded = fake.calls[0].metadata
            assert not {"authorization", "modelport-deployment", "modelport-admin-key", "x-team"} & set(forwarded)
            assert pb.ServerLiveResponse.FromString(await call(channel, "ServerLive", b"", meta(people["alice"]))).live

    run(scenario)


def test_the_stock_tritonclient_works_with_the_metadata(people: dict[str, Person]) -> None:
    import numpy as np
    from tritonclient.grpc import InferInput
    from tritonclient.grpc import aio as grpcclient

    async def scenario() -> None:
        async with stack() as (gateway, fake, _):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.port}")
            headers = {"authorization": f"Bearer {people['alice'].token}", "modelport-deployment": "digits-prod"}
            assert await client.is_server_live(headers=headers)
            assert await client.is_model_ready("digits", headers=headers)
            tensor = InferInput("input", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
            await client.infer("digits", [tensor], headers=headers, request_id="abc")
            sent = pb.ModelInferRequest.FromString(fake.calls[-1].request)
            assert (sent.model_name, sent.id, list(sent.inputs[0].shape)) == ("digits", "abc", [1, 4])
            await client.close()

    run(scenario)


# --- Who may call what ------------------------------------------------------------------------------------------


def test_it_refuses_tritons_admin_methods_after_authentication_and_forwards_none(people: dict[str, Person]) -> None:
    admin = ["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryStatus",
             "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryRegister",
             "TraceSetting", "LogSettings", "SomethingNew"]

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            for method in admin:
                exc = await failure(channel, method, b"", meta(people["alice"]))
                assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, method
                assert "KServe v2 inference protocol only" in (exc.details() or "")
                anonymous = await failure(channel, method, b"", meta(None))
                assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED, method
            other = await failure(channel, "../grpc.health.v1.Health/Watch", b"", meta(people["alice"]))
            assert other.code() == grpc.StatusCode.PERMISSION_DENIED
            assert fake.calls == []

    run(scenario)


def test_other_services_are_not_served_and_the_health_check_needs_no_credential(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, _fake, channel):
            reflection = channel.unary_unary("/grpc.reflection.v1alpha.ServerReflection/X")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await reflection(b"", timeout=5)
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
            health = channel.unary_unary("/grpc.health.v1.Health/Check")
            assert await health(b"", timeout=5) == b"\x08\x01"  # SERVING

    run(scenario)


def test_callers_without_a_valid_token_are_unauthenticated(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            cases = [meta(None), (("authorization", "Basic YWxpY2U6cGFzc3dvcmQ="), ("modelport-deployment", "x")),
                     (("authorization", "Bearer mp_nope_nope"), ("modelport-deployment", "digits-prod")),
                     (("authorization", "Bearer " + "x" * 5000), ("modelport-deployment", "digits-prod"))]
            for metadata in cases:
                exc = await failure(channel, "ModelReady", READY, metadata)
                assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
                assert "authorization" in (exc.details() or "") or "invalid" in (exc.details() or "")
            assert fake.calls == []

    run(scenario)


def test_another_teams_deployment_is_not_found_exactly_like_a_missing_one(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            charlie = await failure(channel, "ModelReady", READY, meta(people["charlie"]))
            ghost = await failure(channel, "ModelReady", READY, meta(people["alice"], "ghost"))
            assert charlie.code() == ghost.code() == grpc.StatusCode.NOT_FOUND
            assert charlie.details() == ("There is no deployment named 'digits-prod' in team 'globex', the team this "
                                         "request acts for. GET /api/v1/deployments/ lists the team's deployments.")
            assert ghost.details() == ("There is no deployment named 'ghost' in team 'acme', the team this request "
                                       "acts for. GET /api/v1/deployments/ lists the team's deployments.")
            unnamed = await failure(channel, "ModelReady", READY, meta(people["alice"], None))
            assert unnamed.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "modelport-deployment" in (unnamed.details() or "")
            assert fake.calls == []
            assert pb.ModelReadyResponse.FromString(await call(channel, "ModelReady", READY, meta(people["bob"]))).ready

    run(scenario)


def test_a_revoked_token_is_refused_within_the_cache_window(people: dict[str, Person]) -> None:
    from accounts import actions
    from accounts.models import ApiToken

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            await call(channel, "ModelReady", READY, meta(people["alice"]))
            await asyncio.to_thread(lambda: actions.revoke_token(ApiToken.objects.get(user=people["alice"].user),
                                                                      by=people["alice"].user, via="session"))
            await asyncio.sleep(0.6)
            exc = await failure(channel, "ModelReady", READY, meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
            assert len(fake.calls) == 1

    run(scenario)


def test_a_deployment_that_is_not_ready_is_unavailable_with_a_retry_hint(people: dict[str, Person]) -> None:
    from deployments.models import Deployment

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", "")
            await asyncio.to_thread(lambda: Deployment.objects.filter(name="digits-prod").update(status="starting"))
            exc = await failure(channel, "ModelReady", READY, meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            assert exc.details() == "Deployment 'digits-prod' is not ready (status: starting); retry in a few seconds."
            assert retry_after(exc) == "2"
            # Stopped: the route goes nowhere even though the row still names a server.
            await asyncio.to_thread(lambda: Deployment.objects.filter(name="digits-prod").update(
                grpc_upstream=fake.target, desired_state="stopped"))
            await asyncio.sleep(0.6)
            assert (await failure(channel, "ModelReady", READY,
                                  meta(people["alice"]))).code() == grpc.StatusCode.UNAVAILABLE
            assert fake.calls == []

    run(scenario)


def test_the_rate_limit_is_resource_exhausted_with_a_retry_hint_and_shared_by_a_users_tokens(
    people: dict[str, Person], settings: Any
) -> None:
    from accounts.models import ApiToken

    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 2
    settings.GATEWAY_RATE_LIMIT_BURST = 5

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            alice = people["alice"]
            _, second = await asyncio.to_thread(ApiToken.issue, alice.user, alice.team, "second")
            for _ in range(5):
                await call(channel, "ModelReady", READY, meta(alice))
            limited = (("authorization", f"Bearer {second}"), ("modelport-deployment", "digits-prod"))
            exc = await failure(channel, "ModelReady", READY, limited)
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "slow down" in (exc.details() or "") and int(retry_after(exc) or 0) >= 1
            assert len(fake.calls) == 5
            # Bob's own bucket is untouched.
            await call(channel, "ModelReady", READY, meta(people["bob"]))

    run(scenario)


# --- Limits and checks --------------------------------------------------------------------------------------------


def test_an_inference_request_that_would_crash_triton_is_refused_and_not_forwarded(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            huge = await failure(channel, "ModelInfer", infer_request([2**62], b""), meta(people["alice"]))
            assert huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit is" in (huge.details() or "")
            wrong = await failure(channel, "ModelInfer", infer_request([4], b"\0" * 8), meta(people["alice"]))
            assert wrong.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "takes 16 bytes" in (wrong.details() or "")
            garbage = await failure(channel, "ModelInfer", b"\x0a\x50digits", meta(people["alice"]))
            assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT and "protobuf" in (garbage.details() or "")
            config = await failure(channel, "ModelConfig", b"", meta(people["alice"]))
            assert config.code() == grpc.StatusCode.INVALID_ARGUMENT and "model's name" in (config.details() or "")
            assert fake.calls == []

    run(scenario)


def test_model_infer_on_a_streaming_model_is_invalid_argument_naming_the_stream_and_is_not_forwarded(
    people: dict[str, Person]
) -> None:
    from deployments.models import Deployment, Revision

    def streaming(target: str) -> None:
        deployment = deploy(people["alice"], "digits-prod", target)
        Revision.objects.filter(deployment=deployment).update(spec={"models": [
            {"name": "digits", "version": 1, "format": "python", "decoupled": True}]})
        Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.READY)

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(streaming, fake.target)
            refused = await failure(channel, "ModelInfer", infer_request([1, 4], b"\0" * 16), meta(people["alice"]))
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "ModelStreamInfer" in (refused.details() or "") and "generate_stream" in (refused.details() or "")
            assert fake.calls == []

    run(scenario)


def test_messages_over_the_body_limit_are_refused_even_when_compressed(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            big = infer_request([768 * 1024], b"\0" * (3 * MB))
            exc = await failure(channel, "ModelInfer", big, meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(gzip.compress(big)) < 100_000  # on the wire it is small; inflated it is over the limit
            exc = await failure(channel, "ModelInfer", big, meta(people["alice"]), compression=grpc.Compression.Gzip)
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            fits = infer_request([256 * 1024], b"\x01" * MB)
            answer = await call(channel, "ModelInfer", fits, meta(people["alice"]), compression=grpc.Compression.Gzip)
            assert pb.ModelInferResponse.FromString(answer).raw_output_contents == [b"\x01" * MB]
            assert [c.method for c in fake.calls] == ["ModelInfer"]

    run(scenario)


# --- Triton's answers ---------------------------------------------------------------------------------------------


def test_tritons_own_errors_pass_through_with_their_code_and_message(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            fake.answers["ModelInfer"] = (grpc.StatusCode.INVALID_ARGUMENT, "unexpected inference input 'nope'")
            exc = await failure(channel, "ModelInfer", infer_request([1], b"\0" * 4), meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert exc.details() == "unexpected inference input 'nope'"
            # A model of the deployment that its Triton does not have (it failed to load): Triton's answer.
            fake.answers["ModelConfig"] = (grpc.StatusCode.NOT_FOUND,
                                           "Request for unknown model: 'digits' has no available versions")
            exc = await failure(channel, "ModelConfig", pb.ModelConfigRequest(name="digits").SerializeToString(),
                                meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.NOT_FOUND and "no available versions" in (exc.details() or "")

    run(scenario)


def test_an_unreachable_triton_is_unavailable_without_revealing_its_address(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, _fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", "127.0.0.1:9")
            exc = await failure(channel, "ModelReady", READY, meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            assert "unreachable" in (exc.details() or "") and "127.0.0.1" not in (exc.details() or "")
            assert retry_after(exc) == "2"

    run(scenario)


def test_a_slow_triton_is_a_deadline_exceeded_and_a_huge_answer_is_refused(
    people: dict[str, Person], settings: Any
) -> None:
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 0.5
    settings.GATEWAY_MAX_RESPONSE_BYTES = 64 * 1024

    async def sleepy(request: bytes) -> bytes:
        await asyncio.sleep(30)  # far past the deadline (the fake is stopped without waiting for it)
        return b""

    async def huge(request: bytes) -> bytes:
        return pb.ModelInferResponse(model_name="digits", raw_output_contents=[b"\0" * 100_000]).SerializeToString()

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            fake.answers["ModelInfer"] = sleepy
            started = time.monotonic()
            exc = await failure(channel, "ModelInfer", infer_request([1], b"\0" * 4), meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "within 0.5 s" in (exc.details() or "")
            # It gave up at its deadline, not when Triton answered; room for the caller's first lookups on a loaded
            # machine.
            assert time.monotonic() - started < 10
            fake.answers["ModelInfer"] = huge
            exc = await failure(channel, "ModelInfer", infer_request([1], b"\0" * 4), meta(people["alice"]))
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "GATEWAY_MAX_RESPONSE_BYTES" in (exc.details() or "")

    run(scenario)


def test_statistics_count_each_call_with_its_status_per_deployment_and_model(people: dict[str, Person]) -> None:
    from gateway.models import RequestStats
    from gateway.stats import REQUESTS

    before = REQUESTS.labels("acme", "digits-prod", "0", "digits", "400")._value.get()

    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            await call(channel, "ModelInfer", infer_request([1], b"\0" * 4), meta(people["alice"]))
            await failure(channel, "ModelInfer", infer_request([1], b"\0" * 8), meta(people["alice"]))
            await failure(channel, "ModelInfer", infer_request([1], b"\0" * 4, model="made-up"), meta(people["alice"]))
            await failure(channel, "ModelInfer", infer_request([1], b"\0" * 4), meta(people["charlie"]))
            await gateway._flush()

    run(scenario)
    rows = RequestStats.objects.filter(deployment__name="digits-prod")
    assert sum(r.requests for r in rows) == 3  # charlie's call never reached a deployment
    assert sum(r.errors for r in rows) == 0  # a 400 is the client's mistake, not an error
    # Per model called: the made-up name is stored under no model, never under a key of its own.
    per_model: dict[str, int] = {}
    for row in rows:
        per_model[row.model] = per_model.get(row.model, 0) + row.requests
    assert per_model == {"digits": 2, "": 1}

    assert REQUESTS.labels("acme", "digits-prod", "0", "digits", "400")._value.get() == before + 1
    assert REQUESTS.labels("acme", "digits-prod", "0", "(other)", "404")._value.get() >= 1  # a model it does not serve


# --- ModelStreamInfer ---------------------------------------------------------------------------------------------


def test_a_stream_relays_answers_and_answers_a_refused_request_in_the_stream(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            stream = await open_stream(channel, meta(people["alice"]))
            await stream.write(infer_request([1], b"\0" * 4, request_id="1"))
            assert (await next_answer(stream)).infer_response.id == "1"
            await stream.write(infer_request([2**62], b"", request_id="2"))
            refused = await next_answer(stream)
            assert "limit is" in refused.error_message and refused.infer_response.id == "2"
            await stream.write(infer_request([1], b"\0" * 4, request_id="3"))
            assert (await next_answer(stream)).infer_response.id == "3"
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK
            assert [pb.ModelInferRequest.FromString(c.request).id for c in fake.calls] == ["1", "3"]
            assert not {"authorization", "modelport-deployment"} & set(fake.calls[0].metadata)

    run(scenario)


def test_a_stream_is_refused_up_front_without_a_token_or_for_another_team(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            for metadata, code in [(meta(None), grpc.StatusCode.UNAUTHENTICATED),
                                   (meta(people["charlie"]), grpc.StatusCode.NOT_FOUND)]:
                stream = await open_stream(channel, metadata)
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await stream.write(infer_request([1], b"\0" * 4))
                assert await stream.code() == code
            assert fake.calls == []

    run(scenario)


def test_revoking_the_token_ends_an_open_stream_within_the_cache_window(people: dict[str, Person]) -> None:
    from accounts import actions
    from accounts.models import ApiToken

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            stream = await open_stream(channel, meta(people["alice"]))
            await stream.write(infer_request([1], b"\0" * 4, request_id="1"))
            await next_answer(stream)
            await asyncio.to_thread(lambda: actions.revoke_token(ApiToken.objects.get(user=people["alice"].user),
                                                                      by=people["alice"].user, via="session"))
            await asyncio.sleep(0.6)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await stream.write(infer_request([1], b"\0" * 4, request_id="2"))
            assert await stream.code() == grpc.StatusCode.UNAUTHENTICATED
            assert len(fake.calls) == 1

    run(scenario)


def test_a_rollout_moves_a_streams_next_requests_to_the_new_server(people: dict[str, Person]) -> None:
    from deployments.models import Deployment

    async def scenario() -> None:
        async with stack() as (_, old, channel):
            new = await FakeTriton().start()
            try:
                await asyncio.to_thread(deploy, people["alice"], "digits-prod", old.target)
                stream = await open_stream(channel, meta(people["alice"]))
                await stream.write(infer_request([1], b"\0" * 4, request_id="1"))
                assert (await next_answer(stream)).infer_response.id == "1"
                await asyncio.to_thread(lambda: Deployment.objects.filter(name="digits-prod").update(
                    grpc_upstream=new.target))
                await asyncio.sleep(0.6)
                await stream.write(infer_request([1], b"\0" * 4, request_id="2"))
                assert (await next_answer(stream)).infer_response.id == "2"
                await stream.done_writing()
                assert await stream.code() == grpc.StatusCode.OK
                assert [c.method for c in old.calls] == ["ModelStreamInfer"]
                assert [pb.ModelInferRequest.FromString(c.request).id for c in new.calls] == ["2"]
            finally:
                await new.stop()

    run(scenario)


def test_requests_a_broken_upstream_stream_never_answered_get_an_error_and_the_stream_goes_on(
    people: dict[str, Person]
) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            gate = asyncio.Event()

            async def answer(request: bytes) -> bytes | None:
                parsed = pb.ModelInferRequest.FromString(request)
                if parsed.id == "2":
                    await gate.wait()
                    return None  # the fake ends its stream with an error: "2" and "3" were never answered
                return pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
                    model_name=parsed.model_name, id=parsed.id)).SerializeToString()

            fake.stream_answer = answer
            stream = await open_stream(channel, meta(people["alice"]))
            await stream.write(infer_request([1], b"\0" * 4, request_id="1"))
            assert (await next_answer(stream)).infer_response.id == "1"
            await stream.write(infer_request([1], b"\0" * 4, request_id="2"))
            await stream.write(infer_request([1], b"\0" * 4, request_id="3"))
            gate.set()
            owed = [await next_answer(stream) for _ in range(2)]
            assert {a.infer_response.id for a in owed} == {"2", "3"}
            assert all("Retry this request" in a.error_message for a in owed)
            fake.stream_answer = None
            await stream.write(infer_request([1], b"\0" * 4, request_id="4"))
            assert (await next_answer(stream)).infer_response.id == "4"
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK

    run(scenario)


async def settles(value: Callable[[], float], expected: float, seconds: float = 10) -> float:
    """`value()` once it equals `expected`, or its last reading after `seconds`."""
    deadline = time.monotonic() + seconds
    while (current := value()) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return current


def test_a_client_that_leaves_mid_stream_leaves_nothing_in_flight(people: dict[str, Person]) -> None:
    from gateway.stats import IN_FLIGHT

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            never = asyncio.Event()

            async def stall(request: bytes) -> bytes | None:
                await never.wait()
                return None

            fake.stream_answer = stall
            stream = await open_stream(channel, meta(people["alice"]))
            for index in range(3):
                await stream.write(infer_request([1], b"\0" * 4, request_id=str(index)))

            def in_flight() -> float:
                return float(IN_FLIGHT.labels("acme", "digits-prod")._value.get())

            # Polled, not after a fixed pause: the first request's lookups take longer on a loaded machine.
            assert await settles(in_flight, 3) == 3
            stream.cancel()
            assert await settles(in_flight, 0) == 0

    run(scenario)


def test_idle_upstream_channels_are_closed_but_not_one_a_stream_still_uses(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            other = await FakeTriton().start()
            try:
                await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
                await asyncio.to_thread(deploy, people["bob"], "old-one", other.target)
                await call(channel, "ModelReady", READY, meta(people["bob"], "old-one"))
                stream = await open_stream(channel, meta(people["alice"]))
                await stream.write(infer_request([1], b"\0" * 4, request_id="1"))
                await next_answer(stream)
                await asyncio.sleep(0.3)
                await stream.write(infer_request([1], b"\0" * 4, request_id="2"))
                await next_answer(stream)
                await gateway.channels.sweep(idle_seconds=0.25)
                assert {*gateway.channels.channels, *gateway.channels.streaming} == {fake.target}
                await stream.write(infer_request([1], b"\0" * 4, request_id="3"))
                assert (await next_answer(stream)).infer_response.id == "3"
                await stream.done_writing()
                assert await stream.code() == grpc.StatusCode.OK
            finally:
                await other.stop()

    run(scenario)


def test_with_the_database_down_cached_routes_keep_serving_and_the_rest_is_unavailable(
    people: dict[str, Person], settings: Any
) -> None:
    from django.db import InterfaceError, OperationalError

    settings.GATEWAY_CACHE_TTL_SECONDS = 0.05

    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy, people["alice"], "digits-prod", fake.target)
            await call(channel, "ModelReady", READY, meta(people["alice"]))

            async def database_down(key: Any) -> Any:
                raise OperationalError("could not connect to server")

            async def connection_dropped(key: Any) -> Any:
                raise InterfaceError("connection already closed")

            gateway.access.routes.loader = database_down
            gateway.access.tokens.loader = database_down
            await asyncio.sleep(0.1)  # every cached answer has expired
            await call(channel, "ModelReady", READY, meta(people["alice"]))
            for loader in (database_down, connection_dropped):
                gateway.access.routes.loader = loader
                unknown = await failure(channel, "ModelReady", READY, meta(people["alice"], "other"))
                assert unknown.code() == grpc.StatusCode.UNAVAILABLE
                assert "database is unreachable" in (unknown.details() or "") and retry_after(unknown) == "5"
            stream = await open_stream(channel, meta(people["alice"], "other"))
            assert await stream.code() == grpc.StatusCode.UNAVAILABLE

    run(scenario)


def test_an_answer_missing_an_output_and_tritons_shape_errors_are_told_from_the_signature(
    people: dict[str, Person]
) -> None:
    """Issue 25 over gRPC: the same words as over HTTP (gateway/contract.py)."""
    from deployments.models import Revision
    from gateway.tests.digits_contract import SHAPE_ERROR, SIGNATURE

    def with_signature(person: Person, target: str) -> None:
        deployment = deploy(person, "digits-prod", target)
        Revision.objects.filter(deployment=deployment).update(spec={"models": [
            {"name": "digits", "version": 1, "format": "onnx", "max_batch_size": 8, "signature": SIGNATURE.to_json()}]})

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(with_signature, people["alice"], fake.target)
            alice = meta(people["alice"])
            empty = await failure(channel, "ModelInfer", infer_request([1, 64], b"\0" * 256), alice)
            assert empty.code() == grpc.StatusCode.INTERNAL
            assert "without its output 'probabilities', 'label'" in (empty.details() or "")

            answer = pb.ModelInferResponse(model_name="digits")
            answer.outputs.add(name="label", datatype="INT64", shape=[1, 1])
            answer.raw_output_contents.append(b"\3" + b"\0" * 7)
            fake.answers["ModelInfer"] = answer.SerializeToString()
            asked = pb.ModelInferRequest.FromString(infer_request([1, 64], b"\0" * 256))
            asked.outputs.add(name="label")
            reply = pb.ModelInferResponse.FromString(
                await call(channel, "ModelInfer", asked.SerializeToString(), alice))
            assert [o.name for o in reply.outputs] == ["label"]
            partial = await failure(channel, "ModelInfer", infer_request([1, 64], b"\0" * 256), alice)
            assert "without its output 'probabilities' (declared" in (partial.details() or "")

            fake.answers["ModelInfer"] = (grpc.StatusCode.INVALID_ARGUMENT, SHAPE_ERROR)
            shape = await failure(channel, "ModelInfer", infer_request([2, 63], b"\0" * 504), alice)
            assert shape.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (shape.details() or "").startswith("Input 'input' of model 'digits' takes shape [-1, 64]")

    run(scenario)


def test_tritons_errors_in_a_stream_get_the_words_of_a_unary_call_with_the_request_id_in_front(
    people: dict[str, Person]
) -> None:
    """Issue 31: ModelStreamInfer passed Triton's errors on raw (its request id, its advice to set max_batch_size to
    zero, a model's exception), where ModelInfer rewords them (gateway/contract.py)."""
    from deployments.models import Revision
    from gateway.tests.digits_contract import SHAPE_ERROR, SIGNATURE

    def with_signature(person: Person, target: str) -> None:
        deployment = deploy(person, "digits-prod", target)
        Revision.objects.filter(deployment=deployment).update(spec={"models": [
            {"name": "digits", "version": 1, "format": "onnx", "max_batch_size": 8, "signature": SIGNATURE.to_json()}]})

    errors = {"shape": SHAPE_ERROR.replace("<id_unknown>", "shape"),
              "fault": "[request id: fault] Failed to process the request(s) for model 'digits', message: "
                       "TritonModelException: KeyError at 0x7f3a /home/team/model.py"}

    async def answer(request: bytes) -> bytes:
        parsed = pb.ModelInferRequest.FromString(request)
        error = errors.get(parsed.id)
        if error is None:
            return pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
                model_name=parsed.model_name, id=parsed.id)).SerializeToString()
        return pb.ModelStreamInferResponse(error_message=error, infer_response=pb.ModelInferResponse(
            id=parsed.id)).SerializeToString()

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(with_signature, people["alice"], fake.target)
            alice = meta(people["alice"])
            fake.answers["ModelInfer"] = (grpc.StatusCode.INVALID_ARGUMENT, SHAPE_ERROR)
            unary = await failure(channel, "ModelInfer", infer_request([2, 63], b"\0" * 504), alice)
            fake.stream_answer = answer
            stream = await open_stream(channel, alice)
            for request_id in ("shape", "fault", "fine"):
                await stream.write(infer_request([2, 63], b"\0" * 504, request_id=request_id))
            shape, fault, fine = [await next_answer(stream) for _ in range(3)]
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK

            assert shape.error_message == f"[request id: shape] {unary.details()}"
            assert shape.error_message == (
                "[request id: shape] Input 'input' of model 'digits' takes shape [-1, 64] (FP32; the first dimension "
                "is the batch, 1 to 8 rows per request; -1 is any size); you sent [2, 63].")
            assert (shape.infer_response.id, shape.infer_response.model_name) == ("shape", "digits")
            assert fault.error_message == (
                "[request id: fault] Model 'digits' failed on this request: the fault is in the model, not in the "
                "request. Its team can try it on the deployment page and read the server's log there.")
            assert not fine.error_message and fine.infer_response.id == "fine"

    run(scenario)
