"""A python model that tries to reach the network (tests/test_sandbox_hostile.py): the portal stand-in on a port
an operator may allow, Redis (never allowed), and a UDP datagram. Answers {name: reached}."""

import json
import os
import socket

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


def reach(attempt):
    try:
        attempt()
        return True
    except OSError:
        return False


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "targets.json")) as f:
            self.targets = json.load(f)

    def execute(self, requests):
        ports = self.targets["ports"]

        def tcp(port):
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass

        def udp():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(f"egress-{self.targets['token']}".encode(), ("127.0.0.1", ports["udp"]))

        report = json.dumps({"portal": reach(lambda: tcp(ports["portal"])), "redis": reach(lambda: tcp(ports["redis"])),
                             "udp": reach(udp)})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("report", np.array([report.encode()], dtype=np.object_))])
                for _ in requests]
