"""The gRPC gateway inside the uvicorn process, for bench/grpc_placement.py only: portal.asgi's application with
GrpcGateway started on the same event loop (uvloop) at lifespan start-up, on BENCH_GRPC_PORT. Modelport itself
runs the gRPC gateway in its own process (gateway/grpc_app.py says why, with this measurement)."""

from __future__ import annotations

import os
from typing import Any

from portal.asgi import application as http_application


class WithGrpc:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.grpc: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                from gateway.grpc_app import GrpcGateway

                self.grpc = GrpcGateway()
                await self.grpc.start(f"127.0.0.1:{os.environ['BENCH_GRPC_PORT']}")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.grpc.stop(1.0)
                await self.app.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


application = WithGrpc(http_application)
