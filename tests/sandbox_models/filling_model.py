"""A python model that writes into its scratch directory until the disk refuses (tests/test_sandbox_scratch.py):
it reports where it wrote, how much, and the error that stopped it, and keeps what it wrote until asked to drop
it, so that the test can see from outside where those bytes are (not on the host's disk)."""

import errno
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

CHUNK = b"x" * (1 << 20)


def fill(directory):
    path = os.path.join(directory, "filler.bin")
    written = 0
    error = None
    with open(path, "wb", buffering=0) as f:
        # At most 256 MiB, ten times the test's bound: without one it would write to the host's disk, and stop.
        while written < (256 << 20):
            try:
                written += f.write(CHUNK)
            except OSError as exc:
                error = errno.errorcode.get(exc.errno, str(exc.errno))
                break
    return {"directory": directory, "written": written, "error": error}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            command = pb_utils.get_input_tensor_by_name(request, "probe").as_numpy()[0].decode()
            if command == "fill":
                report = {"tmpdir": fill(os.environ["TMPDIR"])}
                # One bound for HOME and TMPDIR together (and /tmp, which is TMPDIR): once full, HOME is full too.
                report["home"] = fill(os.environ["HOME"])
                report["tmp_is_tmpdir"] = os.path.samefile("/tmp/filler.bin",
                                                           os.path.join(os.environ["TMPDIR"], "filler.bin"))
            else:
                for directory in (os.environ["TMPDIR"], os.environ["HOME"]):
                    os.unlink(os.path.join(directory, "filler.bin"))
                with open(os.path.join(os.environ["HOME"], "after.txt"), "w") as f:
                    f.write("room again")
                report = {"dropped": True}
            out = pb_utils.Tensor("report", np.array([json.dumps(report).encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
