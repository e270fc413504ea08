"""The local runtime's Tritons' own Prometheus metrics, relayed by the portal's /metrics (issue 34): each running
local Triton listens on a metrics port of 127.0.0.1 that only this machine reaches, so a Prometheus scraping the
portal gets them here, labelled as a cluster's scrape config labels its pods' series
(platform/observability/prometheus/prometheus-scrape.yml). Read at scrape time, each server within a short timeout:
one that does not answer, or answers too slowly, is left out of that scrape (or cut), never delays it past the bound.

A dedicated Triton serves one revision: every sample gets its team, deployment and revision. A pool's Triton holds
several teams' models, each loaded under its revision's pool name (deployments/pool_names.py): its samples are split
by their `model` label, a revision's pool name getting that revision's team, deployment and revision (and its model
label the model's own name), a name no load of the pool knows dropped, never guessed at; samples without a model
label (the server's memory, its pinned memory pool) are the pool's, with a `pool` label and no team.

The text is untrusted (a python model can add custom metrics to its Triton's): each sample is parsed here and passed
on only whole, never with a label this relay sets, so that one server's text can neither break the scrape of every
team (Prometheus refuses a whole scrape over a broken line or a label given twice) nor speak for another team, nor
pass for the portal's own figures: a sample or family under the portal's own names (modelport_..., OWN_PREFIX) is
dropped, so that a model's custom metric cannot say, for example, that another team's model is loaded in its pool
(modelport_pool_model_info, which the rules join a cluster pool's series on). (A custom metric could still name
another revision's pool name as its model; but code a team uploaded runs only in its own pool, whose loads are all
that team's: deployments/pools.py.)

On a cluster there is nothing to relay (no TritonServer or PoolServer rows): Prometheus scrapes each Triton pod."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from deployments import pool_names
from deployments.models import PoolLoad, PoolServer, TritonServer

FETCH_TIMEOUT_SECONDS = 1.0
TOTAL_SECONDS = 3.0  # all servers together: a scrape's answer never waits longer for Tritons
MAX_BYTES = 4 * 1024 * 1024  # one Triton's exposition (a few KiB per model)
READ_CHUNK_BYTES = 64 * 1024
MAX_HEAD_BYTES = 16 * 1024  # the answer's status line and headers
MAX_LABELS = 16  # Triton's own samples have at most 3 (model, version, gpu_uuid)
MAX_LABEL_VALUE = 256
OWN_LABELS = frozenset({"team", "deployment", "revision", "pool"})  # set by this relay, never taken from a server
OWN_PREFIX = "modelport_"  # the portal's own metric names (deployments/portal_metrics.py, gateway/metrics.py)


@dataclass(frozen=True)
class Target:
    """A dedicated Triton: all its samples are one revision's."""

    team: str
    deployment: str
    revision: int
    url: str  # its /metrics


@dataclass(frozen=True)
class PooledRevision:
    """A revision with a load in a pool: whose its models are there."""

    team: str
    deployment: str
    revision: int
    models: frozenset[str]  # the models' own names


@dataclass(frozen=True)
class PoolTarget:
    """A pool's Triton: its samples are split by model among the revisions loaded in it (by their pool prefix)."""

    pool: str
    url: str
    revisions: Mapping[str, PooledRevision]  # by pool_names.name_prefix


def targets() -> list[Target | PoolTarget]:
    """The running local Tritons: the dedicated ones, then the pools'."""
    servers = (TritonServer.objects.filter(state=TritonServer.State.READY)
               .select_related("deployment__team", "revision").order_by("pk"))
    found: list[Target | PoolTarget] = [
        Target(server.deployment.team.name, server.deployment.name, server.revision.number,
               f"http://127.0.0.1:{server.metrics_port}/metrics") for server in servers]
    pools = list(PoolServer.objects.filter(state=PoolServer.State.RUNNING).select_related("pool").order_by("pk"))
    if not pools:
        return found
    revisions: dict[int, dict[str, PooledRevision]] = {}
    # Every load of the pool, whatever its state: an unloaded or failed revision's models may still have samples.
    for load in (PoolLoad.objects.filter(pool_id__in={server.pool_id for server in pools})
                 .select_related("deployment__team", "revision")):
        prefix = pool_names.name_prefix(load.deployment_id, load.revision.number)
        revisions.setdefault(load.pool_id, {})[prefix] = PooledRevision(
            load.deployment.team.name, load.deployment.name, load.revision.number,
            frozenset(load.revision.spec.model_names))
    found += [PoolTarget(server.pool.name, f"http://127.0.0.1:{server.metrics_port}/metrics",
                         revisions.get(server.pool_id, {})) for server in pools]
    return found


def fetch(url: str, timeout: float) -> str:
    """The server's text, read within `timeout` in all (the connection, the head and the body; urllib's timeout is
    each read's, which a trickling answer stretches without end) and MAX_BYTES: an answer cut short loses its last,
    partial line. HTTP/1.0 over a plain socket, so that nothing but this loop waits on the server."""
    until = time.monotonic() + timeout
    parts = urllib.parse.urlsplit(url)
    data = bytearray()
    cut = True
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=timeout) as sock:
        sock.sendall(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode("ascii"))
        while len(data) < MAX_BYTES + MAX_HEAD_BYTES:
            left = until - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                chunk = sock.recv(min(READ_CHUNK_BYTES, MAX_BYTES + MAX_HEAD_BYTES - len(data)))
            except TimeoutError:
                break
            if not chunk:
                cut = False
                break
            data += chunk
    head, found, body = bytes(data).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(None, 2)
    if not found or len(status) < 2 or status[1] != b"200" or b"transfer-encoding" in head.lower():
        raise ValueError(f"{url}: no whole answer with 200 within {timeout:g} s")
    body = body[:MAX_BYTES]
    if cut or len(body) == MAX_BYTES:
        body = body[:body.rfind(b"\n") + 1]
    return body.decode("utf-8", "replace")


def exposition(found: Iterable[Target | PoolTarget], read: Callable[[str, float], str] | None = None) -> bytes:
    """The Prometheus text of every target's metrics, relabelled, one family per metric name (its HELP and TYPE
    once, whichever servers hold it). Done on the text, not through prometheus_client, whose writer renames a
    counter's samples to ..._total: Triton's names stay as Triton gives them, so that the rules read the same names
    here as from a Triton pod on a cluster."""
    read = read or fetch
    families: dict[str, _Family] = {}
    deadline = time.monotonic() + TOTAL_SECONDS
    for target in found:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            text = read(target.url, min(FETCH_TIMEOUT_SECONDS, left))
        except (OSError, ValueError):
            continue  # stopped meanwhile: left out of this scrape
        _add(families, text, _dedicated(target) if isinstance(target, Target) else _pooled(target))
    lines = [line for family in families.values() for line in (*family.head, *family.samples)]
    return "".join(line + "\n" for line in lines).encode()


Labels = list[tuple[str, str]]
Relabel = Callable[[Labels], Labels | None]  # a sample's labels as the relay passes them on, or None: dropped


def _dedicated(target: Target) -> Relabel:
    own = [("team", target.team), ("deployment", target.deployment), ("revision", str(target.revision))]
    return lambda labels: own + labels


def _pooled(target: PoolTarget) -> Relabel:
    def relabel(labels: Labels) -> Labels | None:
        model = next((value for name, value in labels if name == "model"), None)
        if model is None:
            return [("pool", target.pool), *labels]  # the server's own: the pool's, no team's
        prefix = pool_names.prefix_of(model)
        revision = target.revisions.get(prefix) if prefix is not None else None
        if prefix is None or revision is None:
            return None  # no revision the portal knows in this pool
        name = pool_names.own_name(model, prefix)
        if name not in revision.models:
            return None
        return [("team", revision.team), ("deployment", revision.deployment), ("revision", str(revision.revision)),
                ("pool", target.pool), *((key, name if key == "model" else value) for key, value in labels)]

    return relabel


@dataclass
class _Family:
    head: list[str] = field(default_factory=list)  # its HELP and TYPE lines
    samples: list[str] = field(default_factory=list)


def _add(families: dict[str, _Family], text: str, relabel: Relabel) -> None:
    current: _Family | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(OWN_PREFIX):
                current = None  # its samples are dropped; what follows is not passed on as theirs
                continue
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _NAME.fullmatch(parts[2]):
                current = families.get(parts[2])
                if current is None:
                    current = families[parts[2]] = _Family()
                # One HELP and one TYPE (the first server's), a TYPE only of a type Prometheus knows.
                if parts[1] == "HELP" and not any(head.startswith("# HELP") for head in current.head):
                    current.head.append(line)
                if (parts[1] == "TYPE" and len(parts) == 4 and parts[3] in _TYPES
                        and not any(head.startswith("# TYPE") for head in current.head)):
                    current.head.append(line)
            continue
        sample = _parse(line)
        if sample is None:
            continue  # not a sample line: dropped rather than passed on broken
        name, labels, rest = sample
        relabelled = relabel(labels)
        if relabelled is None:
            continue
        family = current if current is not None else families.setdefault(name, _Family())
        inner = ",".join(f'{key}="{_escape(value)}"' for key, value in relabelled)
        family.samples.append(f"{name}{{{inner}}} {rest}")


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,?)')
_REST = re.compile(r"\s+(\S+)(?:\s+(-?[0-9]{1,19}))?\s*")
_UNESCAPE = re.compile(r"\\(.)")
_VALUE = re.compile(r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|Inf|NaN)")
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def _parse(line: str) -> tuple[str, Labels, str] | None:
    """A sample line as (name, labels, value and timestamp), or None for anything but a whole valid sample, or one
    that names a label this relay sets, or one with too many or too long labels."""
    head = _NAME.match(line)
    if head is None or head.group(0).startswith(OWN_PREFIX):
        return None
    labels: Labels = []
    at = head.end()
    if line.startswith("{", at):
        at += 1
        while not line.startswith("}", at):
            label = _LABEL.match(line, at)
            if label is None or len(labels) >= MAX_LABELS or len(label.group(2)) > MAX_LABEL_VALUE:
                return None
            labels.append((label.group(1), _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1),
                                                         label.group(2))))
            at = label.end()
            if not label.group(3) and not line.startswith("}", at):
                return None
        at += 1
    rest = _REST.fullmatch(line, at)
    if rest is None or not _VALUE.fullmatch(rest.group(1)):
        return None
    names = [name for name, _ in labels]
    if OWN_LABELS.intersection(names) or len(set(names)) != len(names):
        return None
    return head.group(0), labels, " ".join(part for part in rest.groups() if part is not None)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
