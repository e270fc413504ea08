"""A python model that leaves a detached process behind (setsid + double fork) when it starts; the process is
named after the token in token.txt so that tests can look for it from outside (tests/test_sandbox_processes.py)."""

import os

import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "token.txt")) as f:
            token = f.read().strip()
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv("/bin/sleep", [f"detached-{token}", "3600"])
            os._exit(0)
        os.waitpid(child, 0)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
