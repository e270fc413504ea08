"""Imports from s3:// and https:// (issue 35, models_registry/sources/uri.py), with no internet.

s3: moto's S3-compatible server over HTTP (the `s3_endpoint` fixture), reached with boto3's credential chain as
the product reaches AWS or MinIO. https: a real TLS server on 127.0.0.1 whose certificate names "models.example"
and "other.example" (tests/uri_servers.py), trusted through the fetcher's `ca_certs` test seam; the names resolve
through a patched socket.getaddrinfo. The friendly cases use an address policy that also allows 127.0.0.1 (the
fetcher's `address_policy` seam, which no team or setting reaches); every hostile address case uses the product's
default policy."""

from __future__ import annotations

import ipaddress
import json
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from models_registry.import_identity import identity_of
from models_registry.models import TeamSources
from models_registry.sources import fetcher_for
from models_registry.sources.base import SourceForbidden, SourceRefused, TransientFetchError
from models_registry.sources.uri import UriFetcher, public_only
from models_registry.tests.uri_servers import BODY, SIGNATURE, TlsServer, context, loopback_too, start_tls_server
from tests.support.people import Person

REAL_GETADDRINFO = socket.getaddrinfo


# -- validate ------------------------------------------------------------------------------------------------------

@pytest.fixture
def allowed_team(alice: Person, settings: Any) -> Person:
    settings.IMPORT_HTTPS_ENABLED = True
    TeamSources.objects.create(team=alice.team, s3_buckets="models/fraud/\nshared",
                               https_hosts="models.example\nmirror.example:8443")
    return alice


def validate(person: Person, uri: str) -> dict[str, Any]:
    return fetcher_for("uri").validate({"kind": "uri", "uri": uri}, person.team.id)


def test_it_accepts_an_allowed_bucket_and_host_canonically(allowed_team: Person) -> None:
    assert validate(allowed_team, "s3://models/fraud/v3/model.onnx") == {
        "kind": "uri", "uri": "s3://models/fraud/v3/model.onnx"}
    assert validate(allowed_team, "s3://shared/anything.pt")["uri"] == "s3://shared/anything.pt"
    assert validate(allowed_team, "HTTPS://Models.Example:443/m.onnx?v=2")["uri"] == "https://models.example/m.onnx?v=2"
    assert validate(allowed_team, "https://mirror.example:8443/m.onnx")["uri"] == "https://mirror.example:8443/m.onnx"


def test_it_forbids_a_bucket_or_prefix_the_team_was_not_allowed(allowed_team: Person) -> None:
    for uri in ("s3://models/other/model.onnx", "s3://private/model.onnx"):
        with pytest.raises(SourceForbidden, match="Team sources"):
            validate(allowed_team, uri)


def test_a_team_without_a_row_may_import_from_no_bucket(alice: Person) -> None:
    with pytest.raises(SourceForbidden, match="Team sources"):
        validate(alice, "s3://models/fraud/model.onnx")


def test_it_forbids_https_when_the_operator_turned_it_off(allowed_team: Person, settings: Any) -> None:
    settings.IMPORT_HTTPS_ENABLED = False
    with pytest.raises(SourceForbidden, match="turned https imports off"):
        validate(allowed_team, "https://models.example/m.onnx")


def test_it_forbids_a_host_or_port_the_team_was_not_allowed(allowed_team: Person) -> None:
    for uri in ("https://evil.example/m.onnx", "https://models.example:8443/m.onnx",
                "https://models.example.evil.example/m.onnx"):
        with pytest.raises(SourceForbidden, match="Team sources"):
            validate(allowed_team, uri)


@pytest.mark.parametrize(("uri", "says"), [
    ("http://models.example/m.onnx", "s3:// or https://"),
    ("file:///etc/passwd", "s3:// or https://"),
    ("gopher://models.example/", "s3:// or https://"),
    ("https://user:pw@models.example/m.onnx", "credentials"),
    ("https://models.example@evil.example/m.onnx", "credentials"),
    ("https://models.example/m.onnx#x", "fragment"),
    ("https://mödels.example/m.onnx", "ASCII"),
    ("https://models.example/m onnx", "ASCII"),
    ("https://models.example\\@evil/", "backslash"),
    ("https://127.0.0.1/m.onnx", "DNS name"),
    ("https://[::1]/m.onnx", "DNS name"),
    ("https://2130706433/m.onnx", "DNS name"),
    ("https://models.example:99999/m.onnx", "port"),
    ("https://models.example/a/../m.onnx", r"\.\."),
    ("https://models.example/" + "a" * 2100, "2048"),
    ("s3://models", "no key"),
    ("s3://models/", "no key"),
    ("s3://Bad_Bucket/key", "bucket name"),
    ("s3://key@models/fraud/m.onnx", "credentials"),
    ("s3://models/fraud/m.onnx?versionId=1", "no \\? or #"),
])
def test_it_refuses_a_malformed_uri_saying_what_to_fix(allowed_team: Person, uri: str, says: str) -> None:
    with pytest.raises(SourceRefused, match=says):
        validate(allowed_team, uri)


def test_it_refuses_other_fields(allowed_team: Person) -> None:
    with pytest.raises(SourceRefused, match="remove token"):
        fetcher_for("uri").validate({"kind": "uri", "uri": "s3://shared/m.onnx", "token": "x"}, allowed_team.team.id)


def test_a_uri_is_a_moving_reference_without_an_identity(allowed_team: Person) -> None:
    # What a key or a URL holds can be replaced, and nothing in the address pins it: each import is its own version.
    fetcher = fetcher_for("uri")
    assert fetcher.identity(validate(allowed_team, "HTTPS://MODELS.example/m.onnx")) is None


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "224.0.0.1", "240.0.0.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe", "192.0.2.1", "2002:7f00:1::1", "2002:a9fe:a9fe::1", "2002:a00:1::1",
])
def test_the_default_policy_refuses_every_non_public_address(address: str) -> None:
    assert not public_only(ipaddress.ip_address(address))


def test_the_default_policy_allows_public_addresses() -> None:
    assert public_only(ipaddress.ip_address("8.8.8.8"))
    assert public_only(ipaddress.ip_address("2606:4700::1111"))


def test_the_private_mirror_switch_still_refuses_loopback_and_metadata(settings: Any) -> None:
    settings.IMPORT_HTTPS_ALLOW_PRIVATE = True
    assert public_only(ipaddress.ip_address("10.1.2.3"))
    for address in ("127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "::1", "0.0.0.0"):
        assert not public_only(ipaddress.ip_address(address))


# -- https ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    server, stop = start_tls_server(tmp_path_factory.mktemp("tls"))
    try:
        yield server
    finally:
        stop()


@dataclass
class FakeDns:
    """socket.getaddrinfo for the test names: each name answers its list of address lists in turn (the last one
    repeats); an address literal (what urllib3 is handed once the fetcher pinned one) goes to the real resolver."""

    answers: dict[str, list[list[str]]]
    asked: list[str]

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            ipaddress.ip_address(str(host))
        except ValueError:
            self.asked.append(str(host))
            turns = self.answers[str(host)]
            addresses = turns[min(self.asked.count(str(host)) - 1, len(turns) - 1)]
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                    for a in addresses]
        return REAL_GETADDRINFO(host, port, *args, **kwargs)


class Everything(tuple[str, ...]):
    def __contains__(self, item: object) -> bool:
        return True


@pytest.fixture
def allow_any_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetch tests' team may import from any bucket and host (the fetcher checks its allowance again on the
    worker; the allowance itself is tested above, through the database, and in the revocation tests)."""
    from models_registry.sources import uri
    from models_registry.sources.allowed import Allowed

    allowed = Allowed(mlflow_models=(), huggingface_repos=(), huggingface_token=False, s3_buckets=(),
                      https_hosts=Everything())
    monkeypatch.setattr(uri, "allowed_for", lambda team_id: allowed)
    monkeypatch.setattr(uri, "bucket_allowed", lambda buckets, bucket, key: True)


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch, settings: Any, allow_any_source: None) -> FakeDns:
    settings.IMPORT_HTTPS_ENABLED = True
    dns = FakeDns(answers={"models.example": [["127.0.0.1"]], "other.example": [["127.0.0.1"]]}, asked=[])
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    return dns


def friendly(server: TlsServer) -> UriFetcher:
    return UriFetcher(address_policy=loopback_too, ca_certs=str(server.ca))


def https(server: TlsServer, path: str, host: str = "models.example") -> dict[str, Any]:
    return {"kind": "uri", "uri": f"https://{host}:{server.port}{path}"}


def test_it_fetches_over_verified_tls_with_the_host_name(tls_server: TlsServer, fake_dns: FakeDns,
                                                         tmp_path: Path) -> None:
    ctx, progress = context(tmp_path)
    fetched = friendly(tls_server).fetch(https(tls_server, "/model.onnx"), ctx)
    assert fetched.path.read_bytes() == BODY
    assert fetched.filename == "model.onnx"
    assert fetched.record["size"] == len(BODY)
    assert progress.calls[0] == (0, len(BODY))
    assert tls_server.seen_hosts[-1] == f"models.example:{tls_server.port}"


def test_it_refuses_a_certificate_it_cannot_verify(tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path) -> None:
    """certifi's authorities (the product's default) do not know the test authority."""
    with pytest.raises(SourceRefused, match="certificate could not be verified"):
        UriFetcher(address_policy=loopback_too).fetch(https(tls_server, "/model.onnx"), context(tmp_path)[0])


def test_it_refuses_a_certificate_for_another_name(tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path) -> None:
    fake_dns.answers["wrong.example"] = [["127.0.0.1"]]
    with pytest.raises(SourceRefused, match="certificate"):
        friendly(tls_server).fetch(https(tls_server, "/model.onnx", "wrong.example"), context(tmp_path)[0])


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.7", "169.254.169.254", "::1", "::ffff:127.0.0.1",
                                     "100.64.1.1", "fd00::1"])
def test_it_refuses_a_host_resolving_to_a_non_public_address(tls_server: TlsServer, fake_dns: FakeDns,
                                                             tmp_path: Path, address: str) -> None:
    fake_dns.answers["models.example"] = [[address]]
    requests_before = len(tls_server.seen_hosts)
    with pytest.raises(SourceRefused, match="an address that is not public") as refused:
        UriFetcher(ca_certs=str(tls_server.ca)).fetch(https(tls_server, "/model.onnx"), context(tmp_path)[0])
    assert len(tls_server.seen_hosts) == requests_before  # refused before any connection
    assert address not in str(refused.value)  # the operator's log has it; the team's error does not map the network


def test_it_refuses_when_any_resolved_address_is_not_public(fake_dns: FakeDns, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns.answers["models.example"] = [["8.8.8.8", "127.0.0.1"]]
    connections = _record_connections(monkeypatch)
    with pytest.raises(SourceRefused, match="models.example resolves to an address that is not public"):
        UriFetcher().fetch({"kind": "uri", "uri": "https://models.example/m.onnx"}, context(tmp_path)[0])
    assert connections == []


def _record_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """urllib3's connect, recorded and refused: where a fetch to a public address would have gone."""
    import urllib3.connection

    seen: list[tuple[str, int]] = []

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        seen.append(address)
        raise ConnectionRefusedError("recorded")

    monkeypatch.setattr(urllib3.connection.connection, "create_connection", connect)
    return seen


def test_a_rebinding_name_is_resolved_once_and_only_the_checked_address_is_reached(
        fake_dns: FakeDns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns.answers["models.example"] = [["8.8.8.8"], ["127.0.0.1"]]
    connections = _record_connections(monkeypatch)
    with pytest.raises(TransientFetchError):
        UriFetcher().fetch({"kind": "uri", "uri": "https://models.example/m.onnx"}, context(tmp_path)[0])
    assert fake_dns.asked == ["models.example"]
    assert connections == [("8.8.8.8", 443)]


def test_a_same_host_redirect_keeps_the_pinned_address(tls_server: TlsServer, fake_dns: FakeDns,
                                                        tmp_path: Path) -> None:
    """The second answer would point nowhere (nothing listens on 127.0.0.2's port): it is never asked for."""
    fake_dns.answers["models.example"] = [["127.0.0.1"], ["127.0.0.2"]]
    for path in ("/same-host", "/relative"):
        fake_dns.asked.clear()
        fetched = friendly(tls_server).fetch(https(tls_server, path), context(tmp_path / path.strip("/"))[0])
        assert fetched.path.read_bytes() == BODY
        assert fetched.record["final_uri"].endswith("/model.onnx")
        assert fake_dns.asked == ["models.example"]


def test_a_redirect_to_a_signed_url_leaves_its_query_out_of_the_record_and_the_errors(
        tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path) -> None:
    """The version's JSON and error are the team's to read; the query of the URL the server redirected to is the
    server's, and a presigned URL carries a credential there."""
    fetched = friendly(tls_server).fetch(https(tls_server, "/signed"), context(tmp_path / "ok")[0])
    assert fetched.path.read_bytes() == BODY
    assert fetched.record["final_uri"] == f"https://models.example:{tls_server.port}/model.onnx"
    assert SIGNATURE not in json.dumps(fetched.record) and "AKIAOPERATOR" not in json.dumps(fetched.record)
    with pytest.raises(SourceRefused, match="answered 404") as refused:
        friendly(tls_server).fetch(https(tls_server, "/signed-missing"), context(tmp_path / "missing")[0])
    assert SIGNATURE not in str(refused.value) and "AKIAOPERATOR" not in str(refused.value)


@pytest.mark.parametrize(("path", "says"), [
    ("/to-http", "redirects to http://models.example"),
    ("/to-loopback", "redirects to http://127.0.0.1/latest/meta-data/"),
    ("/to-other", "redirects to another host, other.example"),
    ("/loop", "more than 3 times"),
])
def test_it_refuses_a_redirect_off_https_or_off_the_host(tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path,
                                                          path: str, says: str) -> None:
    with pytest.raises(SourceRefused, match=says):
        friendly(tls_server).fetch(https(tls_server, path), context(tmp_path)[0])
    assert "other.example" not in fake_dns.asked


def test_a_declared_size_over_the_allowance_is_refused_before_the_body(tls_server: TlsServer, fake_dns: FakeDns,
                                                                        tmp_path: Path) -> None:
    ctx, progress = context(tmp_path, max_bytes=1000)
    with pytest.raises(SourceRefused, match="more than your team's quota"):
        friendly(tls_server).fetch(https(tls_server, "/huge-length"), ctx)
    assert progress.calls == []
    assert list(tmp_path.iterdir()) == []


def test_a_body_without_length_is_cut_at_the_allowance(tls_server: TlsServer, fake_dns: FakeDns,
                                                       tmp_path: Path) -> None:
    ctx, progress = context(tmp_path, max_bytes=100_000)
    with pytest.raises(SourceRefused, match="more than 100000 bytes"):
        friendly(tls_server).fetch(https(tls_server, "/no-length"), ctx)
    # Chunks may arrive short of a full read: what counts is that none past the allowance was ever reported.
    assert progress.calls[0] == (0, None)
    assert all(done <= 100_000 for done, _ in progress.calls)


def test_a_body_longer_than_its_length_is_cut_at_the_length(tls_server: TlsServer, fake_dns: FakeDns,
                                                            tmp_path: Path) -> None:
    fetched = friendly(tls_server).fetch(https(tls_server, "/lying-length"), context(tmp_path)[0])
    assert fetched.path.read_bytes() == b"y" * 10


def test_a_slow_server_hits_the_read_timeout(tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path,
                                             settings: Any) -> None:
    settings.IMPORT_READ_TIMEOUT_SECONDS = 0.3
    with pytest.raises(TransientFetchError, match="transfer broke|timed out"):
        friendly(tls_server).fetch(https(tls_server, "/slow"), context(tmp_path)[0])


def test_a_trickling_server_meets_the_imports_deadline_not_only_the_read_timeout(
        tls_server: TlsServer, fake_dns: FakeDns, tmp_path: Path, settings: Any) -> None:
    settings.IMPORT_READ_TIMEOUT_SECONDS = 5.0  # every byte arrives inside it: only the deadline can end this
    ctx, _progress = context(tmp_path, seconds=0.5)
    started = time.monotonic()
    with pytest.raises(SourceRefused, match="took longer"):
        friendly(tls_server).fetch(https(tls_server, "/trickle"), ctx)
    assert time.monotonic() - started < 3


def test_a_rebinding_name_over_ipv6_reaches_only_the_checked_address(fake_dns: FakeDns, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns.answers["models.example"] = [["2606:4700::1111"], ["::1"]]
    connections = _record_connections(monkeypatch)
    with pytest.raises(TransientFetchError):
        UriFetcher().fetch({"kind": "uri", "uri": "https://models.example/m.onnx"}, context(tmp_path)[0])
    assert fake_dns.asked == ["models.example"]
    assert connections == [("2606:4700::1111", 443)]


def test_a_5xx_is_retried_and_a_4xx_is_the_teams_to_fix(tls_server: TlsServer, fake_dns: FakeDns,
                                                        tmp_path: Path) -> None:
    with pytest.raises(TransientFetchError, match="503"):
        friendly(tls_server).fetch(https(tls_server, "/unavailable"), context(tmp_path / "a")[0])
    with pytest.raises(SourceRefused, match="404"):
        friendly(tls_server).fetch(https(tls_server, "/missing"), context(tmp_path / "b")[0])


def test_a_refused_connection_is_retried(fake_dns: FakeDns, tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(TransientFetchError):
        UriFetcher(address_policy=loopback_too).fetch({"kind": "uri", "uri": f"https://models.example:{port}/m"},
                                                      context(tmp_path)[0])


def test_https_turned_off_after_queueing_is_refused_at_fetch(settings: Any, tmp_path: Path,
                                                             allow_any_source: None) -> None:
    settings.IMPORT_HTTPS_ENABLED = False
    with pytest.raises(SourceForbidden, match="turned https imports off"):
        UriFetcher().fetch({"kind": "uri", "uri": "https://models.example/m.onnx"}, context(tmp_path)[0])


def test_a_host_or_bucket_removed_after_queueing_is_refused_at_fetch_before_any_lookup(
        allowed_team: Person, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = validate(allowed_team, "https://models.example/m.onnx")
    queued_s3 = validate(allowed_team, "s3://shared/m.onnx")
    TeamSources.objects.filter(team=allowed_team.team).update(https_hosts="", s3_buckets="")
    looked_up: list[Any] = []

    def lookup(*args: Any, **kwargs: Any) -> list[Any]:
        looked_up.append(args)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    ctx = context(tmp_path)[0]
    ctx.team_id = allowed_team.team.id
    for queued in (source, queued_s3):
        with pytest.raises(SourceForbidden, match="Team sources"):
            UriFetcher().fetch(queued, ctx)
    assert looked_up == []


# -- s3 ------------------------------------------------------------------------------------------------------------

@dataclass
class ImportBucket:
    client: Any
    name: str


@pytest.fixture
def moto_bucket(s3_endpoint: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> ImportBucket:
    """A fresh bucket, and the import settings pointing at moto with credentials from boto3's chain (the
    environment), as an operator's would."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    settings.IMPORT_S3_ENDPOINT_URL = s3_endpoint
    settings.IMPORT_S3_REGION = "us-east-1"
    name = f"imports-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return ImportBucket(client, name)


@pytest.fixture
def import_bucket(moto_bucket: ImportBucket, allow_any_source: None) -> ImportBucket:
    """moto_bucket, which the fetch tests' team may import from."""
    return moto_bucket


def s3(bucket: ImportBucket, key: str) -> dict[str, Any]:
    return {"kind": "uri", "uri": f"s3://{bucket.name}/{key}"}


@pytest.mark.s3
def test_it_fetches_an_s3_object_sized_first(import_bucket: ImportBucket, tmp_path: Path) -> None:
    import_bucket.client.put_object(Bucket=import_bucket.name, Key="fraud/v3/model.onnx", Body=BODY)
    ctx, progress = context(tmp_path)
    fetched = UriFetcher().fetch(s3(import_bucket, "fraud/v3/model.onnx"), ctx)
    assert fetched.path.read_bytes() == BODY
    assert fetched.filename == "model.onnx"
    assert fetched.record["size"] == len(BODY)
    assert progress.calls[0] == (0, len(BODY))
    assert progress.calls[-1] == (len(BODY), len(BODY))


@pytest.mark.s3
def test_an_s3_object_over_the_allowance_is_refused_before_its_bytes(import_bucket: ImportBucket,
                                                                      tmp_path: Path) -> None:
    import_bucket.client.put_object(Bucket=import_bucket.name, Key="big.onnx", Body=b"z" * 5000)
    ctx, progress = context(tmp_path, max_bytes=4000)
    with pytest.raises(SourceRefused, match="5000 bytes"):
        UriFetcher().fetch(s3(import_bucket, "big.onnx"), ctx)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.s3
def test_the_quota_reservation_refuses_an_s3_object_at_its_total(import_bucket: ImportBucket,
                                                                  tmp_path: Path) -> None:
    """The team's quota may be smaller than max_bytes: progress(0, total) is where it refuses, before any byte."""
    import_bucket.client.put_object(Bucket=import_bucket.name, Key="m.onnx", Body=b"z" * 5000)
    ctx, progress = context(tmp_path)
    progress.max_bytes = 4000
    with pytest.raises(SourceRefused, match="more than 4000"):
        UriFetcher().fetch(s3(import_bucket, "m.onnx"), ctx)
    assert progress.calls == [(0, 5000)]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.s3
def test_a_missing_key_and_a_missing_bucket_read_the_same(import_bucket: ImportBucket, tmp_path: Path) -> None:
    messages = []
    for source in (s3(import_bucket, "nope.onnx"), {"kind": "uri", "uri": "s3://no-such-bucket-here/nope.onnx"}):
        with pytest.raises(SourceRefused, match="not found, or the operator's credentials may not read it") as info:
            UriFetcher().fetch(source, context(tmp_path)[0])
        messages.append(str(info.value).split(" was ")[1])
    assert messages[0] == messages[1]


@pytest.mark.s3
def test_an_unreachable_object_store_is_retried(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                allow_any_source: None) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings.IMPORT_S3_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    settings.IMPORT_CONNECT_TIMEOUT_SECONDS = 0.5
    with pytest.raises(TransientFetchError, match="could not be reached") as caught:
        UriFetcher().fetch({"kind": "uri", "uri": "s3://models/m.onnx"}, context(tmp_path)[0])
    # The endpoint is the operator's: the version's error (the team's to read) never names it.
    assert f"127.0.0.1:{port}" not in str(caught.value) and "endpoint URL" not in str(caught.value)


@pytest.mark.s3
def test_an_s3_folder_is_fetched_and_packed_as_a_tar(import_bucket: ImportBucket, tmp_path: Path) -> None:
    for key, body in (("sm/v1/saved_model.pb", b"pb"), ("sm/v1/variables/variables.index", b"ix"),
                      ("sm/v1/", b"")):
        import_bucket.client.put_object(Bucket=import_bucket.name, Key=key, Body=body)
    ctx, progress = context(tmp_path)
    fetched = UriFetcher().fetch(s3(import_bucket, "sm/v1/"), ctx)
    assert fetched.filename == "v1.tar"
    with tarfile.open(fetched.path) as tar:
        assert sorted(tar.getnames()) == ["saved_model.pb", "variables", "variables/variables.index"]
    assert sorted(fetched.record["files"]) == ["saved_model.pb", "variables/variables.index"]
    assert progress.calls[0] == (0, 4)


@pytest.mark.s3
def test_an_s3_folder_over_the_entry_limit_is_refused(import_bucket: ImportBucket, tmp_path: Path,
                                                      settings: Any) -> None:
    settings.ARCHIVE_MAX_ENTRIES = 2
    for index in range(3):
        import_bucket.client.put_object(Bucket=import_bucket.name, Key=f"many/{index}.bin", Body=b"x")
    with pytest.raises(SourceRefused, match="ARCHIVE_MAX_ENTRIES"):
        UriFetcher().fetch(s3(import_bucket, "many/"), context(tmp_path)[0])


@pytest.mark.s3
def test_an_empty_s3_folder_is_refused(import_bucket: ImportBucket, tmp_path: Path) -> None:
    with pytest.raises(SourceRefused, match="not found"):
        UriFetcher().fetch(s3(import_bucket, "empty/"), context(tmp_path)[0])


@pytest.mark.s3
def test_an_s3_folder_named_dot_dot_is_packed_inside_the_working_directory(import_bucket: ImportBucket,
                                                                             tmp_path: Path) -> None:
    """S3 takes "a/../" as a key like any other text: the tar's name must not climb out with it."""
    import_bucket.client.put_object(Bucket=import_bucket.name, Key="a/../model.onnx", Body=b"m")
    fetched = UriFetcher().fetch(s3(import_bucket, "a/../"), context(tmp_path)[0])
    assert fetched.path.parent == tmp_path
    assert fetched.filename == "model.tar"


# -- through the API and the import task ---------------------------------------------------------------------------

@pytest.mark.s3
def test_an_s3_import_goes_from_the_api_through_the_import_task_to_validation(
        moto_bucket: ImportBucket, alice: Person, digits_model: Any) -> None:
    from models_registry.import_worker import run_import
    from models_registry.models import ModelVersion
    from tests.artifacts import tiny_onnx

    onnx = tiny_onnx()
    moto_bucket.client.put_object(Bucket=moto_bucket.name, Key="fraud/v3/model.onnx", Body=onnx)
    TeamSources.objects.create(team=alice.team, s3_buckets=f"{moto_bucket.name}/fraud/")
    uri = f"s3://{moto_bucket.name}/fraud/v3/model.onnx"
    response = alice.client().post("/api/v1/models/digits/versions/", {"source": {"kind": "uri", "uri": uri}},
                                   format="json")
    assert response.status_code in (201, 202), response.content
    version = ModelVersion.objects.get(model=digits_model)
    run_import(version.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.VALIDATING, version.error
    assert version.format == "onnx"
    assert version.size == len(onnx)
    assert version.source is not None
    assert version.source["uri"] == uri
    assert version.source["fetched"]["size"] == len(onnx)


@pytest.mark.s3
def test_an_s3_object_imported_again_is_one_version_until_it_is_replaced(
        moto_bucket: ImportBucket, alice: Person, digits_model: Any,
        django_capture_on_commit_callbacks: Any) -> None:
    """A training job's bucket: importing its key at every CI run makes one version while the object stays, and a new
    one once a new object was put under the key (its ETag, asked with one HEAD at the API, tells them apart)."""
    from models_registry.import_worker import run_import
    from models_registry.models import ModelVersion
    from tests.artifacts import tiny_onnx

    TeamSources.objects.create(team=alice.team, s3_buckets=f"{moto_bucket.name}/fraud/")
    moto_bucket.client.put_object(Bucket=moto_bucket.name, Key="fraud/model.onnx", Body=BODY)
    source = {"kind": "uri", "uri": f"s3://{moto_bucket.name}/fraud/model.onnx"}

    def imported() -> tuple[int, int]:
        with django_capture_on_commit_callbacks(execute=False):
            answer = alice.client().post("/api/v1/models/digits/versions/", {"source": source}, format="json")
        return answer.status_code, answer.json()["number"]

    first = imported()
    assert first[0] == 201 and imported() == (200, first[1])
    moto_bucket.client.put_object(Bucket=moto_bucket.name, Key="fraud/model.onnx", Body=BODY + b"\x00")
    replaced = imported()
    assert replaced == (201, first[1] + 1)
    # The worker keys the version by the object it fetched: replaced again before the fetch, it is the newest one's.
    moto_bucket.client.put_object(Bucket=moto_bucket.name, Key="fraud/model.onnx", Body=tiny_onnx())
    version = ModelVersion.objects.get(model=digits_model, number=replaced[1])
    run_import(version.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.VALIDATING, version.error
    assert version.source is not None
    assert version.source_identity == identity_of("uri", {**source, "etag": version.source["fetched"]["etag"]})
    assert imported() == (200, replaced[1])


def test_a_folder_and_an_https_object_are_never_pinned(allowed_team: Person) -> None:
    fetcher = fetcher_for("uri")
    assert fetcher.pinned({"uri": "s3://models/fraud/v3/"}, allowed_team.team.id) is None
    assert fetcher.pinned({"uri": "https://models.example/m.onnx"}, allowed_team.team.id) is None
    assert fetcher.pinned_from({"uri": "s3://models/fraud/v3/"}, {"files": {}}) is None


@pytest.mark.s3
def test_an_s3_import_from_a_bucket_not_allowed_is_a_403_naming_team_sources(moto_bucket: ImportBucket,
                                                                             alice: Person, digits_model: Any) -> None:
    response = alice.client().post(
        "/api/v1/models/digits/versions/",
        {"source": {"kind": "uri", "uri": f"s3://{moto_bucket.name}/fraud/model.onnx"}}, format="json")
    assert response.status_code == 403
    assert "Team sources" in response.content.decode()
