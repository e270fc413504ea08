"""HTTP/2 by hand, for the tests of what a gRPC server does with connections that make no call
(tests/test_slow_clients.py, tests/test_grpc_connection_cap.py): a client that sends the connection preface and
its SETTINGS, acknowledges the server's, and then sends nothing."""

from __future__ import annotations

import socket

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame: length 0, type 4, no flags, stream 0
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
SETTINGS_TYPE = 4
GOAWAY_TYPE = 7


def frames(data: bytes) -> tuple[list[tuple[int, int]], bytes]:
    """The (type, flags) of each whole frame at the start of `data`, and what follows them (part of a frame)."""
    found = []
    while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
        found.append((data[3], data[4]))
        data = data[9 + int.from_bytes(data[:3], "big"):]
    return found, data


def handshaked(port: int, address: str = "127.0.0.1") -> tuple[socket.socket, bytes]:
    """A connection from `address` that has finished the HTTP/2 handshake and makes no call, and everything the
    server sent on it so far (from its first frame). Returned as it is if the server closes it meanwhile (a server
    at its connection cap)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))
    sock.sendall(PREFACE + SETTINGS)
    received = b""
    try:
        # The server's own SETTINGS (not its ACK of ours) is what this client acknowledges.
        while (SETTINGS_TYPE, 0) not in frames(received)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        else:
            sock.sendall(SETTINGS_ACK)
    except OSError:
        pass
    return sock, received
