"""A shared deployment's model names through the gateway (issue 24): in a pool's Triton its models are loaded as
`d<deployment>-r<revision>-<model>`; callers use the model's own name. Requests are mapped to the pool's name, and
answers back (`model_name` of an inference, `name` of metadata and config, a config's ensemble steps, statistics),
so that a caller sees what a dedicated deployment shows and nothing of the pool's other models.

Plain functions over bytes: the HTTP gateway (gateway/app.py) and the gRPC one call them. The names themselves, how
they are made and taken off, are deployments/pool_names.py's (the runtimes' pools load the models under them); here
is only where they sit in Triton's answers, over HTTP and gRPC.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployments import pool_names
from gateway import grpc_protocol
from gateway.protocol import Endpoint

# How far into an inference answer its model_name is looked for. Triton writes `{"id":...,"model_name":...` first,
# with no spaces (http_server.cc); only a request id the caller chose longer than this pushes it further, and then
# the caller sees its own deployment's pool name, nothing of another's.
HEAD_SCAN_BYTES = 64 * 1024
_INFER_HEAD = re.compile(rb'\A\{(?:"id":"(?:[^"\\]|\\.)*",)?"model_name":"')


@dataclass(frozen=True)
class Pooled:
    """A revision served from a pool: the prefix of its names there, its load (deployments.PoolLoad) and state.
    Whether a revision is pooled comes from its spec, never from the rows: `load_id` is None while it has no load
    (the gateway then answers 503, never passes the request on unmapped)."""

    revision: int
    prefix: str
    load_id: int | None
    loaded: bool
    idle: bool = False  # unloaded for being idle: a request loads it again (gateway/cold_start.py)
    models: frozenset[str] = frozenset()  # the revision's own model names


def ready_names(pooled: Pooled) -> list[str]:
    """The pool's names of the revision's models, whose readiness is the deployment's (never the pool server's,
    which speaks for every team's models)."""
    return sorted(pooled.prefix + model for model in pooled.models)


def ready_answer(pooled: Pooled, models_ready: list[bool]) -> bool:
    """A shared deployment's readiness: every model of its revision ready in the pool, or idle (unloaded for being
    unused: ready, for any request is held while it loads again, POOL_COLD_START_WAIT_SECONDS). Loading (a first
    load, a restart) or failed is not ready."""
    if pooled.idle:
        return True
    return pooled.loaded and bool(models_ready) and all(models_ready)


def upstream_target(rest: bytes, endpoint: Endpoint, prefix: str) -> bytes:
    """`v2/models/<model>/...` (the path after /serve/NAME/) with the pool's name of the model."""
    if not endpoint.model:
        return rest
    head = b"v2/models/"
    model = endpoint.model.encode("ascii")
    if not rest.startswith(head + model):
        return rest
    return head + prefix.encode("ascii") + rest[len(head):]


def rename_head(head: bytes, prefix: str, header_length: int | None = None) -> tuple[bytes, int]:
    """The first bytes of an inference answer with the pool's prefix taken off its model_name, and how many bytes
    that removed (0: not found, the bytes as they were). Never parses the answer: outputs of any size stream on."""
    match = _INFER_HEAD.match(head[:HEAD_SCAN_BYTES])
    wanted = prefix.encode("ascii")
    if match is None or head[match.end():match.end() + len(wanted)] != wanted:
        return head, 0
    if header_length is not None and match.end() + len(wanted) > header_length:
        return head, 0  # not inside the JSON header: binary bytes that happen to look alike
    return head[:match.end()] + head[match.end() + len(wanted):], len(wanted)


def rewrite_response(endpoint: Endpoint, body: bytes, header_length: int | None,
                     prefix: str) -> tuple[bytes, int | None]:
    """Triton's answer with the user's names: (body, the new Inference-Header-Content-Length or None). For the
    small answers only (errors, metadata, config, statistics): it parses the JSON; inference answers are renamed
    by rename_head."""
    if not body:
        return body, header_length
    json_part, binary = (body[:header_length], body[header_length:]) if header_length is not None else (body, b"")
    try:
        data = json.loads(json_part)
    except ValueError:
        return body, header_length
    data = _renamed(endpoint, data, prefix)
    out = json.dumps(data, separators=(",", ":")).encode()
    if header_length is None:
        return out, None
    return out + binary, len(out)


def _strip(name: Any, prefix: str) -> Any:
    return pool_names.own_name(name, prefix) if isinstance(name, str) else name


def _renamed(endpoint: Endpoint, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        return data
    if isinstance(data.get("error"), str):
        data["error"] = pool_names.without_names(data["error"], prefix)
    if endpoint.kind in ("infer", "generate", "generate_stream") and "model_name" in data:
        data["model_name"] = _strip(data["model_name"], prefix)
    if endpoint.kind in ("model", "config") and "name" in data:
        data["name"] = _strip(data["name"], prefix)
        scheduling = data.get("ensemble_scheduling")
        if isinstance(scheduling, dict):
            for step in scheduling.get("step", []) or []:
                if isinstance(step, dict) and "model_name" in step:
                    step["model_name"] = _strip(step["model_name"], prefix)
    if endpoint.kind == "stats" and isinstance(data.get("model_stats"), list):
        # The server-wide statistics list every model in the pool: only this revision's remain.
        data["model_stats"] = [dict(row, name=_strip(row.get("name"), prefix)) for row in data["model_stats"]
                               if isinstance(row, dict) and str(row.get("name", "")).startswith(prefix)]
    return data


# --- gRPC (gateway/grpc_app.py): the same mapping over protobuf messages, field by field ---------------------------
# Field numbers of Triton's grpc_service.proto and model_config.proto: every message below names its model in field 1
# (ModelInferRequest/Response.model_name, ModelReady/Metadata/Config/StatisticsRequest.name,
# ModelMetadataResponse.name, ModelConfig.name, ModelStatistics.name, ModelEnsembling.Step.model_name);
# ModelConfigResponse.config and ModelStatisticsResponse.model_stats are field 1, ModelConfig.ensemble_scheduling is
# field 15 with its steps in field 1, ModelStreamInferResponse carries error_message in 1 and infer_response in 2.
_ENSEMBLE_SCHEDULING = 15


def grpc_request(request: bytes, prefix: str) -> bytes:
    """A request naming a model (inference, ready, metadata, config, statistics) with the pool's name of it. An
    empty name (the statistics of every model) stays empty: the answer is filtered instead."""
    return grpc_protocol.rewrite_fields(request, {1: lambda name: prefix.encode() + name if name else name})


def grpc_ready_request(name: str) -> bytes:
    """ModelReadyRequest{name} (field 1), for a shared deployment's ServerReady (ready_answer)."""
    data = name.encode()
    length, size = b"", len(data)
    while size > 0x7F:
        length, size = length + bytes([0x80 | (size & 0x7F)]), size >> 7
    return b"\x0a" + length + bytes([size]) + data


def grpc_response(kind: str, response: bytes, prefix: str) -> bytes:
    """Triton's answer to a method of `kind` (grpc_protocol.METHODS) with the user's names."""
    strip = _stripper(prefix)
    if kind in ("infer", "model"):
        return grpc_protocol.rewrite_fields(response, {1: strip})
    if kind == "config":
        return grpc_protocol.rewrite_fields(response, {1: lambda config: _config(config, strip)})
    if kind == "stats":
        # The statistics of every model list the pool's: only this revision's remain.
        keep = prefix.encode()

        def row(stats: bytes) -> bytes | None:
            name = _string_field(stats, 1)
            return grpc_protocol.rewrite_fields(stats, {1: strip}) if name.startswith(keep) else None

        return grpc_protocol.rewrite_fields(response, {1: row})
    return response


def grpc_stream_response(response: bytes, deployment_id: int) -> bytes:
    """A ModelStreamInferResponse from the pool: one stream may carry the serving and the canary revision's
    answers (both in the same Triton), so any of this deployment's revision prefixes is taken off."""
    pattern = pool_names.any_revision(deployment_id)

    def strip(name: bytes) -> bytes:
        return pattern.sub(b"", name, count=1) if pattern.match(name) else name

    return grpc_protocol.rewrite_fields(response, {
        1: lambda error: pattern.sub(b"", error),
        2: lambda answer: grpc_protocol.rewrite_fields(answer, {1: strip}),
    })


def grpc_message(details: str, prefix: str) -> str:
    """Triton's error message with the user's names."""
    return pool_names.without_names(details, prefix)


def _stripper(prefix: str) -> Callable[[bytes], bytes]:
    head = prefix.encode()
    return lambda name: name.removeprefix(head)


def _config(config: bytes, strip: Callable[[bytes], bytes]) -> bytes:
    steps = {1: lambda step: grpc_protocol.rewrite_fields(step, {1: strip})}
    return grpc_protocol.rewrite_fields(config, {
        1: strip, _ENSEMBLE_SCHEDULING: lambda scheduling: grpc_protocol.rewrite_fields(scheduling, steps)})


def _string_field(message: bytes, number: int) -> bytes:
    """The last payload of LEN field `number` (protobuf's rule for a field given twice), b"" when absent."""
    found: list[bytes] = []

    def keep(payload: bytes) -> bytes:
        found.append(payload)
        return payload

    grpc_protocol.rewrite_fields(message, {number: keep})
    return found[-1] if found else b""
