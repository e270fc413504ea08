"""The plain version of the JSON fast path (gateway/fastpath/): the checks of an inference request's JSON done the
obvious way, with the same answers and messages. The property tests take it as the oracle (gateway/tests/
test_infer_body.py, test_json_body.py), and with GATEWAY_JSON_FAST_PATH=false the gateway checks requests with it.

- depth: every JSON string blanked by a regex, the brackets left turned into +1 / -1, their running sum. A step per
  string (about 2 us each): a body of millions of short strings costs seconds here, milliseconds in depth.py;
- the request: json.loads (UTF-8, a byte-order mark allowed) and gateway/protocol.py's checks on its Python values;
- nothing transcoded: the body goes to Triton as it was sent.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gateway import protocol
from gateway.contract import requested_outputs
from gateway.fastpath.depth import _DEPTH_STEP, _JSON_STRING, _NOT_BRACKETS
from gateway.fastpath.json_body import Checked
from gateway.protocol import Refusal


def depth_steps(data: bytes) -> bytes:
    """The brackets' +1 / -1 (as int8 bytes) outside strings: strings blanked, the rest dropped."""
    return _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS).translate(_DEPTH_STEP)


def too_deep(data: bytes, limit: int) -> bool:
    """Whether `data` nests deeper than `limit`, or its brackets outside strings do not balance. With no more '['
    and '{' than `limit` in it, strings and all, it cannot nest deeper, and unbalanced brackets are left to the
    parser to refuse (with its own message): as depth.json_too_deep decides."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = np.cumsum(np.frombuffer(depth_steps(data), dtype=np.int8), dtype=np.int64)
    return bool(len(depth)) and bool(depth.max() > limit or depth.min() < 0 or depth[-1] != 0)


def refuse_duplicate_keys_in(data: bytes) -> None:
    """A key given twice in one object is refused: json.loads keeps the last, Triton reads the first (an output's
    'parameters', an input's binary_data_size). Written apart from json_body.py's tape walk, as an oracle should be;
    the message is the same (gateway/tests/test_json_fast_path_switch.py compares the answers)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                raise Refusal(400, f"The request JSON gives the key {key[:100]!r} twice in one object; "
                                   "send each key once.")
            seen[key] = value
        return seen

    json.loads(data, object_pairs_hook=pairs)


def read_json(data: bytes, max_depth: int) -> Any:
    """The request's JSON as Python values (gateway/protocol.py's parse_json_header, with the plain depth check)."""
    if too_deep(data, max_depth):
        raise Refusal(400, f"The request JSON nests deeper than {max_depth} levels (or its brackets do not match).")
    try:
        # UTF-8 only (no guess of UTF-16 or UTF-32, which the depth check does not read): parse_json_header's reason.
        return json.loads(data.decode("utf-8-sig", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise Refusal(400, f"The request body is not valid JSON: {exc}.") from None


def check_json(data: bytes, binary_length: int | None, max_depth: int, max_tensor_bytes: int,
               transcode: bool = False) -> Checked:
    """gateway/fastpath/json_body.py's check_json done plainly (the same arguments; `transcode` is taken and never
    acted on: the body is forwarded as sent)."""
    request = read_json(data, max_depth)
    refuse_duplicate_keys_in(data)
    protocol.check_infer_request(request, binary_length, max_tensor_bytes)
    for tensor in request["inputs"]:
        data_ = tensor.get("data")
        if tensor["datatype"] in protocol.NUMBER_DATATYPES and data_ is not None:
            protocol.check_numbers(tensor["name"], tensor["datatype"], data_, (list,))
    return Checked(outputs=requested_outputs(request))
