"""A scriptable gRPC server on a real socket, standing in for Triton's GRPCInferenceService where a fast test needs
to see exactly what the gateway forwarded (the bytes, the metadata, which calls never arrived) or an answer a
real Triton gives only in rare states (a stall, a broken stream). The real Triton runs in
tests/test_grpc_gateway_e2e.py.

Every call is recorded as (method, request bytes, metadata). Unary methods answer with `answers[method]`: bytes,
a grpc.StatusCode with a message, or a coroutine function of the request. ModelStreamInfer answers each request
with a ModelStreamInferResponse naming the request's model and id, unless `stream_answer` says otherwise, or
`pieces` answers it as a decoupled model does: any number of responses, each written as it is made, each with
Triton 2.51's `triton_final_response` flag, and the empty final response only when the request asked for it
(`triton_enable_empty_final_response`), as measured against the real Triton (tests/test_grpc_stream_e2e.py). The ids
of the requests whose call the gateway cancelled while they were being answered are in `cancelled`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

PREFIX = "/inference.GRPCInferenceService/"


@dataclass
class Call:
    method: str
    request: bytes
    metadata: dict[str, str]


Answer = bytes | tuple[grpc.StatusCode, str] | Callable[[bytes], Awaitable[bytes]]


def default_answers() -> dict[str, Answer]:
    return {
        "ServerLive": pb.ServerLiveResponse(live=True).SerializeToString(),
        "ServerReady": pb.ServerReadyResponse(ready=True).SerializeToString(),
        "ModelReady": pb.ModelReadyResponse(ready=True).SerializeToString(),
        "ServerMetadata": pb.ServerMetadataResponse(name="triton", version="2.51.0").SerializeToString(),
        "ModelInfer": _echo_infer,
    }


async def _echo_infer(request: bytes) -> bytes:
    parsed = pb.ModelInferRequest.FromString(request)
    response = pb.ModelInferResponse(model_name=parsed.model_name, id=parsed.id)
    response.raw_output_contents.extend(parsed.raw_input_contents)
    return response.SerializeToString()


def stream_reply(request: bytes) -> bytes:
    parsed = pb.ModelInferRequest.FromString(request)
    return pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse(model_name=parsed.model_name, id=parsed.id)).SerializeToString()


def piece_reply(request: bytes, text: str, final: bool = False) -> bytes:
    """One response of a decoupled model, as Triton 2.51 sends it: the piece and `triton_final_response`."""
    parsed = pb.ModelInferRequest.FromString(request)
    answer = pb.ModelInferResponse(model_name=parsed.model_name, id=parsed.id)
    answer.parameters["triton_final_response"].bool_param = final
    answer.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    answer.raw_output_contents.append(len(text.encode()).to_bytes(4, "little") + text.encode())
    return pb.ModelStreamInferResponse(infer_response=answer).SerializeToString()


def final_reply(request: bytes) -> bytes | None:
    """The empty final response Triton sends at a decoupled request's end, only when the request asked for it."""
    parsed = pb.ModelInferRequest.FromString(request)
    asked = parsed.parameters.get("triton_enable_empty_final_response")
    if asked is None or not asked.bool_param:
        return None
    answer = pb.ModelInferResponse(model_name=parsed.model_name, id=parsed.id)
    answer.parameters["triton_final_response"].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=answer).SerializeToString()


Pieces = Callable[[bytes], AsyncIterator[bytes] | None]


@dataclass
class FakeTriton:
    answers: dict[str, Answer] = field(default_factory=default_answers)
    stream_answer: Callable[[bytes], Awaitable[bytes | None]] | None = None
    pieces: Pieces | None = None  # a decoupled model's responses to a request (None: answered as above)
    cancelled: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    server: Any = None
    port: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def methods(self) -> list[str]:
        return [c.method for c in self.calls]

    async def start(self) -> FakeTriton:
        fake = self

        async def unary(method: str, request: bytes, context: Any) -> bytes:
            fake.calls.append(Call(method, request, dict(context.invocation_metadata() or ())))
            answer = fake.answers.get(method)
            if answer is None:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"fake has no answer for {method}")
            if isinstance(answer, bytes):
                return answer
            if isinstance(answer, tuple):
                await context.abort(answer[0], answer[1])
            assert callable(answer)
            return await answer(request)

        async def stream(request_iterator: Any, context: Any) -> None:
            metadata = dict(context.invocation_metadata() or ())
            async for request in request_iterator:
                fake.calls.append(Call("ModelStreamInfer", request, metadata))
                pieces = fake.pieces(request) if fake.pieces is not None else None
                if pieces is not None:
                    try:
                        async for piece in pieces:
                            await context.write(piece)
                    except asyncio.CancelledError:
                        fake.cancelled.append(pb.ModelInferRequest.FromString(request).id)
                        raise
                    except Exception as exc:
                        # The gateway's cancel reaches a write that waits for its window as a failed batch, not
                        # as a cancelled task, when gRPC core fails the write before it tells the handler.
                        if type(exc).__name__ != "ExecuteBatchError":
                            raise
                        fake.cancelled.append(pb.ModelInferRequest.FromString(request).id)
                        return
                    continue
                reply = await fake.stream_answer(request) if fake.stream_answer else stream_reply(request)
                if reply is None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
                await context.write(reply)

        class Handlers(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                method = details.method.removeprefix(PREFIX)
                if method == "ModelStreamInfer":
                    return grpc.stream_stream_rpc_method_handler(stream)

                async def behaviour(request: bytes, context: Any) -> bytes:
                    return await unary(method, request, context)

                return grpc.unary_unary_rpc_method_handler(behaviour)

        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1),
                                               ("grpc.max_send_message_length", -1)])
        self.server.add_generic_rpc_handlers((Handlers(),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def stop(self) -> None:
        await self.server.stop(0)
