"""Imports from a URI (issue 35): `{"kind": "uri", "uri": "s3://bucket/key" | "https://host/path"}`.

s3:// is read with the operator's endpoint and credentials (boto3's own chain), only from the buckets and prefixes
the operator allowed the team (admin console: Team sources). A key ending in "/" is a folder (a SavedModel lives in
a bucket as a prefix): its objects are fetched one by one through `target_path` and packed with `pack_tree`.

https:// is a fetch the server makes on a team's behalf, so server-side request forgery is the threat: a URL that
reaches the cloud's metadata address, the cluster's services or localhost. The rules (docs/security.md, "Imports
over https"):
- only the hosts the operator allowed the team, by exact name, on port 443 unless the entry names the port;
- the host is resolved once; every address it resolves to must be public (`ipaddress`: is_global, and not an
  IPv4-mapped or NAT64 form of a private one), else the fetch is refused; the connection then goes to that one
  address, with TLS SNI and certificate verification for the host name, so a second resolution (DNS rebinding)
  never happens;
- no automatic redirect: at most MAX_REDIRECTS, each to https on the same host and port (re-using the pinned
  address), any other refused naming it;
- Content-Length larger than the quota is refused before the body; the bytes are counted as they arrive, so a
  missing or lying Content-Length is cut at ctx.max_bytes; connect and read timeouts from the settings, bounded by
  the import's deadline.
"""

from __future__ import annotations

import ipaddress
import logging
import posixpath
import re
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import unquote, urljoin, urlsplit

from django.conf import settings

from models_registry.sources.allowed import allowed_for, bucket_allowed
from models_registry.sources.base import (
    PIN_TIMEOUT_SECONDS,
    FetchContext,
    Fetched,
    SourceForbidden,
    SourceRefused,
    TransientFetchError,
    copy_counted,
    pack_tree,
    target_path,
)

log = logging.getLogger(__name__)

MAX_URI_LENGTH = 2048
MAX_REDIRECTS = 3
# S3's bucket naming rules (lower case, digits, dots and hyphens, 3 to 63): anything else is no bucket.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# A DNS name in ASCII (an internationalised name is given in its xn-- form): no IP literal tricks like "0x7f.1"
# pass this without also being checked as addresses at fetch time.
_HOST = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
TEAM_SOURCES = "the admin console's Team sources"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressPolicy = Callable[[IPAddress], bool]


def public_only(address: IPAddress) -> bool:
    """The product's rule: a public unicast address. `is_global` is False for private, loopback, link-local (the
    metadata address 169.254.169.254), CGNAT 100.64/10, multicast, reserved and unspecified; the IPv6 forms that
    carry an IPv4 address (::ffff:a.b.c.d, 2002::/16 6to4, 64:ff9b::/96 NAT64) are judged by the address they carry.
    IMPORT_HTTPS_ALLOW_PRIVATE (an operator's switch for an air-gapped mirror, dangerous) lets private addresses
    through, never loopback, link-local, multicast or unspecified."""
    address = _embedded_ipv4(address)
    if address.is_multicast or address.is_unspecified or address.is_loopback or address.is_link_local:
        return False
    if address.is_global:
        return True
    return bool(settings.IMPORT_HTTPS_ALLOW_PRIVATE) and address.is_private


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        # 6to4 (2002::/16) is_global even when it carries 127.0.0.1: a relay would unwrap it to that address.
        if address.sixtofour is not None:
            return address.sixtofour
        if address in ipaddress.IPv6Network("64:ff9b::/96"):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _refuse_text(uri: str) -> None:
    if len(uri) > MAX_URI_LENGTH:
        raise SourceRefused(f"source.uri is longer than {MAX_URI_LENGTH} characters.")
    if not uri.isascii() or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in uri) or "\\" in uri:
        raise SourceRefused("source.uri must be plain ASCII with no spaces, control characters or backslashes "
                            "(percent-encode the path; give an internationalised host in its xn-- form).")


class UriFetcher:
    """The fetcher of kind "uri". `address_policy` and `ca_certs` are seams for the tests only (a local TLS server
    on 127.0.0.1 with its own certificate authority); the product builds it with the defaults, and no team input
    reaches them."""

    kind = "uri"

    def __init__(self, address_policy: AddressPolicy = public_only, ca_certs: str | None = None) -> None:
        self.address_policy = address_policy
        self.ca_certs = ca_certs

    # -- validate ---------------------------------------------------------------------------------------------

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        extra = sorted(set(source) - {"kind", "uri"})
        if extra:
            raise SourceRefused(f"A uri source has only `kind` and `uri`; remove {', '.join(extra)}.")
        uri = source.get("uri")
        if not isinstance(uri, str) or not uri:
            raise SourceRefused('source.uri is required: "s3://bucket/key" or "https://host/path".')
        _refuse_text(uri)
        scheme = uri.partition(":")[0].lower()
        if scheme == "s3":
            return {"kind": "uri", "uri": self._validate_s3(uri, team_id)}
        if scheme == "https":
            return {"kind": "uri", "uri": self._validate_https(uri, team_id)}
        raise SourceRefused(f"source.uri must start with s3:// or https://, got {scheme[:20]!r}:// "
                            "(plain http is refused: the bytes could be changed on the way).")

    def _validate_s3(self, uri: str, team_id: int) -> str:
        bucket, key = _split_s3(uri)
        if not bucket_allowed(allowed_for(team_id).s3_buckets, bucket, key):
            raise SourceForbidden(f"s3://{bucket}/{key} is not in the buckets the operator allowed your team "
                                  f"({TEAM_SOURCES}); ask an operator to add it.")
        return f"s3://{bucket}/{key}"

    def _validate_https(self, uri: str, team_id: int) -> str:
        if not settings.IMPORT_HTTPS_ENABLED:
            raise SourceForbidden("The operator turned https imports off (IMPORT_HTTPS_ENABLED); import from s3:// "
                                  "or upload the file.")
        host, port, target = _split_https(uri)
        allowed = allowed_for(team_id).https_hosts
        name = host if port == 443 else f"{host}:{port}"
        if name not in allowed:
            raise SourceForbidden(f"{name} is not among the https hosts the operator allowed your team "
                                  f"({TEAM_SOURCES}); ask an operator to add it.")
        return f"https://{name}{target}"

    def identity(self, source: dict[str, Any]) -> str | None:
        # An object under an s3 key, or what a URL serves, can be replaced at any time and the address gives no way
        # to pin it (a versionId query is refused): every uri source is a moving reference. Pinned, an s3 object is
        # its key and the ETag the store gave its bytes (a new object under the key gets a new one).
        etag = source.get("etag")
        return f"uri:{source['uri']}@{etag}" if isinstance(etag, str) and etag else None

    def pinned(self, source: dict[str, Any], team_id: int) -> dict[str, Any] | None:
        """An s3 object pinned by its ETag (one HEAD); None for a folder (a prefix names no one object) and for
        https, whose servers give no tag one could trust for every host."""
        uri = source["uri"]
        if not uri.startswith("s3://"):
            return None
        bucket, key = _split_s3(uri)
        if key.endswith("/"):
            return None
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = _s3_client(timeout=PIN_TIMEOUT_SECONDS).head_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise _s3_error(exc, bucket, key) from None
        return {**source, "etag": str(head["ETag"]).strip('"')}

    def pinned_from(self, source: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
        etag = record.get("etag")
        if not source["uri"].startswith("s3://") or not isinstance(etag, str) or not etag:
            return None
        return {**source, "etag": etag}

    # -- fetch ------------------------------------------------------------------------------------------------

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        uri = source["uri"]
        _refuse_text(uri)
        # The allowance is checked again on the worker: an operator who removes a bucket or a host (or turns
        # https off) stops the imports already queued for it, not only the next ones.
        if uri.startswith("s3://"):
            self._validate_s3(uri, ctx.team_id)
            bucket, key = _split_s3(uri)
            return _fetch_s3(bucket, key, ctx)
        if uri.startswith("https://"):
            self._validate_https(uri, ctx.team_id)
            return self._fetch_https(uri, ctx)
        raise SourceRefused("source.uri must start with s3:// or https://.")

    def _fetch_https(self, uri: str, ctx: FetchContext) -> Fetched:
        import urllib3

        host, port, target = _split_https(uri)
        address = self._pinned_address(host, port)
        # urllib3's HTTPSConnectionPool connects to `host=` (here the pinned IP, so no resolution happens inside
        # it) while `server_hostname` sets SNI and `assert_hostname` checks the certificate against the name the
        # team gave. requests would need a custom adapter to do the same, and would follow redirects by default;
        # one pool bound to one address makes "never resolve again" a property of the object, not of a flag.
        pool = urllib3.HTTPSConnectionPool(
            host=address, port=port, server_hostname=host, assert_hostname=host, cert_reqs="CERT_REQUIRED",
            ca_certs=self.ca_certs or _default_ca_bundle(), retries=False, maxsize=1, block=True)
        try:
            for _hop in range(MAX_REDIRECTS + 1):
                response = self._request(pool, host, port, target, ctx)
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location", "")
                    response.release_conn()
                    target = _same_host_redirect(f"https://{_netloc(host, port)}{target}", location, host, port)
                    continue
                return _receive(response, f"https://{_netloc(host, port)}{target}", uri, ctx)
            raise SourceRefused(f"{uri} redirects more than {MAX_REDIRECTS} times; give the final address.")
        finally:
            pool.close()

    def _pinned_address(self, host: str, port: int) -> str:
        """The one address this fetch connects to, after checking every address the host resolves to."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise TransientFetchError(f"{host} could not be resolved ({exc}).") from None
        addresses = []
        for info in infos:
            try:
                addresses.append(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
            except ValueError:
                raise SourceRefused(f"{host} resolves to something that is not an address.") from None
        if not addresses:
            raise TransientFetchError(f"{host} resolves to no address.")
        for address in addresses:
            if not self.address_policy(address):
                # The address goes to the operator's log only: named in the version's error, a team could map the
                # operator's internal names to their private addresses one import at a time.
                log.warning("https import from %s refused: it resolves to %s, not a public address", host, address)
                raise SourceRefused(f"{host} resolves to an address that is not public (a private, loopback or "
                                    "link-local one): imports over https reach public hosts only.")
        return str(addresses[0])

    def _request(self, pool: Any, host: str, port: int, target: str, ctx: FetchContext) -> Any:
        import urllib3

        connect, read = _timeouts(ctx)
        try:
            response = pool.urlopen(
                "GET", target, headers={"Host": _netloc(host, port), "Accept-Encoding": "identity",
                                        "User-Agent": "modelport-import"},
                # decode_content off: the bytes stored are the bytes sent (a gzip the server sends anyway is not
                # inflated here, so no decompression bomb grows past the count).
                redirect=False, retries=False, preload_content=False, assert_same_host=False, decode_content=False,
                timeout=urllib3.Timeout(connect=connect, read=read))
        except urllib3.exceptions.SSLError as exc:
            raise SourceRefused(f"{host}'s TLS certificate could not be verified ({_short(exc)}).") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientFetchError(f"https://{_netloc(host, port)}: {_short(exc)}") from None
        if response.status >= 500 or response.status == 429:
            response.release_conn()
            raise TransientFetchError(f"https://{_netloc(host, port)}{_shown(target)} answered {response.status}.")
        if response.status >= 400:
            response.release_conn()
            raise SourceRefused(f"https://{_netloc(host, port)}{_shown(target)} answered {response.status}; check "
                                "the address.")
        return response


fetcher = UriFetcher()


# -- parsing ------------------------------------------------------------------------------------------------------

def _split_s3(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if parts.scheme != "s3" or parts.query or parts.fragment or "#" in uri or "?" in uri:
        raise SourceRefused('source.uri must be "s3://bucket/key", with no ? or #.')
    if "@" in parts.netloc or ":" in parts.netloc:
        raise SourceRefused("source.uri's bucket holds no credentials and no port: s3://bucket/key.")
    bucket, key = parts.netloc, parts.path.removeprefix("/")
    if not _BUCKET.match(bucket):
        raise SourceRefused(f"{bucket[:80]!r} is not an S3 bucket name (3 to 63 lower-case letters, digits, dots, "
                            "hyphens).")
    if not key:
        raise SourceRefused("source.uri names a bucket but no key: s3://bucket/path/to/model.onnx.")
    if len(key.encode()) > 1024:
        raise SourceRefused("source.uri's key is longer than S3's 1,024 bytes.")
    return bucket, key


def _split_https(uri: str) -> tuple[str, int, str]:
    """(host, port, path-and-query) of an https URL, strictly: no userinfo, no fragment, an ASCII DNS name."""
    parts = urlsplit(uri)
    if parts.scheme != "https":
        raise SourceRefused("source.uri must start with https://.")
    if parts.fragment or "#" in uri:
        raise SourceRefused("source.uri holds a fragment (#...): remove it.")
    if "@" in parts.netloc:
        raise SourceRefused("source.uri holds credentials (user@host): they are refused; the host must serve the "
                            "file without them.")
    try:
        port = parts.port or 443
    except ValueError:
        raise SourceRefused("source.uri's port is not a number from 1 to 65535.") from None
    host = (parts.hostname or "").lower()
    if not host or not _HOST.match(host) or host.replace(".", "").isdigit():
        raise SourceRefused(f"source.uri's host must be a DNS name (not an address), got {parts.netloc[:80]!r}.")
    path = parts.path or "/"
    if any(segment in (".", "..") for segment in unquote(path).split("/")):
        raise SourceRefused("source.uri's path holds . or .. segments: give the plain path.")
    target = path + (f"?{parts.query}" if parts.query else "")
    return host, port, target


def _same_host_redirect(current: str, location: str, host: str, port: int) -> str:
    if not location:
        raise SourceRefused(f"{_shown(current)} redirects without a Location.")
    _refuse_text(location)
    absolute = urljoin(current, location)
    scheme = absolute.partition(":")[0].lower()
    if scheme != "https":
        raise SourceRefused(f"{_shown(current)} redirects to {_shown(absolute)}: a redirect to anything but https on "
                            "the same host is refused.")
    new_host, new_port, target = _split_https(absolute)
    if (new_host, new_port) != (host, port):
        raise SourceRefused(f"{_shown(current)} redirects to another host, {_netloc(new_host, new_port)}: redirects "
                            "are followed on the same host only; give the final address (and ask an operator to "
                            "allow its host).")
    return target


def _netloc(host: str, port: int) -> str:
    return host if port == 443 else f"{host}:{port}"


def _short(exc: BaseException) -> str:
    """An exception's text for a message the team reads, its URLs' query strings cut (urllib3 names the URL)."""
    return _QUERY.sub("?...", str(exc))[:200]


# A URL's query string, up to what ends a URL in an exception's text.
_QUERY = re.compile(r"\?[^\s'\")>]*")


def _shown(url: str) -> str:
    """A URL as a message shows it: without its query string, which after a redirect is the server's (a signed URL
    carries its credentials there), and at most 200 characters."""
    base, sep, _ = url.partition("?")
    return f"{base[:200]}{'?...' if sep else ''}"


def _default_ca_bundle() -> str | None:
    """settings.IMPORT_HTTPS_CA_BUNDLE (an operator's internal authority), else certifi's, else the system's."""
    if settings.IMPORT_HTTPS_CA_BUNDLE:
        return str(settings.IMPORT_HTTPS_CA_BUNDLE)
    try:
        import certifi
    except ImportError:
        return None
    return str(certifi.where())


def _timeouts(ctx: FetchContext) -> tuple[float, float]:
    """The settings' timeouts, never past the import's deadline."""
    left = ctx.deadline - time.monotonic()
    if left <= 0:
        ctx.check_time()
    left = max(left, 0.1)
    return (min(float(settings.IMPORT_CONNECT_TIMEOUT_SECONDS), left),
            min(float(settings.IMPORT_READ_TIMEOUT_SECONDS), left))


def _filename(path: str, default: str) -> str:
    """The name format detection reads: the last segment of the path, as an upload's file name."""
    name = posixpath.basename(unquote(path.split("?", 1)[0]).rstrip("/"))
    if not name or name in (".", "..") or any(ord(ch) < 0x20 for ch in name):
        return default
    return name[:200]


class _Bounded:
    """A stream that refuses to yield more than `limit` bytes in all: a Content-Length that lies (or is missing)
    does not let a body grow past the quota, whatever ctx.progress does with a total of None. Where the source can
    return what has arrived (urllib3's read1), a read gathers it piece by piece and checks the import's deadline
    between pieces, so a server that drips a byte just inside every read timeout still stops at the deadline."""

    def __init__(self, src: Any, limit: int, done: int, ctx: FetchContext) -> None:
        self.src = src
        self.limit = limit
        self.seen = done
        self.ctx = ctx

    def read(self, size: int = -1) -> bytes:
        read1 = getattr(self.src, "read1", None)
        if read1 is None or size < 0:
            chunk: bytes = self.src.read(size)
        else:
            parts: list[bytes] = []
            gathered = 0
            while gathered < size:
                piece: bytes = read1(size - gathered)
                if not piece:
                    break
                parts.append(piece)
                gathered += len(piece)
                if self.seen + gathered > self.limit:
                    break
                self.ctx.check_time()
            chunk = b"".join(parts)
        self.seen += len(chunk)
        if self.seen > self.limit:
            raise SourceRefused(f"The source sent more than {self.limit} bytes, more than your team's quota or "
                                "the largest upload (MAX_UPLOAD_SIZE) allows.")
        return chunk


def _bounded(src: Any, limit: int, ctx: FetchContext, done: int = 0) -> IO[bytes]:
    return cast(IO[bytes], _Bounded(src, limit, done, ctx))


def _receive(response: Any, final: str, uri: str, ctx: FetchContext) -> Fetched:
    import urllib3

    if response.status != 200:
        response.release_conn()
        raise SourceRefused(f"{_shown(final)} answered {response.status}, not 200 with the file.")
    declared = response.headers.get("Content-Length")
    total: int | None = None
    if declared is not None:
        if not declared.isdigit():
            response.release_conn()
            raise SourceRefused(f"{_shown(final)} sent a Content-Length that is not a number.")
        total = int(declared)
        if total > ctx.max_bytes:
            response.release_conn()
            raise SourceRefused(f"{_shown(final)} is {total} bytes, more than your team's quota or the largest "
                                f"upload allows ({ctx.max_bytes}).")
    ctx.progress(0, total)  # reserves the quota for a declared size, refused before the body
    filename = _filename(urlsplit(final).path, "model")
    dest = target_path(ctx.workdir, f"download-{filename}")
    try:
        # enforce_content_length is off on the response object for a chunked body; urllib3 raises on a short
        # body (IncompleteRead, a ProtocolError) and _Bounded on a long one.
        size, digest = copy_counted(_bounded(response, ctx.max_bytes, ctx), dest, ctx, 0, total)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise TransientFetchError(f"{_shown(final)}: the transfer broke ({_short(exc)}).") from None
    finally:
        response.release_conn()
    record: dict[str, Any] = {"uri": uri, "sha256": digest, "size": size}
    if final != uri:
        # Without its query: a redirect's query string is the server's (often a signed URL's credentials), not
        # the team's, and the version's JSON is shown to the whole team.
        record["final_uri"] = final.split("?", 1)[0]
    return Fetched(path=dest, filename=filename, record=record)


# -- s3 -----------------------------------------------------------------------------------------------------------

def _s3_client(timeout: float | None = None) -> Any:
    import boto3
    from botocore.config import Config

    endpoint = settings.IMPORT_S3_ENDPOINT_URL or settings.S3_ENDPOINT_URL or None
    config = Config(connect_timeout=min(float(settings.IMPORT_CONNECT_TIMEOUT_SECONDS), timeout or float("inf")),
                    read_timeout=min(float(settings.IMPORT_READ_TIMEOUT_SECONDS), timeout or float("inf")),
                    # The import task retries with its own backoff (IMPORT_MAX_RETRIES): one attempt here.
                    retries={"total_max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, region_name=settings.IMPORT_S3_REGION or None, config=config)


def _s3_error(exc: BaseException, bucket: str, key: str) -> Exception:
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3://{bucket}/{key}"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if status >= 500 or code in ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                                     "InternalError", "ServiceUnavailable"):
            return TransientFetchError(f"{where}: the object store answered {code or status}; it will be retried.")
        if status == 412 or code == "PreconditionFailed":
            return TransientFetchError(f"{where} changed while it was being fetched; it will be retried.")
        # 403 and 404 read the same, so that an import cannot probe which buckets or keys exist.
        return SourceRefused(f"{where} was not found, or the operator's credentials may not read it; check the "
                             "key (a folder ends with /).")
    # botocore's texts name the operator's endpoint URL ('Could not connect to the endpoint URL: "http://..."'):
    # the team reads the version's error, so it gets the kind of fault and the operator's log the whole text.
    log.warning("import from %s: %s", where, exc)
    if isinstance(exc, BotoCoreError):
        return TransientFetchError(f"{where}: the object store could not be reached ({type(exc).__name__}); it will "
                                   "be retried.")
    return TransientFetchError(f"{where}: the object store failed ({type(exc).__name__}); it will be retried.")


def _fetch_s3(bucket: str, key: str, ctx: FetchContext) -> Fetched:
    from botocore.exceptions import BotoCoreError, ClientError

    client = _s3_client()
    uri = f"s3://{bucket}/{key}"
    try:
        if key.endswith("/"):
            return _fetch_s3_folder(client, bucket, key, ctx)
        head = client.head_object(Bucket=bucket, Key=key)
        total = int(head["ContentLength"])
        if total > ctx.max_bytes:
            raise SourceRefused(f"{uri} is {total} bytes, more than your team's quota or the largest upload "
                                f"allows ({ctx.max_bytes}).")
        ctx.progress(0, total)
        filename = _filename(key, "model")
        dest = target_path(ctx.workdir, f"download-{filename}")
        # IfMatch: the bytes are those of the object the HEAD sized, not a newer one put in between.
        body = client.get_object(Bucket=bucket, Key=key, IfMatch=head["ETag"])["Body"]
        try:
            size, digest = copy_counted(_bounded(body, min(total, ctx.max_bytes), ctx), dest, ctx, 0, total)
        finally:
            body.close()
    except (ClientError, BotoCoreError) as exc:
        raise _s3_error(exc, bucket, key) from None
    return Fetched(path=dest, filename=filename,
                   record={"uri": uri, "sha256": digest, "size": size, "etag": str(head["ETag"]).strip('"')})


def _fetch_s3_folder(client: Any, bucket: str, prefix: str, ctx: FetchContext) -> Fetched:
    """A prefix as a folder: every object under it, sized by the listing first (refused early), then fetched
    through target_path (a key that climbs out is refused) and packed as a .tar."""
    max_entries = int(settings.ARCHIVE_MAX_ENTRIES)
    objects: list[tuple[str, int]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):]
            if not relative or relative.endswith("/"):
                continue  # the folder markers some tools write
            objects.append((relative, int(item["Size"])))
            if len(objects) > max_entries:
                raise SourceRefused(f"s3://{bucket}/{prefix} holds more than {max_entries} objects "
                                    "(ARCHIVE_MAX_ENTRIES).")
    if not objects:
        raise SourceRefused(f"s3://{bucket}/{prefix} was not found, or holds no objects the operator's credentials "
                            "may read.")
    total = sum(size for _, size in objects)
    if total > ctx.max_bytes:
        raise SourceRefused(f"s3://{bucket}/{prefix} holds {total} bytes, more than your team's quota or the "
                            f"largest upload allows ({ctx.max_bytes}).")
    ctx.progress(0, total)
    # The folder's last segment names the tar ("v1/" -> "v1.tar"); a key is any text S3 accepts ("../", a
    # backslash), so the name goes through target_path like every other remote name.
    name = _filename(prefix, "model")
    tree = target_path(Path(tempfile.mkdtemp(prefix="tree-", dir=ctx.workdir)), name)
    tree.mkdir()
    hashes: dict[str, str] = {}
    done = 0
    for relative, _size in objects:
        dest = target_path(tree, relative)
        body = client.get_object(Bucket=bucket, Key=prefix + relative)["Body"]
        try:
            written, digest = copy_counted(_bounded(body, ctx.max_bytes, ctx, done), dest, ctx, done, total)
        finally:
            body.close()
        done += written
        hashes[relative] = digest
    tar = target_path(ctx.workdir, f"{name}.tar")
    pack_tree(tree, tar, max_entries=max_entries, max_total_size=int(settings.ARCHIVE_MAX_TOTAL_SIZE))
    return Fetched(path=tar, filename=f"{name}.tar",
                   record={"uri": f"s3://{bucket}/{prefix}", "size": done, "files": hashes})
