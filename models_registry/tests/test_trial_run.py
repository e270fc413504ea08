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

from modelport.core.signature import Signature, Tensor, parse_signature
from modelport.core.trial_run import TrialRunFailed, judge, plan_for
from models_registry.models import Model, ModelVersion
from models_registry.trial import check_torchscript
from tests.support.people import Person

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
        ({"error": {"stage": "call", "type": "RuntimeError", "message": "boom"}},
         ["the model failed on zeros: RuntimeError: boom"]),
        # What comes back is untrusted: anything else is no answer, never an exception.
        ({"outputs": {"logits": {"dtype": "float32", "shape": "2x10"}}}, ["output 'logits' was not returned"]),
        ({"outputs": ["logits"]}, ["the trial run gave no outputs"]),
        ([1, 2], ["the trial run gave no answer"]),
        (None, ["the trial run gave no answer"]),
    ],
)
def test_outputs_that_contradict_the_declaration_are_named(answer: Any, problems: list[str]) -> None:
    assert judge(CNN, plan_for(CNN), answer) == problems


def test_an_output_type_and_shape_the_model_wrote_itself_are_never_quoted_raw() -> None:
    """Issue 21 (10): the model can write the probe's result itself; a 256 KiB dtype of escape characters, or a
    shape of strings and a million numbers, must not land in the version's error."""
    hostile = "\x1b[2J\x1b]0;pwned\x07\u202e" * 20_000
    (problem,) = judge(CNN, plan_for(CNN), {"outputs": {"logits": {"dtype": hostile, "shape": [2, 10]}}})
    assert problem.startswith("output 'logits' is of an unknown type '") and problem.endswith(
        "', declared FP32 (float32)")
    assert len(problem) < 200 and all(" " <= ch <= "~" for ch in problem)
    for shape in ([2, hostile], [2, 10.5], [2, True], list(range(1_000_000))):
        (problem,) = judge(CNN, plan_for(CNN), {"outputs": {"logits": {"dtype": "float32", "shape": shape}}})
        assert problem == "output 'logits' has a shape that is not a list of at most 64 integers"


def test_a_long_error_is_cut_to_a_short_excerpt() -> None:
    (problem,) = judge(CNN, plan_for(CNN), {"error": {"stage": "call", "type": "E", "message": "x" * 100_000}})
    assert problem == "the model failed on zeros: E: " + "x" * 157 + "..."


@pytest.mark.parametrize(
    ("error", "problem"),
    [
        # TorchScript puts its traceback first and the message last: only the last line is echoed.
        ({"stage": "call", "type": "Error", "message": "Traceback of TorchScript\n  File code/x.py\n"
          "builtins.RuntimeError: refusing zeros\n"},
         "the model failed on zeros: builtins.RuntimeError: refusing zeros"),
        # Control characters, escapes and non-ASCII bytes (a file's binary contents) are dropped.
        ({"stage": "load", "type": "RuntimeError", "message": "bad\x00\x1b[31mzip\u202e\udcff\xff\tfile"},
         "torch.jit.load failed: RuntimeError: bad [31mzip file"),
        # The stage and the type are the probe's words, which the model can overwrite: neither is echoed unchecked.
        ({"stage": "<script>", "type": "a b <i>", "message": "m"}, "the trial run failed: m"),
        ({"stage": "signature", "type": "CallError", "message": ""},
         "the model cannot be called as declared: CallError"),
        ("a plain string\nof two lines", "the trial run failed: of two lines"),
        ({"stage": ["call"], "type": {"x": 1}}, "the trial run failed"),
    ],
)
def test_an_error_from_the_sandbox_is_echoed_as_a_fixed_phrase_a_type_and_a_printable_excerpt(
    error: Any, problem: str
) -> None:
    assert judge(CNN, plan_for(CNN), {"error": error}) == [problem]


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


@pytest.mark.frameworks("torch")
def test_a_torchscript_upload_is_measured_at_its_trial_run_and_its_deployment_limited_from_that(
    alice: Person, eager_tasks: Any, torchscript_files: Path, settings: Any
) -> None:
    """Issue 31: no trial call measured a TorchScript version, so its dedicated deployment got SANDBOX_DEFAULT_MEMORY
    (4Gi). The sandboxed trial run loads torch and the model and calls it: its cgroup's peak is the figure."""
    from infra import sandbox_settings

    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available or caps.cgroups.version == 0:
        pytest.skip(f"no sandbox with cgroups here: {caps.reason or caps.cgroups.note}")
    settings.SANDBOX_SERVER_MEMORY, settings.POOL_MODEL_MEMORY_MIN = "256Mi", "128Mi"
    settings.POOL_MODEL_MEMORY_HEADROOM, settings.SANDBOX_DEFAULT_MEMORY = 1.5, "4Gi"
    settings.TEAM_MAX_MEMORY = settings.DEPLOYMENT_MAX_MEMORY = ""
    Model.objects.create(team=alice.team, name="doubler", created_by=alice.user)
    client = alice.client()
    response = client.post("/api/v1/models/doubler/versions/", {
        "file": SimpleUploadedFile("doubler.pt", (torchscript_files / "doubler.pt").read_bytes()),
        "signature": json.dumps(DOUBLER.to_json())}, format="multipart")
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    # torch alone is some hundred MiB; the run is limited to TRIAL_RUN_MEMORY_MB.
    assert version.measured_memory_bytes is not None
    assert 50 * 2**20 < version.measured_memory_bytes < settings.TRIAL_RUN_MEMORY_MB * 2**20
    assert version.measured_memory_by == "its trial call at inspection"
    # What a dedicated deployment of it is limited from (planning it here would start a Triton): its figure.
    from deployments import server_memory
    from deployments.revision_spec import ModelEntry, RevisionSpec

    entry = ModelEntry(name="doubler", version=1, format="torchscript", signature=DOUBLER, max_batch_size=8,
                       version_id=version.pk)
    basis = server_memory.basis_for(RevisionSpec(runtime="local", models=(entry,)), [version])
    assert basis is not None and basis.fallback is None, basis
    (share,) = basis.models
    assert share.source.startswith("measured ") and share.source.endswith(" at its trial call at inspection")


# --- Containment: the trial run executes uploaded code ------------------------------------------------------------

# forward() plants a file in var/ through a shared mapping (unless `plant` is ""), maps a file of the portal's (as
# torch.from_file can) and raises with the stolen bytes in its message: each must fail or stay inside the sandbox.
PROBE_MODEL = """
import sys
from typing import List

import torch

class Probe(torch.nn.Module):
    def __init__(self, secret: str, size: int, plant: str) -> None:
        super().__init__()
        self.secret = secret
        self.size = size
        self.plant = plant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.plant != "":
            planted = torch.from_file(self.plant, shared=True, size=8, dtype=torch.uint8)
            planted.fill_(88)
            if int(planted[0]) != 88:
                return x
        stolen = torch.from_file(self.secret, shared=False, size=self.size, dtype=torch.uint8)
        values: List[int] = stolen.to(torch.int64).tolist()
        text = ""
        for value in values:
            text += chr(value)
        raise RuntimeError("stolen: " + text)

torch.jit.save(torch.jit.script(Probe(sys.argv[1], int(sys.argv[2]), sys.argv[3])), sys.argv[4])
"""


def build_probe(folder: Path, secret: Path, plant: str, name: str) -> Path:
    from django.conf import settings

    (folder / "build_probe.py").write_text(textwrap.dedent(PROBE_MODEL))
    python = Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"
    model = folder / name
    done = subprocess.run([str(python), str(folder / "build_probe.py"), str(secret), str(secret.stat().st_size),
                           plant, str(model)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return model


@pytest.mark.frameworks("torch")
def test_a_torchscript_upload_cannot_read_or_write_the_portals_files_nor_echo_them(
    alice: Person, eager_tasks: Any, tmp_path: Path, settings: Any
) -> None:
    import secrets

    token = secrets.token_hex(16)
    secret = Path(settings.VAR_DIR) / "secret_key_of_this_test"  # as var/secret_key: the worker's own, mode 0600
    secret.write_text(token)
    secret.chmod(0o600)
    planted = Path(settings.VAR_DIR) / "planted_by_a_model"
    try:
        models = [build_probe(tmp_path, secret, str(planted), "plants.pt"),
                  build_probe(tmp_path, secret, "", "reads.pt")]
        Model.objects.create(team=alice.team, name="probe", created_by=alice.user)
        for model in models:
            response = alice.client().post("/api/v1/models/probe/versions/", {
                "file": SimpleUploadedFile(model.name, model.read_bytes()), "signature": json.dumps(DOUBLER.to_json()),
            }, format="multipart")
            assert response.status_code == 201, response.json()
        plants, reads = ModelVersion.objects.filter(model__name="probe").order_by("number")
        assert not planted.exists(), "the trial run wrote into var/"
        # Neither var/ nor anything else of the worker's is in the sandbox: the mapping fails, nothing is stolen.
        for version in (plants, reads):
            assert version.status == "invalid"
            assert token not in version.error and "stolen" not in version.error, version.error
            assert "No such file or directory" in version.error, version.error
            assert len(version.error) < 400
    finally:
        secret.unlink()
        planted.unlink(missing_ok=True)


@pytest.mark.frameworks("torch")
def test_where_the_sandbox_cannot_be_built_the_model_never_runs_unless_the_operator_opted_out(
    torchscript_files: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra import sandbox_settings
    from modelport.core import sandbox

    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(False, "no user namespaces"))
    settings.SANDBOX_REQUIRED = True
    outcome = check_torchscript(torchscript_files / "doubler.pt", DOUBLER)
    assert not outcome.ran and outcome.problems == []
    assert outcome.note == ("not run: this machine cannot sandbox uploaded code (no user namespaces), so the declared "
                            "signature is unchecked")
    settings.SANDBOX_REQUIRED = False  # the operator's explicit opt-out: run as the worker, as serving then does
    assert check_torchscript(torchscript_files / "doubler.pt", DOUBLER).ran
