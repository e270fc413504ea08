"""The gRPC gateway's front door over bytes (gateway/grpc_protocol.py): the method allowlist, the status mapping,
and the protobuf wire walk that reads an inference request's small fields, checked against protobuf's own parser."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway import grpc_protocol as gp
from gateway.protocol import Refusal

MB = 1024 * 1024


def request(shape: list[int], raw: bytes | None = None, datatype: str = "FP32", model: str = "digits",
            **fields: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, **fields)
    message.inputs.add(name="input", datatype=datatype, shape=shape)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


def refusal(data: bytes, max_tensor: int = 16 * MB) -> Refusal:
    with pytest.raises(Refusal) as raised:
        gp.scan_infer_request(data, max_tensor)
    return raised.value


# --- Methods and codes ---------------------------------------------------------------------------------------------


def test_the_inference_methods_are_allowed_and_every_other_method_of_tritons_service_is_refused() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        path = f"/inference.GRPCInferenceService/{method.name}"
        if method.name in gp.METHODS:
            assert gp.classify(path).kind == gp.METHODS[method.name]
        else:
            with pytest.raises(Refusal) as raised:
                gp.classify(path)
            assert raised.value.status == 403, method.name
            assert "ModelInfer" in raised.value.message  # it says what is served
    admin = {"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister",
             "CudaSharedMemoryRegister", "TraceSetting", "LogSettings"}
    assert admin <= {m.name for m in service.methods} and not admin & set(gp.METHODS)


def test_a_method_triton_may_add_later_and_other_services_are_refused() -> None:
    with pytest.raises(Refusal) as raised:
        gp.classify("/inference.GRPCInferenceService/ModelLoadEverything")
    assert raised.value.status == 403
    with pytest.raises(Refusal) as raised:
        gp.classify("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    assert raised.value.status == 501


def test_the_http_gateways_statuses_become_the_grpc_codes_users_expect() -> None:
    assert {status: gp.grpc_code(status) for status in (400, 401, 403, 404, 413, 429, 502, 503, 504)} == {
        400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
        413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED"}
    assert gp.grpc_code(500) == "INTERNAL"
    assert (gp.http_status("OK"), gp.http_status("INVALID_ARGUMENT"), gp.http_status("UNAVAILABLE")) == (200, 400, 503)


def test_tritons_in_stream_errors_are_counted_as_client_mistakes_or_server_errors() -> None:
    assert gp.stream_error_status("[request id: <id_unknown>] input byte size mismatch for input 'x'") == 400
    assert gp.stream_error_status("unexpected inference input 'nope' for model 'digits'") == 400
    assert gp.stream_error_status("Stub process 'digits_0_0' is not healthy.") == 500


# --- Small requests ----------------------------------------------------------------------------------------------


def test_it_reads_the_model_name_and_version_of_a_small_request() -> None:
    data = pb.ModelConfigRequest(name="digits", version="3").SerializeToString()
    assert gp.model_name(data) == ("digits", "3")
    assert gp.model_name(b"") == ("", "")


@pytest.mark.parametrize("data", [
    pb.ModelReadyRequest(name="digits", version="latest").SerializeToString(),
    pb.ModelReadyRequest(name="digits", version="1" * 19).SerializeToString(),
    b"\x0a\x05dig",  # cut short
    b"\x0a\x02\xff\xfe",  # not UTF-8
    b"\x0a" + b"\x00" * (64 * 1024),  # over the small-request limit
])
def test_it_refuses_a_small_request_that_is_malformed_or_oversized(data: bytes) -> None:
    with pytest.raises(Refusal) as raised:
        gp.model_name(data)
    assert raised.value.status == 400


# --- Inference requests: the wire walk ------------------------------------------------------------------------


def test_the_walk_reads_what_protobuf_reads_from_random_requests() -> None:
    rng = random.Random(7)
    datatypes = ["FP32", "INT64", "UINT8", "FP16", "BOOL"]
    for _ in range(300):
        message = pb.ModelInferRequest(model_name=rng.choice(["digits", "résumé", "a" * 200]),
                                       model_version=rng.choice(["", "1", "42"]), id=rng.choice(["", "req-7"]))
        message.parameters["priority"].int64_param = rng.randrange(10)
        raw = rng.random() < 0.7
        for index in range(rng.randrange(1, 5)):
            datatype = rng.choice(datatypes)
            shape = [rng.randrange(0, 4) for _ in range(rng.randrange(0, 4))]
            tensor = message.inputs.add(name=f"in{index}", datatype=datatype, shape=shape)
            tensor.parameters["note"].string_param = "x"
            size = gp.DATATYPE_SIZES[datatype]
            elements = 1
            for dim in shape:
                elements *= dim
            if raw:
                message.raw_input_contents.append(bytes(rng.randrange(256) for _ in range(elements * size)))
            else:
                tensor.contents.int64_contents.extend(range(elements))
        for index in range(rng.randrange(3)):
            message.outputs.add(name=f"out{index}").parameters["classification"].int64_param = 2
        data = message.SerializeToString()
        summary = gp.scan_infer_request(data, 16 * MB)
        parsed = pb.ModelInferRequest.FromString(data)
        assert (summary.model, summary.version, summary.id) == (parsed.model_name, parsed.model_version, parsed.id)
        assert [(t.name, t.datatype, t.shape, t.has_contents) for t in summary.inputs] == [
            (t.name, t.datatype, list(t.shape), t.HasField("contents")) for t in parsed.inputs]
        assert summary.raw_sizes == [len(r) for r in parsed.raw_input_contents]


def test_the_walk_takes_unpacked_shapes_unknown_fields_and_the_last_of_repeated_names_as_protobuf_does() -> None:
    raw = b"\0" * 24
    tensor = (gp._len_field(1, b"x") + gp._len_field(2, b"FP32")
              + b"\x18\x02\x18\x03"  # shape 2, 3 as two unpacked varints
              + b"\xa0\x06\x01")  # unknown field 100 (varint)
    data = (gp._len_field(1, b"first") + gp._len_field(1, b"digits") + b"\x45\x00\x00\x00\x00"  # field 8, fixed32
            + gp._len_field(5, tensor) + gp._len_field(7, raw))
    parsed = pb.ModelInferRequest.FromString(data)
    summary = gp.scan_infer_request(data, MB)
    assert summary.model == parsed.model_name == "digits"
    assert summary.inputs[0].shape == list(parsed.inputs[0].shape) == [2, 3]
    assert summary.raw_sizes == [24]


class Counted(bytes):
    """Bytes that count what the scan reads of them: each index read, and the bytes of each slice taken."""

    reads = 0
    sliced = 0

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            part = super().__getitem__(key)
            self.sliced += len(part)
            return part
        self.reads += 1
        return super().__getitem__(key)


def test_it_does_not_copy_or_even_look_at_the_tensor_bytes() -> None:
    """A 64 MiB tensor costs what a small one does: the walk skips raw contents by their length prefix. Counted in
    bytes read, not seconds: the same reads (a longer length prefix aside) and nothing of the tensor sliced."""
    big = Counted(request([16 * MB], b"\x7f" * (64 * MB)).SerializeToString())
    small = Counted(request([4], b"\x7f" * 16).SerializeToString())
    assert gp.scan_infer_request(big, 128 * MB).raw_sizes == [64 * MB]
    assert gp.scan_infer_request(small, 128 * MB).raw_sizes == [16]
    assert small.reads > 10  # the scan reads through __getitem__, so the counts see it
    assert big.reads <= small.reads + 8  # a varint of 64 MiB is 4 bytes where 16's is 1, in each length prefix
    assert big.sliced == small.sliced < 100  # the names and the datatype, never the tensor


def test_it_refuses_a_shape_over_the_tensor_limit_with_413() -> None:
    exc = refusal(request([2**40, 64], b"\0" * 256).SerializeToString())
    assert exc.status == 413 and "limit is" in exc.message and "[1099511627776, 64]" in exc.message


def test_it_refuses_a_shape_whose_size_wraps_around_64_bits() -> None:
    """[2**62] of FP32 is 2**64 bytes, which Triton's unsigned arithmetic takes for 0: an empty tensor passes its
    size check and kills the model's stub (measured on Triton 2.51)."""
    assert refusal(request([2**62], b"").SerializeToString()).status == 413
    assert refusal(request([2**62], None).SerializeToString()).status == 413
    assert refusal(request([2**61, 2**3], b"", datatype="UINT8").SerializeToString()).status == 413


@pytest.mark.parametrize(("message", "words"), [
    (request([-5], b"\0" * 8), "whole numbers >= 0"),
    (request([1] * 65, b"\0" * 4), "at most 64"),
    (request([4], b"\0" * 8), "are 8 bytes, but its shape [4] of FP32 takes 16 bytes"),
    (request([2], b"\0" * 4, datatype="BYTES"), "too small for 2 BYTES elements"),
    (request([2], b"\0" * 8, datatype="FLOAT"), "must be one of"),
    (request([2], b"\0" * 8, model=""), "Name the model"),
    (request([2], b"\0" * 8, model_version="latest"), "version number"),
    (pb.ModelInferRequest(model_name="digits"), "no inputs"),
])
def test_it_refuses_a_client_mistake_with_400_and_says_what_to_fix(message: pb.ModelInferRequest, words: str) -> None:
    exc = refusal(message.SerializeToString())
    assert exc.status == 400 and words in exc.message, exc.message


def test_it_refuses_raw_contents_that_do_not_match_the_inputs() -> None:
    message = request([2], b"\0" * 8)
    message.inputs.add(name="second", datatype="FP32", shape=[1])
    assert "2 inputs but 1 raw_input_contents" in refusal(message.SerializeToString()).message
    both = request([1], b"\0" * 4)
    both.inputs[0].contents.fp32_contents.append(1.0)
    assert "both contents and raw_input_contents" in refusal(both.SerializeToString()).message


def test_it_refuses_shared_memory_in_inputs_and_outputs() -> None:
    message = request([4])
    message.inputs[0].parameters["shared_memory_region"].string_param = "someone-elses"
    assert "shared memory" in refusal(message.SerializeToString()).message
    message = request([1], b"\0" * 4)
    message.outputs.add(name="y").parameters["shared_memory_byte_size"].int64_param = 4
    assert "shared memory" in refusal(message.SerializeToString()).message


@pytest.mark.parametrize("data", [
    b"\x0a\x10digits",  # a length past the end
    b"\x0b\x01",  # a group (wire type 3)
    b"\x00\x01",  # field number 0
    b"\x08" + b"\xff" * 11,  # a varint over 10 bytes
    gp._len_field(5, b"\x0a\x02\xc3"),  # an input name cut inside its message
])
def test_it_refuses_malformed_protobuf_with_400(data: bytes) -> None:
    exc = refusal(data)
    assert exc.status == 400


def test_a_message_of_a_million_tiny_fields_is_refused_quickly() -> None:
    data = gp._len_field(1, b"digits") + b"\x20\x01" * 1_000_000  # field 4 as varints: skipped, but counted
    counted = Counted(data)
    exc = refusal(counted)
    assert exc.status == 400 and "fields" in exc.message
    # Refused at the limit of fields, not after a walk of all million: counted in bytes read, not seconds.
    limit = 3 * gp.MAX_INPUTS + 64
    assert 0 < counted.reads <= 2 * limit + 16 < len(data) // 100
    inputs = b"".join(gp._len_field(5, gp._len_field(1, b"x")) for _ in range(gp.MAX_INPUTS + 1))
    assert "more than 1024 inputs" in refusal(gp._len_field(1, b"digits") + inputs).message


# --- Responses ----------------------------------------------------------------------------------------------------


def test_an_in_stream_error_is_a_valid_stream_response_naming_the_model_and_request() -> None:
    data = gp.stream_error_response("Too many requests", "digits", "req-9")
    parsed = pb.ModelStreamInferResponse.FromString(data)
    assert parsed.error_message == "Too many requests"
    assert (parsed.infer_response.model_name, parsed.infer_response.id) == ("digits", "req-9")
    assert gp.stream_error(data) == "Too many requests"
    answer = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name="digits"))
    answer.infer_response.raw_output_contents.append(b"\0" * 1000)
    assert gp.stream_error(answer.SerializeToString()) == ""
