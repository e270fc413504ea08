"""A gRPC caller written by hand on a plain socket, for what tritonclient never does (a fixture module: nothing here
is collected): it announces the largest HTTP/2 windows there are, so that flow control never holds the server back,
sends one call's request and then reads nothing, with a receive buffer as small as the kernel allows. Only TCP is
left to hold the server's writes."""

from __future__ import annotations

import socket
import struct

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _SETTINGS, _WINDOW_UPDATE = 0, 1, 4, 8
_END_HEADERS, _ACK = 4, 1
_LARGEST_WINDOW = 2**31 - 1
_INITIAL_WINDOW_SIZE = 4  # the SETTINGS parameter


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _integer(value: int, prefix_bits: int = 7) -> bytes:
    """HPACK's integer (RFC 7541, 5.1) with the H bit clear: the strings below are sent as they are."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([value])
    out = [top]
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A header as a literal without indexing, new name (RFC 7541, 6.2.2): no table state to keep."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _integer(len(raw_name)) + raw_name + _integer(len(raw_value)) + raw_value


def open_unread_call(port: int, path: str, metadata: tuple[tuple[str, str], ...], message: bytes,
                     receive_buffer: int = 4096) -> socket.socket:
    """Open the call, send `message` on it (one gRPC message, the call left open) and return the socket, which the
    caller closes and never reads again."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)  # set before connect: no autotuning
    sock.connect(("127.0.0.1", port))
    headers = b"".join(_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"), ("te", "trailers"), *metadata))
    sock.sendall(_PREFACE + _frame(_SETTINGS, 0, 0, struct.pack(">HI", _INITIAL_WINDOW_SIZE, _LARGEST_WINDOW))
                 + _frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", _LARGEST_WINDOW - 65535)))
    sock.settimeout(5)
    sock.recv(9)  # the head of the server's SETTINGS, which is then acknowledged; nothing else is ever read
    sock.sendall(_frame(_SETTINGS, _ACK, 0, b"") + _frame(_HEADERS, _END_HEADERS, 1, headers)
                 + _frame(_DATA, 0, 1, b"\x00" + struct.pack(">I", len(message)) + message))
    return sock
