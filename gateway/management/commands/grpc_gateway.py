"""`manage.py grpc_gateway`: the gRPC inference gateway (gateway/grpc_app.py) in this process until SIGTERM or
SIGINT, which let calls in flight finish for a few seconds; optionally its Prometheus metrics on a port of their
own (gateway/metrics_server.py)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Serve the gRPC inference gateway (tritonclient.grpc) on GATEWAY_GRPC_PORT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=settings.GATEWAY_GRPC_PORT,
                            help="the port (default GATEWAY_GRPC_PORT)")
        parser.add_argument("--metrics-port", type=int, default=settings.GATEWAY_GRPC_METRICS_PORT,
                            help="serve GET /metrics (Prometheus) on this port too; 0: no (default "
                                 "GATEWAY_GRPC_METRICS_PORT)")
        parser.add_argument("--grace", type=float, default=5.0, help="seconds calls in flight get on shutdown")

    def handle(self, *args: Any, **options: Any) -> None:
        import uvloop

        uvloop.run(self.serve(options["host"], options["port"], options["metrics_port"], options["grace"]))

    async def serve(self, host: str, port: int, metrics_port: int, grace: float) -> None:
        from gateway import metrics_server
        from gateway.grpc_app import GrpcGateway
        from infra import tracing
        from infra.heap import freeze_startup_objects

        tracing.configure()  # from the OTEL_* variables; off, and free, without an endpoint (docs/observability.md)
        gateway = GrpcGateway()
        freeze_startup_objects()  # out of every full collection: what the gateway serves with (infra/heap.py)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = await gateway.start(address)
        except RuntimeError as exc:  # grpc's "Failed to bind"
            raise CommandError(f"cannot listen on {address}: {exc}") from None
        self.stdout.write(f"gRPC gateway listening on {host}:{bound}", ending="\n")
        metrics = None
        if metrics_port:
            metrics = await metrics_server.start(host, metrics_port, settings.METRICS_TOKEN,
                                                    settings.METRICS_OPEN)
            self.stdout.write(f"its Prometheus metrics: http://{host}:{metrics_port}/metrics", ending="\n")
        self.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        if metrics is not None:
            metrics.close()
        await gateway.stop(grace)
