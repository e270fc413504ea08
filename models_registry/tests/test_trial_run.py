"""The TorchScript trial run: what is fed, how the answer is judged, and real runs of real (and hostile) TorchScript
files in the runtime env (those are marked `frameworks`)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from conftest import Person
from models_registry.models import Model, ModelVersion
from models_registry.signature import Signature, Tensor, parse_signature
from models_registry.trial_run import TrialRunFailed, check_torchscript, judge, plan_for

CNN = Signature(inputs=(Tensor("input", "FP32", (-1, 3, -1, -1)),), outputs=(Tensor("logits", "FP32", (-1, 10)),))
FIXED = Signature(inputs=(Tensor("x", "INT64", (2, 5)),), outputs=(Tensor("y", "FP64", (2,)),))


def test_the_plan_feeds_a_batch_of_two_and_size_one_for_other_dynamic_dimensions() -> None:
    plan = plan_for(CNN)
    assert plan.batch == 2
    assert plan.inputs == [{"name": "input", "dtype": "float32", "shape": [2, 3, 1, 1]}]
    assert plan.outputs == ["logits"]
    fixed = plan_for(FIXED)
    assert fixed.batch is None and fixed.inputs == [{"name": "x", "dtype": "int64", "shape": [2, 5]}]


def test_strings_and_bfloat16_cannot_be_tried() -> None:
    with pytest.raises(TrialRunFailed, match="numeric tensors only, and text is BYTES or BF16"):
        plan_for(Signature(inputs=(Tensor("text", "BYTES", (-1, 1)),), outputs=(Tensor("y", "FP32", (-1,)),)))


def test_outputs_as_declared_pass() -> None:
    answer = {"outputs": {"logits": {"dtype": "float32", "shape": [2, 10]}}}
    assert judge(CNN, plan_for(CNN), answer) == []


@pytest.mark.parametrize(
    ("answer", "problems"),
    [
        ({"outputs": {"logits": {"dtype": "float64", "shape": [2, 10]}}},
         ["output 'logits' is float64, declared FP32 (float32)"]),
        ({"outputs": {"logits": {"dtype": "float32", "shape": [2, 11]}}},
         ["output 'logits' has shape [2, 11], declared dims [-1, 10] (-1: any size)"]),
        ({"outputs": {"logits": {"dtype": "float32", "shape": [1, 10]}}},
         ["output 'logits' has batch size 1 for a batch of 2: the first dimension must be the batch on every input "
          "and output (or declare fixed dims)"]),
        ({"outputs": {"logits": {"dtype": "float32", "shape": [20]}}},
         ["output 'logits' has shape [20], declared dims [-1, 10]"]),
        ({"outputs": {}}, ["output 'logits' was not returned"]),
        ({"error": "the model failed on zeros: boom"}, ["the model failed on zeros: boom"]),
        # What comes back is untrusted: anything else is no answer, never an exception.
        ({"outputs": {"logits": {"dtype": "float32", "shape": "2x10"}}}, ["output 'logits' was not returned"]),
        ({"outputs": ["logits"]}, ["the trial run gave no outputs"]),
        ([1, 2], ["the trial run gave no answer"]),
        (None, ["the trial run gave no answer"]),
    ],
)
def test_outputs_that_contradict_the_declaration_are_named(answer: Any, problems: list[str]) -> None:
    assert judge(CNN, plan_for(CNN), answer) == problems


def test_a_long_error_is_clipped() -> None:
    (problem,) = judge(CNN, plan_for(CNN), {"error": "x" * 100_000})
    assert len(problem) <= 1501


def test_without_torch_in_the_runtime_env_the_run_is_skipped_and_says_so(settings: Any, tmp_path: Path) -> None:
    settings.MODELPORT_RUNTIME_ENV = tmp_path / "no-env"
    outcome = check_torchscript(tmp_path / "model.pt", CNN)
    assert not outcome.ran and outcome.problems == []
    assert outcome.note == "not run: the runtime env has no PyTorch, so the declared signature is unchecked"


# --- Real runs in the runtime env ------------------------------------------------------------------------------

HOSTILE_MODELS = """
import sys
import torch

class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

class Spin(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = 0
        while i >= 0:
            i += 1
        return x

class Hog(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hog = torch.empty(805306368)  # 3 GiB: more than the limit below, less than this machine could give
        return x + hog[0] * 0

class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("refusing zeros")

for cls in (Doubler, Spin, Hog, Raises):
    torch.jit.save(torch.jit.script(cls()), f"{sys.argv[1]}/{cls.__name__.lower()}.pt")
"""
DOUBLER = parse_signature({"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                           "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}]})


@pytest.fixture(scope="module")
def torchscript_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from django.conf import settings

    folder = tmp_path_factory.mktemp("torchscript")
    (folder / "build.py").write_text(textwrap.dedent(HOSTILE_MODELS))
    python = Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"
    done = subprocess.run([str(python), str(folder / "build.py"), str(folder)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.frameworks("torch")
def test_a_model_that_runs_as_declared_passes(torchscript_files: Path) -> None:
    outcome = check_torchscript(torchscript_files / "doubler.pt", DOUBLER)
    assert outcome.ran and outcome.problems == []
    assert outcome.note == "passed: one call on zeros matched the declared signature"


@pytest.mark.frameworks("torch")
def test_a_declaration_the_model_contradicts_is_reported(torchscript_files: Path) -> None:
    wrong = parse_signature({"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                             "outputs": [{"name": "y", "datatype": "INT64", "dims": [-1, 3]}]})
    assert check_torchscript(torchscript_files / "doubler.pt", wrong).problems == [
        "output 'y' is float32, declared INT64 (int64)",
        "output 'y' has shape [2, 4], declared dims [-1, 3] (-1: any size)",
    ]


@pytest.mark.frameworks("torch")
def test_a_model_that_never_returns_is_killed_at_the_time_limit(torchscript_files: Path, settings: Any) -> None:
    settings.TRIAL_RUN_TIMEOUT_SECONDS = 15  # importing torch takes a few of them
    assert check_torchscript(torchscript_files / "spin.pt", DOUBLER).problems == [
        "the trial run on zeros did not finish within 15 s"]


@pytest.mark.frameworks("torch")
def test_a_model_that_allocates_without_bound_is_stopped_at_the_memory_limit(
    torchscript_files: Path, settings: Any
) -> None:
    settings.TRIAL_RUN_MEMORY_MB = 2048
    assert check_torchscript(torchscript_files / "hog.pt", DOUBLER).problems == [
        "the trial run on zeros needed more than 2,048 MiB of memory"]


@pytest.mark.frameworks("torch")
def test_a_model_that_raises_reports_its_error(torchscript_files: Path) -> None:
    (problem,) = check_torchscript(torchscript_files / "raises.pt", DOUBLER).problems
    assert problem.startswith("the model failed on zeros:") and "refusing zeros" in problem


@pytest.mark.frameworks("torch")
def test_a_file_torch_cannot_load_is_reported(tmp_path: Path) -> None:
    fake = tmp_path / "fake.pt"
    fake.write_bytes(b"PK\x03\x04 not really a zip")
    (problem,) = check_torchscript(fake, DOUBLER).problems
    assert problem.startswith("torch.jit.load failed:")


@pytest.mark.frameworks("torch")
def test_a_torchscript_upload_is_ready_after_its_trial_run_or_invalid_with_the_reason(
    alice: Person, eager_tasks: Any, torchscript_files: Path
) -> None:
    Model.objects.create(team=alice.team, name="doubler", created_by=alice.user)
    client = alice.client()
    data = (torchscript_files / "doubler.pt").read_bytes()
    for declared in (DOUBLER, parse_signature({"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
                                               "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 5]}]})):
        response = client.post("/api/v1/models/doubler/versions/", {
            "file": SimpleUploadedFile("doubler.pt", data), "signature": json.dumps(declared.to_json()),
        }, format="multipart")
        assert response.status_code == 201, response.json()
    good, bad = ModelVersion.objects.order_by("number")
    assert good.status == "ready", good.error
    assert good.definition == {"trial_run": "passed: one call on zeros matched the declared signature"}
    assert bad.status == "invalid"
    assert bad.error == (
        "The TorchScript model does not run as its declared signature says (one call on zeros, batch 2 where the "
        "first dimension is -1, other -1 dimensions 1): output 'y' has shape [2, 4], declared dims [-1, 5] "
        "(-1: any size)")
