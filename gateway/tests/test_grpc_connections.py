"""The gRPC gateway's connection cap (gateway/grpc_connections.py) on real sockets in this process: a listening
socket stands in for gRPC core's, the sweep finds the connections accepted on its port among every descriptor this
process holds, and what it shuts down is seen from the clients' side. The real gateway under attack is
tests/test_grpc_connection_cap.py."""

from __future__ import annotations

import asyncio
import os
import select
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gateway.grpc_connections import Calls, Shedder, peer_of
from tests.support.gateway_calls import run


class Listener:
    """A listening socket and both ends of each connection made to it, in the order they were made."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.clients: list[socket.socket] = []
        self.accepted: list[socket.socket] = []

    def connect(self) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.clients.append(client)
        self.accepted.append(self.sock.accept()[0])
        return client

    def grpc_peer(self, client: socket.socket) -> str:
        """What gRPC's context.peer() says for this client's connection."""
        host, port = client.getsockname()
        return f"ipv4:{host}:{port}"

    def close(self) -> None:
        for sock in (*self.clients, *self.accepted, self.sock):
            sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    yield opened
    opened.close()


def closed(client: socket.socket) -> bool:
    """The server's side shut down: the client reads the end of the stream (without waiting)."""
    if not select.select([client], [], [], 0)[0]:
        return False
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


def sweeping(listener: Listener, cap: int, calls: Calls | None = None) -> Shedder:
    return Shedder(listener.port, cap, calls or Calls())


def connect_seen(listener: Listener, shedder: Shedder, count: int) -> list[socket.socket]:
    """`count` connections, each first seen by a sweep of its own (so each is older than the next)."""
    made = []
    for _ in range(count):
        made.append(listener.connect())
        shedder.sweep()
    return made


def test_past_the_cap_the_connections_seen_first_are_shut_down(listener: Listener) -> None:
    shedder = sweeping(listener, cap=3)
    clients = connect_seen(listener, shedder, 3)
    assert not any(closed(c) for c in clients)  # at the cap, not past it: nothing closed
    clients += connect_seen(listener, shedder, 2)
    assert [closed(c) for c in clients] == [True, True, False, False, False]
    assert shedder.shed_total == 2


def test_a_shut_down_connection_is_not_counted_again_while_its_owner_closes_it(listener: Listener) -> None:
    """gRPC core closes a shut-down connection within moments; a sweep before that must not close another for it."""
    shedder = sweeping(listener, cap=2)
    clients = connect_seen(listener, shedder, 3)
    assert shedder.sweep() == []
    assert [closed(c) for c in clients] == [True, False, False]


def test_a_connection_with_a_call_in_progress_is_never_shut_down(listener: Listener) -> None:
    calls = Calls()
    shedder = sweeping(listener, cap=2, calls=calls)
    clients = connect_seen(listener, shedder, 2)
    calls.begin(listener.grpc_peer(clients[0]))  # the oldest is calling: the next oldest makes way instead
    clients += connect_seen(listener, shedder, 1)
    assert [closed(c) for c in clients] == [False, True, False]


def test_every_connection_calling_past_the_cap_none_is_shut_down(listener: Listener) -> None:
    calls = Calls()
    shedder = sweeping(listener, cap=1, calls=calls)
    clients = [listener.connect(), listener.connect()]
    for client in clients:
        calls.begin(listener.grpc_peer(client))
    assert shedder.sweep() == []
    assert not any(closed(c) for c in clients)


def test_a_call_ending_makes_its_connection_the_most_recently_idle(listener: Listener) -> None:
    calls = Calls()
    shedder = sweeping(listener, cap=2, calls=calls)
    clients = connect_seen(listener, shedder, 2)
    peer = calls.begin(listener.grpc_peer(clients[0]))
    calls.end(peer)  # the oldest connection's call ended after the second was seen
    clients += connect_seen(listener, shedder, 1)
    assert [closed(c) for c in clients] == [False, True, False]


def test_connections_to_other_ports_and_the_listener_are_not_counted(listener: Listener) -> None:
    """The gateway's own connections (Triton, the database) and its listening socket are never counted or closed."""
    other = Listener()
    try:
        outgoing = [other.connect() for _ in range(3)]
        shedder = sweeping(listener, cap=1)
        mine = connect_seen(listener, shedder, 1)
        assert shedder.sweep() == []
        assert not any(closed(c) for c in (*outgoing, *mine))
        assert not any(closed(c) for c in other.accepted)  # the other port's server side: still open too
    finally:
        other.close()


def test_a_descriptor_reused_for_another_socket_is_not_shut_down(listener: Listener) -> None:
    """Between the listing and the shutdown, core may close a descriptor and the number name another socket: the
    shutdown checks the socket itself (its inode and its peer) on the duplicate it shuts down."""
    shedder = sweeping(listener, cap=1)
    client = listener.connect()
    accepted = listener.accepted[-1]
    peer = peer_of(listener.grpc_peer(client))
    assert peer is not None
    inode = os.fstat(accepted.fileno()).st_ino
    assert not shedder._shut_down(accepted.fileno(), inode=inode + 1, peer=peer)
    assert not shedder._shut_down(accepted.fileno(), inode=inode, peer=("127.0.0.1", 1))
    assert not closed(client)
    assert shedder._shut_down(accepted.fileno(), inode=inode, peer=peer)
    assert closed(client)


def test_calls_count_each_call_of_a_connection_until_the_last_ends() -> None:
    calls = Calls()
    first, second = calls.begin("ipv4:127.0.0.1:5000"), calls.begin("ipv4:127.0.0.1:5000")
    assert first == second == ("127.0.0.1", 5000)
    assert calls.open == {("127.0.0.1", 5000): 2}
    calls.end(first)
    assert calls.open == {("127.0.0.1", 5000): 1} and not calls.ended
    calls.end(second)
    assert calls.open == {} and list(calls.ended) == [("127.0.0.1", 5000)]
    assert calls.begin("unix:/run/gateway.sock") is None and calls.open == {}


def test_calls_forget_the_last_end_of_peers_no_longer_connected() -> None:
    calls = Calls()
    for port in (5000, 5001):
        calls.end(calls.begin(f"ipv4:127.0.0.1:{port}"))
    busy, ended = calls.snapshot({("127.0.0.1", 5001)})
    assert busy == {}
    assert list(ended) == [("127.0.0.1", 5001)]
    assert list(calls.ended) == [("127.0.0.1", 5001)]


@pytest.mark.parametrize(("grpc_peer", "expected"), [
    ("ipv4:127.0.0.1:5000", ("127.0.0.1", 5000)),
    ("ipv6:%5B::1%5D:5000", ("::1", 5000)),
    ("ipv6:[::1]:5000", ("::1", 5000)),
    ("ipv6:%5B::ffff:10.0.0.7%5D:443", ("10.0.0.7", 443)),  # a dual-stack listener's IPv4 client
    ("ipv6:%5Bfe80::1%25eth0%5D:80", ("fe80::1", 80)),
    ("unix:/run/modelport.sock", None),
    ("ipv4:127.0.0.1", None),
    ("", None),
    (None, None),
])
def test_a_calls_peer_is_named_as_its_socket_names_it(grpc_peer: str | None, expected: tuple[str, int] | None) -> None:
    assert peer_of(grpc_peer) == expected


def test_the_gateway_counts_each_call_under_the_peer_its_sweep_reads_off_the_socket(transactional_db: Any) -> None:
    """The real gateway: a call is counted under `context.peer()`, and that names the same connection as the sweep's
    getpeername() of the accepted socket (else no call would ever keep its connection open)."""
    from gateway.grpc_app import GrpcGateway

    async def scenario() -> None:
        gateway = GrpcGateway()
        port = await gateway.start("127.0.0.1:0")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            assert gateway.shedder is not None
            await asyncio.to_thread(gateway.shedder.stop)  # its passes would race this test's own
            assert await channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5) == b"\x08\x01"
            assert gateway.shedder.sweep() == []
            connected = {peer for peer, _ in gateway.shedder.sockets.values() if peer is not None}
            assert len(connected) == 1
            assert set(gateway.calls.ended) == connected
            assert gateway.calls.open == {}
        finally:
            await channel.close()
            await gateway.stop(0)

    run(scenario)
