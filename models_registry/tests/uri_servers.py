"""Test servers for the uri fetcher (models_registry/sources/uri.py): a real HTTPS server on 127.0.0.1 with a
certificate for "models.example" and "other.example" signed by a throwaway authority (the `cryptography` package),
and a FetchContext whose progress refuses as the import worker's does."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from models_registry.sources.base import FetchContext, SourceRefused

BODY = b"\x08\x07onnx-ish bytes" * 100
NAMES = ("models.example", "other.example")
SIGNATURE = "operator-signed-credential-0123456789"
SIGNED_QUERY = f"X-Amz-Credential=AKIAOPERATOR&X-Amz-Signature={SIGNATURE}"


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key) for NAMES."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelport test authority")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in NAMES]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_path, cert_path, key_path


class Handler(BaseHTTPRequestHandler):
    """Routes by path; HTTP/1.0, so a body without Content-Length ends when the connection closes."""

    release: threading.Event  # set by the fixture's teardown: the slow route stops waiting
    seen_hosts: list[str]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self.seen_hosts.append(self.headers.get("Host", ""))
        port = int(self.server.server_address[1])  # type: ignore[index]
        routes: dict[str, Callable[[], None]] = {
            "/model.onnx": lambda: self._send(200, BODY),
            "/same-host": lambda: self._redirect(f"https://models.example:{port}/model.onnx"),
            # A redirect to a signed URL, as an object store's presigned one: its query carries a credential.
            "/signed": lambda: self._redirect(f"/model.onnx?{SIGNED_QUERY}"),
            "/signed-missing": lambda: self._redirect(f"/missing?{SIGNED_QUERY}"),
            "/relative": lambda: self._redirect("/model.onnx"),
            "/to-http": lambda: self._redirect(f"http://models.example:{port}/model.onnx"),
            "/to-loopback": lambda: self._redirect("http://127.0.0.1/latest/meta-data/"),
            "/to-other": lambda: self._redirect(f"https://other.example:{port}/model.onnx"),
            "/loop": lambda: self._redirect("/loop"),
            "/no-length": self._no_length,
            "/lying-length": self._lying_length,
            "/huge-length": lambda: self._headers(200, {"Content-Length": str(10**12)}),
            "/slow": self._slow,
            "/trickle": self._trickle,
            "/unavailable": lambda: self._send(503, b"busy"),
            "/missing": lambda: self._send(404, b"no"),
        }
        routes.get(self.path.partition("?")[0], lambda: self._send(404, b"no"))()

    def _headers(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(self, status: int, body: bytes) -> None:
        self._headers(status, {"Content-Length": str(len(body))})
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self._headers(302, {"Location": location, "Content-Length": "0"})

    def _no_length(self) -> None:
        self._headers(200, {})
        for _ in range(8):
            self.wfile.write(b"x" * 65536)

    def _lying_length(self) -> None:
        self._headers(200, {"Content-Length": "10"})
        self.wfile.write(b"y" * 300_000)

    def _trickle(self) -> None:
        """A byte every 50 ms: each read arrives well inside the read timeout, the whole never ends."""
        self._headers(200, {"Content-Length": str(10**6)})
        while not self.release.wait(0.05):
            try:
                self.wfile.write(b"t")
                self.wfile.flush()
            except OSError:  # the fetcher gave up and closed the connection
                return

    def _slow(self) -> None:
        self._headers(200, {"Content-Length": "5"})
        self.wfile.flush()
        self.release.wait(10)


@dataclass
class TlsServer:
    port: int
    ca: Path
    seen_hosts: list[str]


def start_tls_server(directory: Path) -> tuple[TlsServer, Callable[[], None]]:
    ca, cert, key = make_certificates(directory)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    release = threading.Event()
    seen: list[str] = []
    handler = type("RoutedHandler", (Handler,), {"release": release, "seen_hosts": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)

    return TlsServer(port=server.server_address[1], ca=ca, seen_hosts=seen), stop


@dataclass
class Progress:
    """The import worker's progress, as far as a fetcher sees it: a total larger than the allowance is refused
    (the quota reservation), and so is a count past it."""

    max_bytes: int
    calls: list[tuple[int, int | None]] = field(default_factory=list)

    def __call__(self, done: int, total: int | None) -> None:
        self.calls.append((done, total))
        if (total is not None and total > self.max_bytes) or done > self.max_bytes:
            raise SourceRefused(f"more than {self.max_bytes} bytes")


def context(workdir: Path, max_bytes: int = 10**9, seconds: float = 60.0) -> tuple[FetchContext, Progress]:
    progress = Progress(max_bytes)
    return FetchContext(team_id=1, team_name="acme", workdir=workdir, max_bytes=max_bytes, progress=progress,
                        deadline=time.monotonic() + seconds), progress


def loopback_too(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """The tests' address policy for the friendly cases: the product's, plus 127.0.0.1 where the test server is."""
    from models_registry.sources.uri import public_only

    return address == ipaddress.ip_address("127.0.0.1") or public_only(address)
