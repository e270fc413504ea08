"""A streaming model's trial verdict (deployments/runtimes/local/trial_call.py stream_verdict) and the gRPC request
it sends (trial_stream.py), without a Triton: the real stream runs in tests/test_streaming_e2e.py."""

from __future__ import annotations

import struct

import numpy as np

from deployments.runtimes.local.trial_call import stream_verdict
from deployments.runtimes.local.trial_stream import Streamed, raw_contents
from modelport.core.signature import Signature, Tensor

SIGNATURE = Signature(inputs=(Tensor("text_input", "BYTES", (1,)),), outputs=(Tensor("text_output", "BYTES", (-1,)),))
PIECE = {"outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]}


def test_every_piece_that_matches_passes_and_the_note_counts_them() -> None:
    outcome = stream_verdict(SIGNATURE, None, Streamed(pieces=[PIECE] * 3), on_example=False)
    assert outcome.problems == []
    assert outcome.note == "passed: one streamed call on zeros: each of its 3 pieces matched the declared signature"


def test_the_first_piece_that_breaks_the_signature_is_named() -> None:
    wrong = {"outputs": [{"name": "text_output", "datatype": "FP32", "shape": [1]}]}
    outcome = stream_verdict(SIGNATURE, None, Streamed(pieces=[PIECE, wrong, {"outputs": []}]), on_example=False)
    assert outcome.problems == ["piece 2 of the stream: output 'text_output' is FP32, declared BYTES"]


def test_a_model_that_fails_on_zeros_is_accepted_with_a_note_and_on_its_example_refused() -> None:
    raised = ("Failed to process the request(s) for model 'model_0_0', message: ValueError: not text\n\nAt:\n"
              "  /var/x/model.py(3): execute")
    on_zeros = stream_verdict(SIGNATURE, None, Streamed(pieces=[PIECE], error=raised), on_example=False)
    assert on_zeros.problems == [] and on_zeros.note.startswith("not checked: the model raised ValueError")
    on_example = stream_verdict(SIGNATURE, None, Streamed(error=raised), on_example=True)
    assert on_example.problems and "/var/x" not in on_example.problems[0]


def test_a_stream_without_a_piece_is_refused() -> None:
    outcome = stream_verdict(SIGNATURE, None, Streamed(), on_example=True)
    assert outcome.problems == ["the streamed trial call on the example request ended without a single piece (a "
                                "response with outputs)"]


def test_inputs_go_as_grpcs_raw_contents() -> None:
    assert raw_contents("BYTES", ["", b"ab"]) == struct.pack("<I", 0) + struct.pack("<I", 2) + b"ab"
    assert raw_contents("FP32", [0, 1.5]) == np.array([0, 1.5], dtype="<f4").tobytes()
    assert raw_contents("BOOL", [False, True]) == b"\x00\x01"
