"""A shared deployment's names through the gateway (gateway/pool_names.py): the pool's names never reach the
caller, and the pool's other models are not found."""

from __future__ import annotations

import json

import pytest

from gateway import not_found, pool_names
from gateway.protocol import Endpoint, Refusal, classify

PREFIX = "d7-r2-"


def test_a_model_path_is_mapped_to_the_pools_name() -> None:
    endpoint = classify("POST", "/v2/models/digits/versions/1/infer")
    assert pool_names.upstream_target(b"v2/models/digits/versions/1/infer", endpoint, PREFIX) == (
        b"v2/models/d7-r2-digits/versions/1/infer")
    server = classify("GET", "/v2/health/ready")
    assert pool_names.upstream_target(b"v2/health/ready", server, PREFIX) == b"v2/health/ready"


def test_a_model_the_deployment_does_not_serve_is_not_found_whoever_has_it() -> None:
    with pytest.raises(Refusal) as refused:
        not_found.check_model("d3-r1-digits", frozenset({"digits"}), "mine", "acme")
    assert refused.value.status == 404
    assert refused.value.message == ("Deployment 'mine' in team 'acme' serves no model named 'd3-r1-digits'. Its "
                                     "models: 'digits'.")


def test_answers_carry_the_users_names_and_only_the_revisions_statistics() -> None:
    infer = json.dumps({"model_name": "d7-r2-digits", "outputs": []}).encode()
    body, _ = pool_names.rewrite_response(Endpoint("infer", "digits", "POST"), infer, None, PREFIX)
    assert json.loads(body)["model_name"] == "digits"
    stats = json.dumps({"model_stats": [{"name": "d7-r2-digits"}, {"name": "d9-r1-other"}]}).encode()
    body, _ = pool_names.rewrite_response(Endpoint("stats", "", "GET"), stats, None, PREFIX)
    assert json.loads(body) == {"model_stats": [{"name": "digits"}]}
    config = json.dumps({"name": "d7-r2-pipe", "ensemble_scheduling": {"step": [{"model_name": "d7-r2-a"}]}})
    body, _ = pool_names.rewrite_response(Endpoint("config", "pipe", "GET"), config.encode(), None, PREFIX)
    assert json.loads(body) == {"name": "pipe", "ensemble_scheduling": {"step": [{"model_name": "a"}]}}
    error = json.dumps({"error": "unexpected inference input 'z' for model 'd7-r2-digits'"}).encode()
    body, _ = pool_names.rewrite_response(Endpoint("infer", "digits", "POST"), error, None, PREFIX)
    assert "d7-r2-" not in body.decode()


def test_a_binary_answers_json_header_is_rewritten_and_its_length_told_again() -> None:
    header = json.dumps({"model_name": "d7-r2-digits", "outputs": [{"name": "y"}]}).encode()
    body, length = pool_names.rewrite_response(Endpoint("infer", "digits", "POST"), header + b"\x00\x01\x02\x03",
                                               len(header), PREFIX)
    assert length is not None and body[length:] == b"\x00\x01\x02\x03"
    assert json.loads(body[:length])["model_name"] == "digits"


# --- gRPC ---------------------------------------------------------------------------------------------------------


def test_a_grpc_request_names_the_pools_model_and_keeps_its_tensors() -> None:
    from tritonclient.grpc import service_pb2 as pb


    request = pb.ModelInferRequest(model_name="digits", id="9", raw_input_contents=[b"\x00" * 4096])
    mapped = pb.ModelInferRequest.FromString(pool_names.grpc_request(request.SerializeToString(), "d3-r2-"))
    assert mapped.model_name == "d3-r2-digits" and mapped.id == "9" and mapped.raw_input_contents == [b"\x00" * 4096]
    # The statistics of every model: an empty name stays empty (the answer is filtered instead).
    assert pool_names.grpc_request(pb.ModelStatisticsRequest().SerializeToString(), "d3-r2-") == b""


def test_grpc_answers_get_the_users_names_and_statistics_only_this_revisions() -> None:
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as pb


    stats = pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(name="d3-r2-digits", inference_count=4),
                                                    pb.ModelStatistics(name="d4-r1-digits", inference_count=9),
                                                    pb.ModelStatistics(name="d3-r1-digits", inference_count=1)])
    out = pb.ModelStatisticsResponse.FromString(pool_names.grpc_response("stats", stats.SerializeToString(), "d3-r2-"))
    assert [(row.name, row.inference_count) for row in out.model_stats] == [("digits", 4)]

    config = pb.ModelConfigResponse(config=mc.ModelConfig(name="d3-r2-pipe", ensemble_scheduling=mc.ModelEnsembling(
        step=[mc.ModelEnsembling.Step(model_name="d3-r2-pre"), mc.ModelEnsembling.Step(model_name="d3-r2-net")])))
    out_config = pb.ModelConfigResponse.FromString(
        pool_names.grpc_response("config", config.SerializeToString(), "d3-r2-")).config
    assert out_config.name == "pipe" and [s.model_name for s in out_config.ensemble_scheduling.step] == ["pre", "net"]

    answer = pb.ModelInferResponse(model_name="d3-r2-digits", raw_output_contents=[b"\x01" * 64])
    out_answer = pb.ModelInferResponse.FromString(pool_names.grpc_response("infer", answer.SerializeToString(),
                                                                           "d3-r2-"))
    assert out_answer.model_name == "digits" and out_answer.raw_output_contents == [b"\x01" * 64]

    stream = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name="d3-r7-digits", id="1"))
    out_stream = pb.ModelStreamInferResponse.FromString(pool_names.grpc_stream_response(stream.SerializeToString(), 3))
    assert out_stream.infer_response.model_name == "digits" and out_stream.infer_response.id == "1"
    error = pb.ModelStreamInferResponse(error_message="unexpected shape for input 'x' for model 'd3-r7-digits'")
    out_error = pb.ModelStreamInferResponse.FromString(pool_names.grpc_stream_response(error.SerializeToString(), 3))
    assert out_error.error_message == "unexpected shape for input 'x' for model 'digits'"


def test_a_grpc_message_that_is_not_protobuf_is_a_400() -> None:

    with pytest.raises(Refusal) as raised:
        pool_names.grpc_request(b"\x0a\xff\xff\xff\x0f", "d3-r2-")  # a length far past the message
    assert raised.value.status == 400 and "not a valid protobuf" in raised.value.message


def test_a_shared_deployments_readiness_is_its_models_and_idle_is_ready() -> None:
    loaded = pool_names.Pooled(revision=2, prefix=PREFIX, load_id=1, loaded=True, models=frozenset({"b", "a"}))
    assert pool_names.ready_names(loaded) == ["d7-r2-a", "d7-r2-b"]
    assert pool_names.ready_answer(loaded, [True, True])
    assert not pool_names.ready_answer(loaded, [True, False])
    assert not pool_names.ready_answer(loaded, [])
    idle = pool_names.Pooled(revision=2, prefix=PREFIX, load_id=1, loaded=False, idle=True, models=frozenset({"a"}))
    assert pool_names.ready_answer(idle, [])  # a request wakes it, held while it loads
    loading = pool_names.Pooled(revision=2, prefix=PREFIX, load_id=1, loaded=False, models=frozenset({"a"}))
    assert not pool_names.ready_answer(loading, [])


def test_the_grpc_ready_request_is_the_protobuf_message() -> None:
    from tritonclient.grpc import service_pb2

    for name in ("d7-r2-digits", "d7-r2-" + "m" * 300):
        assert pool_names.grpc_ready_request(name) == service_pb2.ModelReadyRequest(name=name).SerializeToString()
