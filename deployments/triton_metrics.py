"""The local runtime's Tritons' own Prometheus metrics, relayed by the portal's /metrics (issue 34): each running
dedicated Triton listens on a metrics port of 127.0.0.1 that only this machine reaches, so a Prometheus scraping the
portal gets them here, labelled team, deployment and revision as a cluster's scrape config labels its pods' series
(platform/observability/prometheus/prometheus-scrape.yml). Read at scrape time, each server within a short timeout:
one that does not answer is left out of that scrape, never delays it past the bound. Pools' Tritons hold several
teams' models and are not relayed yet.

On a cluster there is nothing to relay (no TritonServer rows): Prometheus scrapes each Triton pod itself."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deployments.models import TritonServer

FETCH_TIMEOUT_SECONDS = 1.0
TOTAL_SECONDS = 3.0  # all servers together: a scrape's answer never waits longer for Tritons
MAX_BYTES = 4 * 1024 * 1024  # one Triton's exposition (a few KiB per model)


@dataclass(frozen=True)
class Target:
    team: str
    deployment: str
    revision: int
    url: str  # its /metrics


def targets() -> list[Target]:
    """The running dedicated local Tritons."""
    servers = (TritonServer.objects.filter(state=TritonServer.State.READY)
               .select_related("deployment__team", "revision").order_by("pk"))
    return [Target(server.deployment.team.name, server.deployment.name, server.revision.number,
                   f"http://127.0.0.1:{server.metrics_port}/metrics") for server in servers]


def fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (127.0.0.1 and a port from our row)
        return str(response.read(MAX_BYTES).decode("utf-8", "replace"))


def exposition(found: Iterable[Target], read: Callable[[str, float], str] | None = None) -> bytes:
    """The Prometheus text of every target's metrics, each sample with its team, deployment and revision added, one
    family per metric name (its HELP and TYPE once, whichever servers hold it). Done on the text, not through
    prometheus_client, whose writer renames a counter's samples to ..._total: Triton's names stay as Triton gives
    them, so that the rules read the same names here as from a Triton pod on a cluster."""
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
        extra = ",".join(f'{name}="{_escape(value)}"' for name, value in (
            ("team", target.team), ("deployment", target.deployment), ("revision", str(target.revision))))
        _add(families, text, extra)
    lines = [line for family in families.values() for line in (*family.head, *family.samples)]
    return "".join(line + "\n" for line in lines).encode()


@dataclass
class _Family:
    head: list[str] = field(default_factory=list)  # its HELP and TYPE lines
    samples: list[str] = field(default_factory=list)


def _add(families: dict[str, _Family], text: str, extra: str) -> None:
    current: _Family | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = families.get(parts[2])
                if current is None:
                    current = families[parts[2]] = _Family()
                if len(current.head) < 2 and line not in current.head:
                    current.head.append(line)
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue  # not a sample line: dropped rather than passed on broken
        name, rest = match.group(1), line[match.end():]
        family = current if current is not None else families.setdefault(name, _Family())
        if rest.startswith("{"):
            inner = rest[1:]
            family.samples.append(f"{name}{{{extra}{'' if inner.startswith('}') else ','}{inner}")
        else:
            family.samples.append(f"{name}{{{extra}}}{rest}")


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?=[{ ])")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
