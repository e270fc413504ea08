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
from tests.support.gateway_calls import make_deployment
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


# --- streaming (decoupled) models: test_grpc_decoupled.py, test_grpc_slow_reader.py ---------------------------


def deploy_streaming(person: Person, name: str, target: str) -> None:
    """A deployment serving "digits" (one answer per request) and "chat" (decoupled), on the fake's port."""
    from deployments.models import Deployment, Revision

    deployment = make_deployment(person, name, "http://127.0.0.1:9", ("digits", "chat"))
    Revision.objects.filter(deployment=deployment).update(spec={"models": [
        {"name": "digits", "version": 1, "format": "onnx"},
        {"name": "chat", "version": 1, "format": "python", "decoupled": True}]})
    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=target, status=Deployment.Status.READY)


def chat_request(request_id: str, text: str = "hello", empty_final: bool | None = None) -> bytes:
    message = pb.ModelInferRequest(model_name="chat", id=request_id)
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    message.raw_input_contents.append(len(text).to_bytes(4, "little") + text.encode())
    if empty_final is not None:
        message.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return message.SerializeToString()


def is_chat(request: bytes) -> bool:
    return pb.ModelInferRequest.FromString(request).model_name == "chat"


async def settles(value: Any, expected: Any, seconds: float = 10) -> Any:
    deadline = asyncio.get_running_loop().time() + seconds
    while (current := value()) != expected and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    return current


def stream_counts(deployment: str) -> dict[str, float]:
    """The stream figures' Prometheus counts of a deployment: pieces, and streams ended by reason."""
    from prometheus_client import REGISTRY

    counts: dict[str, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.labels.get("deployment") != deployment:
                continue
            if sample.name == "modelport_gateway_stream_pieces_total":
                counts["pieces"] = counts.get("pieces", 0) + sample.value
            elif sample.name == "modelport_gateway_streams_ended_total":
                reason = sample.labels["reason"]
                counts[reason] = counts.get(reason, 0) + sample.value
    return counts
