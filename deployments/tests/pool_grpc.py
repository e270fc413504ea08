"""The gRPC gateway in this process before a pool's real Triton, shared by the pool end-to-end tests (a fixture module:
nothing here is collected)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.people import Person


class InProcessGrpcGateway:
    """gateway.grpc_app.GrpcGateway on 127.0.0.1:<free port>, its event loop in a thread of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway: Any = None
        self.port = self._run(self._start())

    async def _start(self) -> int:
        from gateway.grpc_app import GrpcGateway

        self.gateway = GrpcGateway()
        return int(await self.gateway.start("127.0.0.1:0"))

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def close(self) -> None:
        self._run(self.gateway.stop(0))
        # Its lookup threads end here, not some time after the test (their database connections are then closed).
        self._run(self.loop.shutdown_default_executor())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def grpc_gateway() -> Iterator[InProcessGrpcGateway]:
    gateway = InProcessGrpcGateway()
    yield gateway
    gateway.close()


def auth(person: Person, deployment: str) -> dict[str, str]:
    return {"authorization": f"Bearer {person.token}", "modelport-deployment": deployment}


def rows(count: int = 2) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("x", [count, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((count, 4), dtype=np.float32))
    return [tensor]
