"""Issue 23's proof that the JSON fast path changes no answer: every request of the nasty corpus that the gateway lets
through, the samples' requests, and a request per datatype (BYTES, BOOL, the INT and UINT types, FP16, BF16, FP32,
FP64, with hostile numbers) and requests mixing JSON and binary tensors, sent once through the gateway (transcoding
on, gateway/fastpath/json_body.py) and once straight to the same Triton. Same status, same Content-Type, and the same
JSON: the same keys in the same order, numbers that parse to the same values, binary parts byte for byte.

One real Triton (the runtime env's), started once for the module with the digits and CNN samples rendered as the
portal renders them and an echo model that returns each input it gets; the gateway is the real ASGI app in this
process, with the real access checks on the test database (gateway/tests/conftest.py), in front of that Triton.
What is expected of an error is Triton's answer as the gateway documents passing it on: protocol.client_error
(a parse failure is the client's 400, not a 500) applied to the direct answer. Two refusals are the gateway's own
words for what Triton refuses in its own (own_refusal): a model the deployment does not serve, and data of a number
datatype holding something else; Triton must refuse each of them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator
from decimal import Decimal, getcontext
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from deployments.render import render_repository
from deployments.runtimes.local import backends, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import RepositorySpec, ServedModel
from gateway import contract as contracts
from gateway import protocol
from gateway.protocol import Refusal
from gateway.tests.infer_bodies import OK, j
from modelport.core.runtime_env import find_runtime_env
from tests.nasty_inputs import PASSED_TO_TRITON
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_ENV = Path(os.environ.get("MODELPORT_RUNTIME_ENV", str(REPO_ROOT / "var" / "runtime-env")))

# Every KServe v2 datatype, each an optional input of the echo model.
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "BYTES")

ECHO_MODEL_PY = f"""import triton_python_backend_utils as pb_utils

NAMES = {[d.lower() for d in DATATYPES]!r}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    continue
                if name == "bytes":
                    outputs.append(pb_utils.Tensor(name + "_out", tensor.as_numpy()))
                else:  # dlpack, since numpy has no bfloat16
                    outputs.append(pb_utils.Tensor.from_dlpack(name + "_out", tensor.to_dlpack()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def echo_config() -> str:
    tensors = [(d.lower(), d if d != "BYTES" else "STRING") for d in DATATYPES]
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ -1, -1 ] optional: true }}' for n, t in tensors)
    outputs = ",\n".join(f'  {{ name: "{n}_out" data_type: TYPE_{t} dims: [ -1, -1 ] }}' for n, t in tensors)
    return (f'name: "echo"\nbackend: "python"\nmax_batch_size: 0\ninput [\n{inputs}\n]\noutput [\n{outputs}\n]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n')


@pytest.fixture(scope="module")
def identity_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lt.ServerProcess]:
    from models_registry.samples import make_digits_onnx, make_resnet_onnx

    if not RUNTIME_ENV.is_dir():
        pytest.skip(f"no runtime env at {RUNTIME_ENV}: create it from requirements-runtime.txt")
    env = find_runtime_env(RUNTIME_ENV)
    work = tmp_path_factory.mktemp("identity")
    digits, resnet = make_digits_onnx(work / "digits.onnx"), make_resnet_onnx(work / "resnet.onnx")
    spec = RepositorySpec(models=(
        ServedModel(name="digits", version=1, format="onnx", signature=digits.signature, max_batch_size=1024,
                    artifact_path=work / "digits.onnx"),
        ServedModel(name="resnet", version=1, format="onnx", signature=resnet.signature, max_batch_size=8,
                    artifact_path=work / "resnet.onnx"),
    ))
    render_repository(spec, "local", work / "repo")
    (work / "repo" / "echo" / "1").mkdir(parents=True)
    (work / "repo" / "echo" / "config.pbtxt").write_text(echo_config())
    (work / "repo" / "echo" / "1" / "model.py").write_text(ECHO_MODEL_PY)
    backend_dir = backends.build_backend_dir(env, work / "var")
    process = lt.start_server(work / "repo", work / "var" / "triton.log", env, backend_dir)
    try:
        ready = readiness.wait_ready(process, ["digits", "resnet", "echo"], timeout=120)
        assert ready.ready, f"{ready.message}\n{serverlog.tail_log(process.log_path, 60)}"
        yield process
    finally:
        lt.stop_server(process.pid, grace_seconds=10)


# --- The requests ---------------------------------------------------------------------------------------------


def echo(*tensors: dict[str, Any], **extra: Any) -> bytes:
    return j({"inputs": list(tensors), **extra})


def tensor(datatype: str, data: list[Any], shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    flat = np.asarray(data, dtype=object).size if data and isinstance(data[0], list) else len(data)
    return {"name": datatype.lower(), "datatype": datatype, "shape": shape or [1, flat], "data": data, **extra}


def binary_request(header: dict[str, Any], *parts: bytes) -> tuple[bytes, dict[str, str]]:
    raw = j(header)
    return raw + b"".join(parts), {"Inference-Header-Content-Length": str(len(raw)),
                                    "Content-Type": "application/octet-stream"}


# FP64 numbers where a parser could round differently from another: 17 digits, the shortest repr of odd doubles,
# subnormals, the largest double, the one that hung old parsers, more digits than a double holds, exponents.
HARD_DOUBLES = ("[0.1, 0.30000000000000004, 1.7976931348623157e308, 5e-324, 2.2250738585072011e-308, "
                "2.2250738585072012e-308, 4.9406564584124654e-324, 0.99999999999999994, 9007199254740993, "
                "12345678901234567890, 1.00000000000000011102230246251565404236316680908203125, "
                "1e-400, -0.0, 0, -1, 1E+2, 0.1e1, 3.4028235677973366e38, 3.4028236e38, 1.401298464324817e-45, "
                "7.0064923216240854e-46, 1.17549435e-38, 65504.00000000001, 2.5, -2.5, 0.5000000000000001]")
HARD_COUNT = HARD_DOUBLES.count(",") + 1
RNG = np.random.default_rng(23)
RANDOM_DOUBLES = [float(v) for v in RNG.standard_normal(256) * 10.0 ** RNG.integers(-30, 30, 256)]


# The nasty corpus's targets that the gateway itself refuses (gateway/protocol.py's classify, its own tests): what
# Triton would answer to them never reaches a client.
REFUSED_BY_THE_GATEWAY = {"version -1", "version 2**70", "a query string"}


def on_fp32_ties(count: int = 8) -> bytes:
    """FP32 data a hair above the midpoint between two floats, written with 60 digits: read correctly (simdjson,
    numpy) it rounds up; read as Triton's parser does (17 digits kept, then scaled by a power of ten) it may land on
    the midpoint itself and round to even, down. The gateway must leave such a tensor to Triton."""
    getcontext().prec = 200
    numbers = []
    for value in np.linspace(0.1, 3e5, count, dtype=np.float32):
        low = np.float32(value) if not int(np.float32(value).view(np.uint32)) & 1 else np.nextafter(
            np.float32(value), np.float32(np.inf))
        high = np.nextafter(low, np.float32(np.inf))
        midpoint = (float(low) + float(high)) / 2  # exact in a double
        above = Decimal(midpoint) + Decimal(np.spacing(midpoint)) / 2 + Decimal("1e-80")
        numbers.append(f"{above:.60E}")
    return (b'{"inputs": [{"name": "fp32", "datatype": "FP32", "shape": [1, %d], "data": [%s]}]}'
            % (count, ", ".join(numbers).encode()))


def hard(datatype: str) -> bytes:
    return (b'{"inputs": [{"name": "%s", "datatype": "%s", "shape": [1, %d], "data": %s}]}'
            % (datatype.lower().encode(), datatype.encode(), HARD_COUNT, HARD_DOUBLES.encode()))


def cases() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(name, path under /serve/<deployment>, body, headers)."""
    from models_registry.samples import digits_holdout, resnet_inputs

    rows, _ = digits_holdout()
    images = resnet_inputs(2)
    infer = "/v2/models/digits/infer"
    found: list[tuple[str, str, bytes, dict[str, str]]] = [
        (f"nasty: {name}", path, body, headers) for name, method, path, body, headers in PASSED_TO_TRITON
        if method == "POST" and name not in REFUSED_BY_THE_GATEWAY]
    found += [
        ("digits: the held-out rows", infer, j({"inputs": [{"name": "input", "shape": [16, 64], "datatype": "FP32",
                                                            "data": rows[:16].tolist()}]}), {}),
        ("digits: flat data, an id, outputs and classification", infer, j({
            "id": "req-1", "parameters": {"note": "x"},
            "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": rows[:2].ravel().tolist(),
                        "parameters": {"p": 1}}],
            "outputs": [{"name": "label"}, {"name": "probabilities", "parameters": {"classification": 3}}]}), {}),
        ("digits: a binary output asked for", infer,
         j({**OK, "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}), {}),
        ("digits: binary outputs for all", infer, j({**OK, "parameters": {"binary_data_output": True}}), {}),
        ("digits: numbers written as integers and exponents", infer,
         with_digits([0, 1, -3, 1e2, 2.5e-3, 16, 1e-320] * 9 + [0]), {}),
        ("digits: a string among the numbers", infer, with_digits(["1"] + [0.0] * 63), {}),
        ("digits: a null among the numbers", infer, with_digits([None] + [0.0] * 63), {}),
        ("digits: booleans as FP32", infer, with_digits([True] * 64), {}),
        ("digits: FP64 for FP32", infer, with_digits([0.5] * 64, datatype="FP64"), {}),
        ("digits: parameters null", infer, j({"inputs": [{**OK["inputs"][0], "parameters": None}]}), {}),
        ("resnet: two images, 4-D nested", "/v2/models/resnet/infer",
         j({"inputs": [{"name": "images", "shape": [2, 3, 64, 64], "datatype": "FP32", "data": images.tolist()}]}),
         {}),
        ("echo: FP64 hard numbers", "/v2/models/echo/infer", hard("FP64"), {}),
        ("echo: FP32 hard numbers", "/v2/models/echo/infer", hard("FP32"), {}),
        ("echo: FP32 a hair above rounding ties, in 60 digits", "/v2/models/echo/infer", on_fp32_ties(), {}),
        ("echo: FP64 an integer over 64 bits", "/v2/models/echo/infer",
         b'{"inputs": [{"name": "fp64", "datatype": "FP64", "shape": [1, 2], "data": [123456789012345678901234567890, '
         b'1]}]}',
         {}),
        ("echo: FP64 random over 60 decades", "/v2/models/echo/infer", echo(tensor("FP64", RANDOM_DOUBLES)), {}),
        ("echo: FP32 random over 60 decades", "/v2/models/echo/infer", echo(tensor("FP32", RANDOM_DOUBLES)), {}),
        ("echo: FP32 nested 2x3", "/v2/models/echo/infer",
         echo(tensor("FP32", [[1.5, 2, 3e38], [4e38, -1e-46, 6]], [2, 3])), {}),
        ("echo: FP16 as JSON", "/v2/models/echo/infer", hard("FP16"), {}),
        ("echo: BF16 as JSON", "/v2/models/echo/infer", hard("BF16"), {}),
        ("echo: FP32 and FP64 and INT64 together", "/v2/models/echo/infer",
         echo(tensor("FP32", [0.1, 0.2]), tensor("FP64", [0.1, 0.2]), tensor("INT64", [1, -2])), {}),
        ("echo: BYTES", "/v2/models/echo/infer",
         echo(tensor("BYTES", ["a", "", "\u00e9\u202e", "x" * 1000, "\x00"])), {}),
        ("echo: BYTES with a number", "/v2/models/echo/infer", echo(tensor("BYTES", [1, "a"])), {}),
        ("echo: BOOL", "/v2/models/echo/infer", echo(tensor("BOOL", [True, False, True])), {}),
        ("echo: BOOL as numbers", "/v2/models/echo/infer", echo(tensor("BOOL", [1, 0])), {}),
        ("echo: binary outputs of FP32", "/v2/models/echo/infer",
         echo(tensor("FP32", [0.1, 1e-45, 3.4e38]), outputs=[{"name": "fp32_out",
                                                               "parameters": {"binary_data": True}}]), {}),
    ]
    for datatype, bits, signed in [("INT8", 8, True), ("INT16", 16, True), ("INT32", 32, True), ("INT64", 64, True),
                                   ("UINT8", 8, False), ("UINT16", 16, False), ("UINT32", 32, False),
                                   ("UINT64", 64, False)]:
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        path = "/v2/models/echo/infer"
        found += [
            (f"echo: {datatype} at its limits", path, echo(tensor(datatype, [low, high, 0, 1, low + 1])), {}),
            (f"echo: {datatype} one past its limits", path, echo(tensor(datatype, [low - 1, high + 1])), {}),
            (f"echo: {datatype} given a fraction", path, echo(tensor(datatype, [1.5, 2])), {}),
            (f"echo: {datatype} given 2.0 and 1e2", path,
             b'{"inputs": [{"name": "%s", "datatype": "%s", "shape": [1, 2], "data": [2.0, 1e2]}]}'
             % (datatype.lower().encode(), datatype.encode()), {}),
            (f"echo: {datatype} given -0", path, echo(tensor(datatype, [0, -0]), id="z"), {}),
        ]
    # JSON and binary tensors in one request: the gateway checks them and sends them on as they came.
    half = np.array([[0.5, -2.0, 65504.0]], dtype=np.float16)
    body, headers = binary_request({"inputs": [
        {"name": "fp16", "datatype": "FP16", "shape": [1, 3], "parameters": {"binary_data_size": half.nbytes}},
        tensor("FP32", [0.1, 0.7]), tensor("BYTES", ["mixed"])]}, half.tobytes())
    found.append(("mixed: FP16 binary beside FP32 and BYTES JSON", "/v2/models/echo/infer", body, headers))
    bf16 = struct.pack("<3H", 0x3F80, 0xC000, 0x7F80)  # 1.0, -2.0, inf
    body, headers = binary_request({"inputs": [
        {"name": "bf16", "datatype": "BF16", "shape": [1, 3], "parameters": {"binary_data_size": len(bf16)}},
        tensor("INT32", [7, -7])], "outputs": [{"name": "bf16_out", "parameters": {"binary_data": True}},
                                                {"name": "int32_out"}]}, bf16)
    found.append(("mixed: BF16 binary beside INT32 JSON", "/v2/models/echo/infer", body, headers))
    floats = np.array([[0.25, 1e-40]], dtype=np.float32)
    body, headers = binary_request({"inputs": [
        tensor("FP64", [0.1, 1e-320]),
        {"name": "fp32", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": floats.nbytes}}]},
        floats.tobytes())
    found.append(("mixed: FP64 JSON beside FP32 binary", "/v2/models/echo/infer", body, headers))
    return found


def with_digits(data: list[Any], datatype: str = "FP32") -> bytes:
    return j({"inputs": [{"name": "input", "shape": [1, len(data)], "datatype": datatype, "data": data}]})


# --- Comparing ------------------------------------------------------------------------------------------------


def answer_form(status: int, headers: dict[str, str], body: bytes) -> tuple[Any, ...]:
    """What a client reads: the status, the Content-Type, and the JSON (keys in order, numbers as values, NaN and
    the infinities by name) with the binary part as bytes."""
    length = headers.get("inference-header-content-length")
    head, tail = (body[:int(length)], body[int(length):]) if length is not None else (body, b"")
    try:
        parsed: Any = json.loads(head, object_pairs_hook=list, parse_constant=lambda name: ("constant", name))
    except ValueError:
        parsed = ("not JSON", head)
    return status, headers.get("content-type"), length is not None, parsed, tail


def expected_from(status: int, headers: dict[str, str], body: bytes,
                  contract: contracts.Contract | None = None) -> tuple[Any, ...]:
    """Triton's direct answer as the gateway passes an inference error on (gateway/app.py: protocol.client_error,
    then the error told in the caller's words from the deployment's signature, gateway/contract.py)."""
    if status >= 400 and "content-encoding" not in headers:
        better = protocol.client_error(status, body)
        if better is not None:
            status, body = better
            headers = {**headers, "content-type": "application/json"}
        try:
            message = json.loads(body)["error"]
        except (ValueError, TypeError, KeyError):
            message = None
        if isinstance(message, str):
            status, message = contracts.reword(status, message, contract)
            body = json.dumps({"error": message}).encode()
            headers = {**headers, "content-type": "application/json"}
    return answer_form(status, headers, body)


def own_refusal(status: int, body: bytes) -> bool:
    """An answer in the gateway's own words to what Triton refuses in its own (issue 31): a model the deployment
    does not serve (gateway/not_found.py), data of a number datatype that holds no number (protocol.check_numbers)."""
    try:
        message = json.loads(body)["error"]
    except (ValueError, TypeError, KeyError):
        return False
    return isinstance(message, str) and (
        (status == 404 and " serves no model named " in message)
        or (status == 400 and "its 'data' must be JSON numbers" in message))


def test_answers_through_the_gateway_are_those_triton_gives_directly(
    identity_triton: lt.ServerProcess, people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_TRANSCODE_JSON = True
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024 * 1024
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 10_000
    settings.GATEWAY_RATE_LIMIT_BURST = 10_000
    alice = people["alice"]
    make_deployment(alice, "identity", f"http://{identity_triton.host}:{identity_triton.http_port}",
                    ("digits", "resnet", "echo"))
    from deployments.models import Deployment

    served = contracts.contracts_for(Deployment.objects.get(name="identity").revision.spec)
    corpus = cases()

    refused_here: set[str] = set()

    async def scenario() -> list[tuple[str, Any, Any]]:
        app = gateway_app()
        differences = []
        try:
            # Without aiohttp's own Accept-Encoding: Triton would gzip what the gateway's caller never asked to be.
            async with aiohttp.ClientSession(skip_auto_headers=["Accept-Encoding"]) as session:
                for name, path, body, extra in corpus:
                    headers = {"Content-Type": "application/json", **extra}
                    via = await call(app, "POST", "/serve/identity" + path, body=body, token=alice.token,
                                     headers=headers)
                    got = answer_form(via.status, {k.decode(): v.decode("latin-1") for k, v in via.headers.items()},
                                      via.body)
                    url = f"http://{identity_triton.host}:{identity_triton.http_port}{path}"
                    async with session.post(url, data=body, headers=headers) as response:
                        direct = await response.read()
                        model = path.split("/")[3] if path.startswith("/v2/models/") else ""
                        wanted = expected_from(response.status, {k.lower(): v for k, v in response.headers.items()},
                                               direct, served.get(model))
                    if own_refusal(via.status, via.body):
                        # Refused in the gateway's words where Triton has its own: Triton must refuse it too.
                        refused_here.add(name)
                        if response.status < 400:
                            differences.append((name, got[:4], wanted[:4]))
                        continue
                    if got != wanted:
                        differences.append((name, got[:4], wanted[:4]))
        finally:
            await app.close()
        return differences

    differences = run(scenario, timeout=240)
    assert differences == [], "\n\n".join(f"{n}\n  gateway: {str(g)[:600]}\n  direct:  {str(w)[:600]}"
                                          for n, g, w in differences)
    assert refused_here == {"nasty: a model that is not there", "nasty: an encoded slash in the model name",
                            "digits: a string among the numbers",
                            "digits: a null among the numbers", "digits: booleans as FP32"}
    # The corpus reached Triton's own judgement, not only the happy path: successes and Triton's errors both.
    assert len(corpus) > 80


def test_the_corpus_covers_every_datatype_and_the_transcoded_ones_are_transcoded() -> None:
    from gateway.fastpath.json_body import TRANSCODED, check_json

    corpus = cases()
    sent = {t["datatype"] for _, _, body, h in corpus if not h
            for t in json.loads(body).get("inputs", []) if isinstance(t, dict) and "datatype" in t}
    assert set(DATATYPES) <= sent
    transcoded = []
    for name, _path, body, headers in corpus:
        with contextlib.suppress(Refusal):
            if not headers and check_json(body, None, 64, 1 << 30, transcode=True).body is not None:
                transcoded.append(name)
    # The fast path was taken where it may be (so the comparison above covers it), and not where Triton's reading of
    # the text could differ from the correctly rounded one (gateway/fastpath/json_body.py, NEAR_ULPS).
    assert {"echo: FP32 random over 60 decades", "resnet: two images, 4-D nested", "digits: the held-out rows",
            "echo: FP32 nested 2x3", "nasty: numbers too big for FP32"} <= set(transcoded)
    assert not {"echo: FP32 a hair above rounding ties, in 60 digits", "echo: FP64 hard numbers",
                "echo: FP64 random over 60 decades"} & set(transcoded)
    assert set(TRANSCODED) <= sent
