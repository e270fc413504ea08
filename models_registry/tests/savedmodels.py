"""SavedModels written from their signatures, for the inspection and deployment tests (a fixture module: nothing here is
collected)."""

from __future__ import annotations

from typing import Any

from modelport.core.formats.savedmodel_inspect import (
    SavedModelProto,
)


def saved_model(signatures: dict[str, dict[str, dict[str, Any]]], tags: tuple[str, ...] = ("serve",)) -> bytes:
    """A SavedModel holding one MetaGraph with `signatures`: {key: {"inputs": {name: tensor}, "outputs": ...}},
    each tensor {"dtype": enum number, "dims": [...]} plus optional "unknown_rank"/"sparse"."""
    message = SavedModelProto(saved_model_schema_version=1)
    graph = message.meta_graphs.add()
    graph.meta_info_def.tags.extend(tags)
    for key, parts in signatures.items():
        signature = graph.signature_def[key]
        for kind in ("inputs", "outputs"):
            for name, spec in parts.get(kind, {}).items():
                info = getattr(signature, kind)[name]
                if spec.get("sparse"):
                    info.coo_sparse = b"\x0a\x01v"
                else:
                    info.name = f"{name}:0"
                dtype = spec.get("dtype", 1)
                if dtype < 64:
                    info.dtype = dtype
                else:  # a number TensorFlow's enum may gain later: written as the raw varint field 2
                    info.MergeFromString(b"\x10" + varint(dtype))
                if spec.get("unknown_rank"):
                    info.tensor_shape.unknown_rank = True
                else:
                    for size in spec.get("dims", [-1]):
                        info.tensor_shape.dim.add(size=size)
    return bytes(message.SerializeToString())


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
