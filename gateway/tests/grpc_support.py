"""The gRPC gateway before a fake Triton, and the requests its tests send (a fixture module: nothing here is
collected)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from gateway.tests.grpc_fake_upstream import FakeTriton
from tests.support.people import Person

PREFIX = "/inference.GRPCInferenceService/"


@contextlib.asynccontextmanager
async def stack() -> AsyncIterator[tuple[Any, FakeTriton, grpc.aio.Channel]]:
    from gateway.grpc_app import GrpcGateway

    fake = await FakeTriton().start()
    gateway = GrpcGateway()
    port = await gateway.start("127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])
    try:
        yield gateway, fake, channel
    finally:
        await channel.close()
        await gateway.stop(0)
        await fake.stop()


def meta(person: Person | None, deployment: str | None = "digits-prod", **extra: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    if person is not None:
        pairs.append(("authorization", f"Bearer {person.token}"))
    if deployment is not None:
        pairs.append(("modelport-deployment", deployment))
    return (*pairs, *extra.items())


def infer_request(shape: list[int], raw: bytes, model: str = "digits", request_id: str = "") -> bytes:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="input", datatype="FP32", shape=shape)
    message.raw_input_contents.append(raw)
    return message.SerializeToString()


async def open_stream(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> Any:
    return channel.stream_stream(PREFIX + "ModelStreamInfer")(metadata=metadata, timeout=20)


async def next_answer(stream: Any) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse.FromString(await asyncio.wait_for(stream.read(), 10))
