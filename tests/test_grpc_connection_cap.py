"""One team's idle connections against the real gRPC gateway (`manage.py grpc_gateway`, a process of its own on a
real socket): an attacker from a dozen addresses holds connections that never send the HTTP/2 preface and
connections that finish the handshake and then make no call, up to GATEWAY_GRPC_MAX_CONNECTIONS and past it, and
another team's stock tritonclient.grpc call must still be answered. docs/security.md, "Many addresses against the
total cap".

Triton's place is taken by a gRPC server in this process that answers ServerLive (what the victim asks), so that
the test measures the gateway's connections and nothing else; the access checks are the real ones, on the test
database that the gateway process shares.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests import processes
from tests.raw_http2 import handshaked
from tests.support.gateway_calls import make_deployment
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ATTACKERS = 12  # addresses 127.0.0.10 to 127.0.0.21 (all of 127.0.0.0/8 is loopback on Linux)
CAP = 36


@dataclass
class Gateway:
    port: int
    victim: Person


@contextlib.contextmanager
def fake_triton() -> Iterator[str]:
    """A gRPC server answering ServerLive as Triton does; its address."""
    live = pb.ServerLiveResponse(live=True).SerializeToString()
    server = grpc.server(ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ServerLive": grpc.unary_unary_rpc_method_handler(lambda request, context: live)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@pytest.fixture
def capped_grpc_gateway(transactional_db: Any, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway with a cap that a dozen addresses fill, and deadlines long enough that only the cap can close an
    attacker's connection while a test runs (the handshake deadline and the idle timeout are tested in
    tests/test_slow_clients.py)."""
    victim = make_person("charlie", "globex", role="admin")
    port = processes.free_port()
    log = tmp_path / "grpc.log"
    env = {"GATEWAY_GRPC_MAX_CONNECTIONS": str(CAP), "GATEWAY_GRPC_HANDSHAKE_TIMEOUT_SECONDS": "120",
           "GATEWAY_GRPC_IDLE_SECONDS": "300", "GATEWAY_RATE_LIMIT_PER_SECOND": "1000",
           "GATEWAY_RATE_LIMIT_BURST": "1000"}
    with fake_triton() as triton:
        deployment = make_deployment(victim, "status-board", "http://127.0.0.1:9")
        type(deployment).objects.filter(pk=deployment.pk).update(grpc_upstream=triton)
        process = processes.start_grpc_gateway(log, port, env=env)
        try:
            processes.wait_for(lambda: victim_call(port, victim)[0], 60, what="the gRPC gateway")
            yield Gateway(port, victim)
        finally:
            processes.kill(process)
            print("--- grpc.log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))


def victim_call(port: int, person: Person) -> tuple[bool, float, str]:
    """tritonclient.grpc's is_server_live on a client (and so a connection) of its own: whether it answered True,
    how long it took, and the error otherwise. Its deadline (10 s) is the bound on how long it may wait."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}",
                                              channel_args=[("grpc.use_local_subchannel_pool", 1)])
    started = time.monotonic()
    try:
        live = client.is_server_live(
            headers={"authorization": f"Bearer {person.token}", "modelport-deployment": "status-board"},
            client_timeout=10)
        return bool(live), time.monotonic() - started, ""
    except InferenceServerException as exc:
        return False, time.monotonic() - started, f"{exc.status()} {exc.message()}"
    finally:
        client.close()


def attacker_address(index: int) -> str:
    return f"127.0.0.{10 + index % ATTACKERS}"


def half_open(address: str, port: int) -> socket.socket:
    """A connection that never sends the HTTP/2 preface."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))


def attacker_connection(index: int, port: int) -> socket.socket:
    """Half of the attacker's connections are half-open, half handshaked and idle, from a dozen addresses."""
    if index % 2 == 0:
        return half_open(attacker_address(index), port)
    return handshaked(port, attacker_address(index))[0]


def is_closed(sock: socket.socket) -> bool:
    """The server closed it (what it sent before, its SETTINGS or a ping, is read and dropped); never waits."""
    sock.setblocking(False)  # a socket with a timeout would wait that long for data before answering
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return False
        except OSError:  # reset by the server
            return True
        if not data:
            return True


def closed_among(socks: list[socket.socket]) -> list[int]:
    return [i for i, sock in enumerate(socks) if is_closed(sock)]


def test_past_the_cap_the_oldest_idle_connections_make_way_and_another_teams_call_is_served(
        capped_grpc_gateway: Gateway) -> None:
    """The attacker fills the cap, then opens one more and (once a sweep has closed one for it, so that the first
    ones are known to be older) ten more. Another team's call on a new connection is answered, and the
    connections closed to bring the count back to the cap are the attacker's oldest: the ten later ones all stay.
    Their order among the first ones is not asserted: connections first seen by the same sweep are ordered by their
    socket's inode, which follows their creation only roughly.
    Before the change gRPC core closed every connection past the cap, the victim's included (UNAVAILABLE)."""
    first = [attacker_connection(i, capped_grpc_gateway.port) for i in range(CAP + 1)]
    later: list[socket.socket] = []
    try:
        processes.wait_for(lambda: closed_among(first), 10, interval=0.05, what="a connection closed past the cap")
        later = [attacker_connection(CAP + 1 + i, capped_grpc_gateway.port) for i in range(10)]
        live, took, error = victim_call(capped_grpc_gateway.port, capped_grpc_gateway.victim)
        print(f"the victim's call took {took:.3f} s beside {CAP + 11} attacker connections")
        assert live, f"another team's call failed with the cap full of idle connections: {error}"
        # Back at the cap: eleven of the first connections closed (twelve if a sweep counted the victim's while it
        # was open, which is what the cap is for), and none of the later ones.
        processes.wait_for(lambda: len(closed_among(first)) >= 11, 10, interval=0.05,
                           what="the count back at the cap")
        assert len(closed_among(first)) in (11, 12)
        assert closed_among(later) == [], "newer connections were closed before older idle ones"
    finally:
        for sock in (*first, *later):
            sock.close()


def test_an_attacker_refilling_the_cap_cannot_keep_another_teams_calls_out(capped_grpc_gateway: Gateway) -> None:
    """The attacker keeps the cap full: each connection the gateway closes is opened again at once, from the same
    address and of the same kind. Meanwhile another team makes calls on new connections, one after the other,
    until the attacker has reopened 30 connections: every call is answered."""
    held = [attacker_connection(i, capped_grpc_gateway.port) for i in range(CAP)]
    stop = threading.Event()
    reopened = 0

    def refill() -> None:
        nonlocal reopened
        while not stop.is_set():
            for i, sock in enumerate(held):
                if stop.is_set():
                    return
                if is_closed(sock):
                    sock.close()
                    with contextlib.suppress(OSError):
                        held[i] = attacker_connection(i, capped_grpc_gateway.port)
                        reopened += 1
            time.sleep(0.01)

    attacker = threading.Thread(target=refill, daemon=True)
    attacker.start()
    answers: list[tuple[bool, float, str]] = []
    try:
        deadline = time.monotonic() + 120
        while (len(answers) < 30 or reopened < 30) and time.monotonic() < deadline:
            answers.append(victim_call(capped_grpc_gateway.port, capped_grpc_gateway.victim))
    finally:
        stop.set()
        attacker.join(15)
        for sock in held:
            sock.close()
    failures = [error for live, _, error in answers if not live]
    slowest = max(took for _, took, _ in answers)
    print(f"victim: {len(answers) - len(failures)}/{len(answers)} answered, slowest {slowest:.3f} s; the attacker "
          f"reopened {reopened} connections")
    assert failures == [], failures
    assert reopened >= 30, "the attacker's connections were not the ones closed to make way"
