"""A python model whose requirements.txt needs a package the runtime env lacks (tabulate) deploys and answers through
the gateway: the worker installs it with pip from the configured index into an environment layered on the runtime
env, and the sandboxed Triton runs with it. Two deployments with the same requirements share that environment; a
requirement no index has fails the deployment with pip's message. Real uvicorn, Celery worker and beat, pip and
Triton."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from deployments import pyenvs
from deployments.models import Deployment, Event
from deployments.runtimes.local.pyenv import python_env_for, runtime_env
from models_registry.models import ModelVersion
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.deploying import deploy, serving, status_of, wait_status
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# y = 3x, where the 3 comes out of tabulate: the model cannot load, let alone answer, without the package. It also
# tries to plant code in the environment it shares with other deployments: the sandbox mounts it read-only.
TABULATE_MODEL = b'''
import os

import numpy as np
import tabulate as tabulate_package
import triton_python_backend_utils as pb_utils
from tabulate import tabulate


class TritonPythonModel:
    def initialize(self, args):
        planted = os.path.join(os.path.dirname(tabulate_package.__file__), "planted.py")
        try:
            with open(planted, "w") as handle:
                handle.write("raise SystemExit('planted')")
        except OSError:
            pass
        else:
            raise RuntimeError("the shared python environment is writable from the sandbox")
        self.factor = float(tabulate([[3]], tablefmt="plain"))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * self.factor).astype(np.float32))]))
        return responses
'''


def push_python_model(person: Person, name: str, requirements: bytes) -> ModelVersion:
    client = person.client()
    client.post("/api/v1/models/", {"name": name}, format="json")
    archive = python_model_zip({"requirements.txt": requirements})
    archive_with_model = _replace_model_py(archive)
    response = client.post(f"/api/v1/models/{name}/versions/", {
        "file": SimpleUploadedFile(f"{name}.zip", archive_with_model), "format": "python",
        "signature": __import__("json").dumps(PYTHON_SIGNATURE)}, format="multipart")
    assert response.status_code == 201, response.json()
    wait_for(lambda: client.get(f"/api/v1/models/{name}/versions/1/").json()["status"] != "validating", 30,
             what=f"the worker to inspect {name}")
    version = ModelVersion.objects.get(model__name=name, number=1)
    assert version.status == "ready", version.error
    return version


def _replace_model_py(archive: bytes) -> bytes:
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            target.writestr(item, TABULATE_MODEL if item.filename == "model.py" else source.read(item))
    return out.getvalue()


def _built_envs() -> list[str]:
    return [p.parent.name for p in Path(settings.PYENVS_DIR).glob(f"*/{pyenvs.BUILT_MARK}")]


def test_a_python_models_requirements_are_installed_shared_and_a_bad_one_fails_with_pips_message(
    alice_tx: Person, portal_url: str
) -> None:
    env = runtime_env()
    lacks = subprocess.run([str(env.bin_dir / "python"), "-I", "-c", "import tabulate"], capture_output=True,
                           check=False)
    assert lacks.returncode != 0, "the runtime env has tabulate already: this test would prove nothing"
    alice = alice_tx
    # Other tests in the session (MLflow's pyfunc imports) build environments of their own in the same directory.
    built_before = set(_built_envs())
    version = push_python_model(alice, "fmt", b"numpy\ntabulate>=0.8  # formats the factor\n")
    assert version.definition == {"requirements": ["numpy", "tabulate>=0.8"]}

    deploy(alice, "fmt-a", [{"model": "fmt"}])
    deploy(alice, "fmt-b", [{"model": "fmt"}])
    for name in ("fmt-a", "fmt-b"):
        wait_status(alice, name, "ready", timeout=240)
    first = Deployment.objects.get(name="fmt-a")
    assert Event.objects.filter(deployment=first, message="Installing python packages for revision 1: numpy, "
                                                          "tabulate>=0.8.").exists()

    # One environment for both: the same key, one directory, and each Triton runs with it.
    key = python_env_for(first.revision.spec)
    assert key is not None
    assert python_env_for(Deployment.objects.get(name="fmt-b").revision.spec) == key
    assert sorted(set(_built_envs()) - built_before) == [key.key]
    assert (key.site_packages / "tabulate").is_dir() or (key.site_packages / "tabulate.py").exists()
    assert not (key.site_packages / "numpy").exists()  # the runtime env's numpy is used, not installed again
    assert not list(key.site_packages.rglob("planted.py"))
    for name in ("fmt-a", "fmt-b"):
        server = serving(name)
        assert server.sandboxed, server.sandbox_note  # the environment is readable inside the sandbox
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert f"VIRTUAL_ENV={key.env_dir}".encode() in environ
        assert any(v.startswith(f"PATH={key.env_dir}/bin:".encode()) for v in environ)

    client = httpclient.InferenceServerClient(url=f"{portal_url.removeprefix('http://')}/serve/fmt-a")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = httpclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("fmt", [tensor], headers={"Authorization": f"Bearer {alice.token}"})
    np.testing.assert_array_equal(result.as_numpy("y"), x * 3)

    push_python_model(alice, "broken", b"nonexistent-pkg-zzz==9.9\n")
    deploy(alice, "broken", [{"model": "broken"}])
    body = wait_status(alice, "broken", "failed", timeout=240)
    assert body["status_message"].startswith("Revision 1 cannot be prepared: pip could not install its python "
                                             "packages (nonexistent-pkg-zzz==9.9): No matching distribution found "
                                             "for nonexistent-pkg-zzz==9.9\n")
    assert "nonexistent-pkg-zzz==9.9" in body["status_message"].split("\n", 1)[1]  # pip's own lines follow
    assert "No matching distribution found" in body["status_message"]
    assert status_of(alice, "fmt-a")["status"] == "ready"  # nothing else disturbed
