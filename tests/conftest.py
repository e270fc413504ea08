"""The end-to-end tests' fixtures: the gRPC gateway over a real socket, the browser tests' Chromium, the schema tests'
world (the portal over real HTTP with its worker and beat is in the root conftest.py: the CLI's end-to-end tests use
it too)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import processes
from tests.processes import GrpcGatewayProcess
from tests.schema_world import World


@pytest.fixture
def grpc_gateway(portal_url: str, tmp_path: Path) -> Iterator[GrpcGatewayProcess]:
    """The gRPC gateway over a real socket (`manage.py grpc_gateway`), beside the portal of portal_url."""
    import socket

    port, metrics_port = processes.free_port(), processes.free_port()
    gateway = processes.start_grpc_gateway(tmp_path / "logs" / "grpc.log", port, metrics_port)

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    try:
        processes.wait_for(up, 30, what="the gRPC gateway")
        yield GrpcGatewayProcess(f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        processes.kill(gateway)
        log = tmp_path / "logs" / "grpc.log"
        if log.exists():
            print("--- grpc.log (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the browser tests (tests/support/browser.py), one per module: a module's pages are
    new contexts of it, so that no test sees another's cookies."""
    from tests.support.browser import launched_chromium

    with launched_chromium() as instance:
        yield instance


@pytest.fixture
def world(db: Any) -> World:
    """The schema tests' world (tests/schema_world.py)."""
    return World()


@pytest.fixture(scope="session")
def digits_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits sample model (models_registry/samples.py), built once per run."""
    from models_registry.samples import make_digits_onnx

    path = tmp_path_factory.mktemp("samples") / "digits.onnx"
    make_digits_onnx(path)
    return path


@pytest.fixture
def no_triton_left() -> Iterator[None]:
    """No Triton of the test outlives it (a module's mark)."""
    from tests.sandbox_helpers import stop_everything

    yield
    stop_everything()


@pytest.fixture
def sandboxed() -> Iterator[None]:
    """The sandbox must work here (the test fails, naming why, where it cannot), and no Triton outlives the test (a
    module's mark)."""
    from infra import sandbox_settings
    from tests.sandbox_helpers import stop_everything

    sandbox_settings.sandbox_capabilities.cache_clear()
    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available:
        pytest.fail(f"the sandbox is not available here: {caps.reason}")
    yield
    stop_everything()
    sandbox_settings.sandbox_capabilities.cache_clear()
