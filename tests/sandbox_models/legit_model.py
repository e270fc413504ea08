"""A well-behaved python model (tests/test_sandbox_hostile.py): numpy, Pillow and onnxruntime, its own files,
files in its scratch directory (HOME, TMPDIR), threads and a child process all work in the sandbox."""

import concurrent.futures
import io
import json
import os
import subprocess
import tempfile

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "labels.json")) as f:
            self.labels = json.load(f)
        self.session = ort.InferenceSession(os.path.join(HERE, "matmul.onnx"), providers=["CPUExecutionProvider"])
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("scratch")
        self.temporary = f.name
        cache = os.path.join(os.path.expanduser("~"), ".cache", "legit")
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, "state.json"), "w") as f:
            json.dump({"initialized": True}, f)
        self.cache = cache
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            self.threads = sorted(pool.map(lambda n: n * n, range(4)))
        self.child = subprocess.run(["python3", "-c", "print(6 * 7)"], capture_output=True, text=True,
                                    timeout=60).stdout.strip()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = self.session.run(["y"], {"x": x})[0]
            image = Image.fromarray((np.clip(x, 0, 1) * 255).astype(np.uint8))
            png = io.BytesIO()
            image.save(png, format="PNG")
            with open(os.path.join(self.cache, "state.json")) as f:
                state = json.load(f)
            info = json.dumps({
                "labels": self.labels, "png_size": list(Image.open(io.BytesIO(png.getvalue())).size),
                "temporary": open(self.temporary).read(), "state": state, "threads": self.threads,
                "child": self.child, "home": os.path.expanduser("~"), "uid": os.getuid(),
            })
            rows = np.array([[info.encode()]] * len(x), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y.astype(np.float32)),
                                                         pb_utils.Tensor("info", rows)]))
        return responses
