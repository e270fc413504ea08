"""The serving benchmark's endpoints: every server it can measure, in the tables' order, their titles, and which
Modelport deployment and format an endpoint's name stands for."""

from __future__ import annotations

from bench.serving import peers
from bench.serving.workloads import FORMATS

# Every endpoint, in the tables' order. "-json": the same deployment sent KServe v2 JSON (what a user's curl
# sends) instead of the binary tensor extension; not for digits, whose PNG request JSON cannot carry as it is.
# "e-<format>-…": the CNN (workload 2) in another format (workloads.FORMATS), configuration e's settings.
FORMAT_SERVERS = tuple(f"e-{fmt}-{via}" for fmt in FORMATS for via in ("gateway", "direct"))
SERVERS = ("a", "b", *peers.PEERS, "c-gateway", "c-direct", "d-gateway", "d-direct", "e-gateway", "e-gateway-json",
           "e-direct", *FORMAT_SERVERS)
# --peers-only: the peers against Modelport's e, through the gateway (JSON and binary) and direct.
PEER_COMPARISON = (*peers.PEERS, "e-gateway", "e-gateway-json", "e-direct")
SERVER_NAMES = {
    "a": "a. Tornado + onnxruntime", "b": "b. ThreadingHTTPServer + onnxruntime",
    "c": "c. Modelport, no batching, 1 instance", "d": "d. Modelport, dynamic batching, 1 instance",
    "e": "e. Modelport, dynamic batching, 2 instances", **peers.TITLES,
}


def modelport_endpoint(server: str) -> tuple[str, str | None] | None:
    """(deployment key, format) of a Modelport endpoint, None for any other server: "d-direct" -> ("d", None),
    "e-gateway-json" -> ("e", None), "e-torchscript-gateway" -> ("e-torchscript", "torchscript")."""
    if server[:2] not in ("c-", "d-", "e-"):
        return None
    fmt = server.split("-")[1]
    return (f"{server[0]}-{fmt}", fmt) if fmt in FORMATS else (server[0], None)
