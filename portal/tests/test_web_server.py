"""The guarded uvicorn protocol's plain parts (portal/web_server.py, infra/open_files.py); its behaviour on real
sockets is tested in tests/test_slow_clients.py."""

from __future__ import annotations

import resource

from infra.open_files import RESERVED_DESCRIPTORS, connection_cap, raise_open_files_limit
from portal.web_server import UVICORN_HTTP, address_key, plain_response
from tests.processes import ROOT


def test_an_ipv6_client_is_counted_by_its_64_prefix() -> None:
    assert address_key(("2001:db8:1:2:aaaa::1", 5)) == address_key(("2001:db8:1:2:ffff::9", 6)) == "2001:db8:1:2::/64"
    assert address_key(("2001:db8:1:3::1", 5)) != address_key(("2001:db8:1:2::1", 5))
    assert address_key(("fe80::1%eth0", 5)) == "fe80::/64"


def test_an_ipv4_client_is_counted_by_its_address_mapped_or_not() -> None:
    assert address_key(("10.0.0.7", 1)) == "10.0.0.7"
    assert address_key(("::ffff:10.0.0.7", 1)) == "10.0.0.7"
    assert address_key(None) is None


def test_the_connection_cap_leaves_descriptors_for_everything_else() -> None:
    assert connection_cap(10_000, 1_048_576) == 10_000
    assert connection_cap(10_000, 4096) == 4096 - RESERVED_DESCRIPTORS
    assert connection_cap(10_000, 1024) == 512
    assert connection_cap(10_000, 1) == 1


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    soft = raise_open_files_limit()
    now, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == now
    assert hard == resource.RLIM_INFINITY or now == hard


def test_a_refusal_is_a_complete_response_that_closes() -> None:
    response = plain_response(429, "Too many")
    assert response == (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\n"
                        b"content-length: 8\r\nconnection: close\r\n\r\nToo many")


def test_every_web_server_command_uses_the_guarded_protocol() -> None:
    """bin/run-portal, the image and the Kubernetes manifest: a plain `uvicorn portal.asgi:application` has none of
    the slow-client limits."""
    for path in ("bin/run-portal", "platform/docker/Dockerfile", "platform/kubernetes/base/web.yaml"):
        lines = [line for line in (ROOT / path).read_text().splitlines()
                 if "uvicorn" in line and "portal.asgi:application" in line]
        assert lines, path
        assert all(f"--http {UVICORN_HTTP}" in line or f'"--http", "{UVICORN_HTTP}"' in line for line in lines), lines
