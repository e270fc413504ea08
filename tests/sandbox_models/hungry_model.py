"""A python model that loads within its memory limit and takes more than it on its first request
(tests/test_sandbox_hostile.py): the kernel kills its stub while Triton itself stays up. With "spare_zeros" it
takes nothing on inputs of zeros, as the trial call at inspection sends: it measures small there, and then asks for
more (tests/test_memory_default_e2e.py)."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "hunger.json")) as f:
            hunger = json.load(f)
        self.megabytes = hunger["megabytes"]
        self.spare_zeros = hunger.get("spare_zeros", False)

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        if not self.spare_zeros or any(x.any() for x in inputs):
            # Written page by page, so that the memory is really used (not just reserved).
            self.hoard = [np.ones(1 << 20, dtype=np.uint8) for _ in range(self.megabytes)]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
