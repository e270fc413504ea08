"""The trial call of a streaming (decoupled) python model (issue 33): Triton refuses /infer for such a model, and its
generate endpoints answer without datatypes or shapes, so the call is gRPC's ModelStreamInfer, whose every response
carries its outputs' names, datatypes and shapes, as a unary answer does. Each piece is then judged as the unary
trial's answer is (deployments/runtimes/local/trial_call.py `judge`)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelport.core import datatypes

# A model that streams without end is judged on its first pieces; the call is bounded by the trial's timeout too.
MAX_PIECES = 1000


@dataclass(frozen=True)
class TrialInput:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]  # flat; bytes or str for BYTES


@dataclass
class Streamed:
    """What the stream brought: each piece's outputs as {"name", "datatype", "shape"} (the answer's JSON shape the
    unary judge reads), and the error that ended it, if one did."""

    pieces: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def raw_contents(datatype: str, data: Sequence[Any]) -> bytes:
    """The input's elements as gRPC's raw_input_contents: little-endian, BYTES each with its 4-byte length."""
    if datatype == "BYTES":
        items = [d.encode() if isinstance(d, str) else bytes(d) for d in data]
        return b"".join(struct.pack("<I", len(b)) + b for b in items)
    import numpy as np

    return np.asarray(data, dtype=np.dtype(datatypes.KSERVE_TO_NUMPY[datatype]).newbyteorder("<")).tobytes()


def stream_call(target: str, model: str, inputs: Sequence[TrialInput], timeout: float) -> Streamed:
    """One request on a ModelStreamInfer stream to `target` (host:port), its responses read until the final one;
    OSError/TimeoutError when no answer comes."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=model)
    # An empty response with the final flag ends every stream, whatever the model sent before it.
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for item in inputs:
        request.inputs.add(name=item.name, datatype=item.datatype, shape=item.shape)
        request.raw_input_contents.append(raw_contents(item.datatype, item.data))
    finished = threading.Event()

    def requests() -> Iterator[Any]:
        yield request
        # The sending side stays open until the last response came: a stream closed early is a cancelled one.
        finished.wait(timeout)

    found = Streamed()
    channel = grpc.insecure_channel(target)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for response in stub.ModelStreamInfer(requests(), timeout=timeout):
            if response.error_message:
                found.error = response.error_message
                break
            answer = response.infer_response
            flag = answer.parameters.get("triton_final_response")
            final = flag is not None and flag.bool_param
            if answer.outputs or not final:
                # A piece, even one with no outputs (Triton drops those named otherwise than the config): the judge
                # names what it lacks. Only the empty final response is no piece.
                found.pieces.append({"outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
                                                 for o in answer.outputs]})
            if final or len(found.pieces) >= MAX_PIECES:
                break
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError("the streamed trial call timed out") from None
        raise OSError(f"the streamed trial call failed: {exc.code()}") from None
    finally:
        finished.set()
        channel.close()
    return found
