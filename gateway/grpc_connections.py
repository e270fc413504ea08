"""The gRPC gateway's total connection cap, at which the connections idle longest make way for new ones, as the web
server's does (portal/web_server.py; docs/security.md, "Many addresses against the total cap").

gRPC core alone cannot: grpcio offers no hook per accepted connection, and core's own cap
(`grpc.max_allowed_incoming_connections`, chttp2_server.cc's OnAccept) closes every new connection once that many
are open, whatever the open ones are doing. Connections that make no call (half-open ones until the handshake
deadline, handshaked ones until GATEWAY_GRPC_IDLE_SECONDS), opened from any number of addresses, kept every new
client out.

What this adds, in a thread of the gateway's process: every SWEEP_SECONDS (or four times a pass's duration, if
longer) it lists the process's descriptors and
finds the TCP connections accepted on the gateway's port (a socket bound to that port with a peer). While more than
the cap are open, it shuts down (shutdown(2)) the connections idle longest: with no call in progress (the gateway's
handlers count calls per peer address, `Calls`), ordered by the end of their last call, else by when a sweep first
saw them (so "oldest" has the sweep's resolution). gRPC core then reads the end of the stream and closes the
connection itself, as when a client goes away; its client sees the connection close (a tritonclient channel
reconnects on its next call). A pass only reads: each descriptor's link (its socket's inode) and the kernel's TCP
table (/proc/self/net/tcp{,6}: the inodes with the gateway's port as their local one, and their peers); it never
duplicates a descriptor of core's, since a duplicate held while core closes its own would keep that socket in
core's epoll set after core had let it go (its events then reach whatever core reuses the slot for). Only a
connection being shut down is duplicated, and checked on the duplicate (inode and peer), which is what is shut
down: a descriptor that core closed and reused meanwhile is never touched.

Core's cap stays, at twice this one (within the open-files limit), against EMFILE: new connections between two
sweeps are accepted up to it, so a new client is refused only by an attacker who opens that many more connections
within one sweep interval (for the default cap, 40,000 connections a second). A connection with a call in progress
is never shut down; a call that core has read but whose handler has not started yet is not counted (a window of
the event loop's latency), which matters only for the connection idle longest at the moment it calls.

Linux only (/proc/self/fd); elsewhere core's cap alone holds, and the gateway logs so at start.
"""

from __future__ import annotations

import heapq
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from urllib.parse import unquote

log = logging.getLogger(__name__)

SWEEP_SECONDS = 0.25
IDLE_FACTOR = 4  # the wait after a pass is at least this many times the pass's duration
LOG_EVERY_SECONDS = 10.0  # under a flood, one line per this many seconds, not one per sweep
FD_DIR = "/proc/self/fd"

Peer = tuple[str, int]  # a client connection's address and port, as getpeername() gives them (normalised)
_UNPARSED: Peer = ("", -1)


def normal_peer(host: str, port: int) -> Peer:
    """An address as the sweep and the handlers both name it: an IPv4-mapped IPv6 address as IPv4, a zone dropped."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host, port
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), port


def peer_of(grpc_peer: str | None) -> Peer | None:
    """A call's `context.peer()` ("ipv4:127.0.0.1:5000", "ipv6:%5B::1%5D:5000"): None for other transports."""
    if not grpc_peer:
        return None
    kind, _, rest = grpc_peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = unquote(rest).rpartition(":")
    if not port.isdigit():
        return None
    return normal_peer(host.removeprefix("[").removesuffix("]"), int(port))


class Calls:
    """The calls in progress per peer, and when each peer's last call ended. The event loop's thread writes it (two
    uncontended lock acquisitions a call), the sweep's thread reads a copy."""

    PARSED_MAX = 65536

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[Peer, int] = {}
        self.ended: dict[Peer, float] = {}
        # context.peer() parsed, per string: the same for every call of a connection, and parsing costs microseconds
        # (ipaddress) that a dictionary look-up does not. Touched by the event loop's thread only.
        self.parsed: dict[str, Peer | None] = {}

    def begin(self, grpc_peer: str | None) -> Peer | None:
        if not grpc_peer:
            return None
        peer = self.parsed.get(grpc_peer, _UNPARSED)
        if peer is _UNPARSED:
            if len(self.parsed) >= self.PARSED_MAX:
                self.parsed.clear()
            peer = self.parsed[grpc_peer] = peer_of(grpc_peer)
        if peer is not None:
            with self.lock:
                self.open[peer] = self.open.get(peer, 0) + 1
        return peer

    def end(self, peer: Peer | None) -> None:
        if peer is None:
            return
        with self.lock:
            left = self.open.get(peer, 0) - 1
            if left > 0:
                self.open[peer] = left
            else:
                self.open.pop(peer, None)
                self.ended[peer] = time.monotonic()

    def snapshot(self, connected: set[Peer]) -> tuple[dict[Peer, int], dict[Peer, float]]:
        """The calls in progress and the last ends; forgets the ends of peers no longer connected."""
        with self.lock:
            for peer in [p for p in self.ended if p not in connected]:
                del self.ended[peer]
            return dict(self.open), dict(self.ended)


class Shedder:
    """The sweep (see the module's docstring): `sweep()` is one pass, `start()` runs it every SWEEP_SECONDS."""

    def __init__(self, port: int, cap: int, calls: Calls, interval: float = SWEEP_SECONDS) -> None:
        self.port = port
        self.cap = cap
        self.calls = calls
        self.interval = interval
        # Each socket's inode: its peer (None: not a connection to the gateway's port) and when a sweep first saw it.
        self.sockets: dict[int, tuple[Peer | None, float]] = {}
        # Inodes of connections shut down, until they are gone from the kernel's table: not counted again meanwhile.
        self.shut: dict[int, float] = {}
        self.shed_total = 0
        self._logged = -LOG_EVERY_SECONDS
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return os.path.isdir(FD_DIR) and socket.getdefaulttimeout() is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="grpc-connection-cap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.sweep()
            except Exception:  # a failed pass must not end the cap: the next pass starts afresh
                log.exception("gRPC gateway: the connection sweep failed")
            # A pass lists and fstat()s every descriptor: 126 ms for 10,000 (10 ms for 1,000) measured on a 2-core
            # machine at a load of 7. Waiting at least four times its duration keeps the sweep under a fifth of a
            # core however many connections are held (the interval, and so the resolution of "oldest", grows).
            if self._stop.wait(max(self.interval, IDLE_FACTOR * (time.monotonic() - started))):
                return

    def sweep(self) -> list[Peer]:
        """One pass: the peers of the connections shut down to bring the count back to the cap."""
        now = time.monotonic()
        table = tcp_connections(self.port)
        self.shut = {inode: when for inode, when in self.shut.items() if inode in table}
        seen: dict[int, tuple[Peer | None, float]] = {}
        connections: list[tuple[int, int, Peer]] = []  # (descriptor, inode, peer)
        for name in os.listdir(FD_DIR):
            # The descriptor's link names its socket's inode: nothing here opens, duplicates or closes a
            # descriptor of core's (a duplicate held while core closes its own keeps the socket in core's epoll
            # set after core has let go of it).
            try:
                target = os.readlink(f"{FD_DIR}/{name}")
            except OSError:  # closed meanwhile (the listing's own descriptor, a connection core closed)
                continue
            if not target.startswith("socket:["):
                continue
            inode = int(target[len("socket:["):-1])
            peer = table.get(inode)
            if peer is None or inode in self.shut:
                continue
            known = self.sockets.get(inode)
            first = known[1] if known is not None and known[0] == peer else now
            seen[inode] = (peer, first)
            connections.append((int(name), inode, peer))
        self.sockets = seen
        busy, ended = self.calls.snapshot({peer for _, _, peer in connections})
        excess = len(connections) - self.cap
        if excess <= 0:
            return []
        idle = [(max(seen[inode][1], ended.get(peer, 0.0)), inode, fd, peer) for fd, inode, peer in connections
                if peer not in busy]
        shed = []
        for _since, inode, fd, peer in heapq.nsmallest(excess, idle):
            if self._shut_down(fd, inode, peer):
                shed.append(peer)
                # Core closes it within moments: until then the next sweep must not count it again.
                self.shut[inode] = now
        self.shed_total += len(shed)
        if shed and now - self._logged >= LOG_EVERY_SECONDS:
            self._logged = now
            log.warning("gRPC gateway: %d connections open, over GATEWAY_GRPC_MAX_CONNECTIONS (%d): closed the %d "
                        "idle longest (%d since start)", len(connections), self.cap, len(shed), self.shed_total)
        return shed

    def _peer_of(self, sock: socket.socket) -> Peer | None:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return None
        try:
            if sock.getsockname()[1] != self.port:
                return None  # an outgoing connection (Triton, the database, Redis): its own ephemeral port
            address = sock.getpeername()
        except OSError:  # the listening socket (no peer), or a connection already reset
            return None
        return normal_peer(address[0], address[1])

    def _shut_down(self, fd: int, inode: int, peer: Peer) -> bool:
        sock = _duplicate(fd)
        if sock is None:
            return False
        with sock:
            try:
                if os.fstat(sock.fileno()).st_ino != inode or self._peer_of(sock) != peer:
                    return False  # the descriptor now names another socket: not the connection judged idle
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return False
        return True


TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
_LISTEN = "0A"


def tcp_connections(port: int) -> dict[int, Peer]:
    """The kernel's table of this network namespace's TCP sockets: {inode: peer} of the connections whose local port
    is `port` (the gateway's: accepted there), listening sockets and those without an inode (TIME_WAIT) left out."""
    found: dict[int, Peer] = {}
    for path in TCP_TABLES:
        try:
            with open(path) as table:
                next(table, None)  # the header
                for line in table:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] == _LISTEN:
                        continue
                    local, remote, inode = fields[1], fields[2], int(fields[9])
                    if inode == 0 or int(local.rpartition(":")[2], 16) != port:
                        continue
                    found[inode] = _table_address(remote)
        except (OSError, ValueError):
            continue  # no IPv6 here, or a table being rewritten: the next pass reads it again
    return found


def _table_address(text: str) -> Peer:
    """An address of /proc/net/tcp{,6} ("0100007F:1F90": the address as 32-bit words in host order, the port in
    hex) as getpeername() names it, normalised."""
    address, _, port = text.partition(":")
    raw = b"".join(int(address[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(address), 8))
    host = str(ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw))
    return normal_peer(host, int(port, 16))


def _duplicate(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of `fd` (closing it leaves `fd` to its owner), or None. The duplicate shares
    the descriptor's flags: a socket object made while a default timeout is set would make core's socket blocking,
    so then none is made (nothing here sets one; a library might)."""
    if socket.getdefaulttimeout() is not None:
        return None
    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None
