"""`modelport infer ... | head -1`: a reader that closes the pipe early gets what it read, and the CLI exits
quietly (141, a shell's code for SIGPIPE) instead of printing a BrokenPipeError traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from modelport_cli.tests.fake_portal import FakePortal, Reply

ROOT = Path(__file__).resolve().parents[2]


def test_infer_into_a_closed_pipe_exits_141_without_a_traceback(portal: FakePortal, tmp_path: Path) -> None:
    (tmp_path / "input.json").write_text(json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}))
    portal.on("POST", "/serve/digits-prod/v2/models/digits/infer",
              Reply(200, {"model_name": "digits", "outputs": [
                  {"name": f"label{i}", "shape": [1], "datatype": "INT64", "data": [i]} for i in range(50)]}))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write to stdout is EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "modelport_cli", "infer", "digits-prod", "digits",
                               "--input", str(tmp_path / "input.json")],
                              stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, env=os.environ.copy(),
                              timeout=120, check=False)
    finally:
        os.close(write_end)

    stderr = done.stderr.decode()
    assert done.returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
    assert len(portal.seen("POST")) == 1  # it did run the request
