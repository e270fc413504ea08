"""A request's body as the web server keeps it until the application's next receive(): the pieces as they came,
in place of uvicorn's bytearray (portal/web_server.py puts it into uvicorn's request cycle).

Its plain reference is uvicorn's own bytearray: with GATEWAY_JSON_FAST_PATH=false the web server leaves it in place
(tests/test_web_server_writes.py runs the same bodies through both)."""

from __future__ import annotations


class BodyPieces:
    """What uvicorn's cycle keeps of a request's body until the application's next receive(), in place of its
    bytearray: uvicorn appends each piece the parser hands over to a bytearray (`+=`, a copy) and gives the
    application `bytes()` of it (a second copy), which for the CNN sample's 253 KB JSON request (one read, one
    piece) were two copies of the whole body per request. Here the pieces are kept as they came, and one piece is
    handed over as it is; several are joined once. The same `+=`, `len()` and `bytes()` that uvicorn uses.

    Past MAX_PIECES they go into one bytearray, as uvicorn keeps them, and every later piece is appended there: a
    client that trickles its body a few bytes per read (chunked encoding of one byte a chunk, say) would otherwise
    cost a bytes object (about 40 bytes) per piece up to uvicorn's 64 KB mark, 2.7 MB per connection, or a join of
    everything so far every few pieces; past the mark it costs what uvicorn's own buffer costs."""

    MAX_PIECES = 64
    __slots__ = ("buffer", "pieces", "size")

    def __init__(self, before: bytes | bytearray = b"") -> None:
        self.pieces: list[bytes] = [bytes(before)] if before else []
        self.buffer: bytearray | None = None
        self.size = len(before)

    def __iadd__(self, piece: bytes) -> BodyPieces:
        self.size += len(piece)
        if self.buffer is not None:
            self.buffer += piece
            return self
        self.pieces.append(piece)
        if len(self.pieces) > self.MAX_PIECES:
            self.buffer = bytearray().join(self.pieces)
            self.pieces = []
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        if self.buffer is not None:
            return bytes(self.buffer)
        pieces = self.pieces
        if len(pieces) == 1 and type(pieces[0]) is bytes:
            return pieces[0]
        return b"".join(pieces)
