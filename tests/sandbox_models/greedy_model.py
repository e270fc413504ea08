"""A python model that takes more memory than its deployment's resources.memory (tests/test_sandbox_hostile.py)."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "greed.json")) as f:
            megabytes = json.load(f)["megabytes"]
        # Written page by page, so that the memory is really used (not just reserved).
        self.hoard = [np.ones(1 << 20, dtype=np.uint8) for _ in range(megabytes)]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
