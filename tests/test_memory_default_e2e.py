"""Issue 31 (3) on the real local runtime: a dedicated deployment that gives no memory is limited from what its
models were measured to take (deployments/server_memory.py), and that limit is its sandbox's cgroup limit.

- A tiny ONNX model deployed without a memory setting gets the small derived limit, loads and answers within it,
  and its server's measurement becomes the version's figure.
- The hostile angle: the figure is no promise a team can game. A python model that takes nothing on the trial
  call's zeros (measured small at inspection) and 700 MB on a real request is killed at its own server's limit,
  and the deployment says so and how to give it more memory, rather than taking the memory from others.
"""

from __future__ import annotations

import urllib.error
from pathlib import Path
from typing import Any

import pytest

from deployments import reconcile
from deployments.models import Deployment
from infra import sandbox_settings
from modelport.core.sandbox import cgroups
from models_registry.models import ModelVersion
from tests.sandbox_helpers import VECTOR, deploy, gone, infer, model_source, python_version, ready
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db, pytest.mark.usefixtures("no_triton_left")]

Mi = 2**20


@pytest.fixture
def derived(settings: Any) -> Any:
    """The shipped derivation settings, with cgroups to enforce them."""
    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available or caps.cgroups.version == 0:
        pytest.skip(f"no sandbox with cgroups here: {caps.reason or caps.cgroups.note}")
    settings.SANDBOX_SERVER_MEMORY = "256Mi"
    settings.POOL_MODEL_MEMORY_MIN = "128Mi"
    settings.POOL_MODEL_MEMORY_HEADROOM = 1.5
    return settings


def _memory_limit(deployment: Deployment) -> int:
    server = ready(deployment)
    directory = cgroups.memory_directory([Path(d) for d in server.cgroups])
    assert directory is not None
    return cgroups.limit_bytes(directory)


def test_a_tiny_onnx_model_deployed_without_memory_gets_the_derived_limit_and_answers(
        alice: Person, eager_tasks: Any, derived: Any) -> None:
    version = make_ready_version(alice, "digits")
    deployment = deploy(alice, "small", [{"model": "digits"}])
    server = ready(deployment)
    assert _memory_limit(deployment) == 384 * Mi  # 256Mi for Triton + POOL_MODEL_MEMORY_MIN for the model
    answer = infer(server, "digits", [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}])
    assert [o["name"] for o in answer["outputs"]] == ["y"]
    # The health check measures the model's own processes: the version's figure for its next deployment.
    reconcile.reconcile(deployment.pk)
    version.refresh_from_db()
    assert version.measured_memory_bytes is not None and 10 * Mi < version.measured_memory_bytes < 384 * Mi
    assert version.measured_memory_by == "its use in a dedicated deployment on this machine"


def test_a_model_that_measured_small_and_takes_more_is_killed_at_its_limit_and_says_to_set_memory(
        alice: Person, eager_tasks: Any, derived: Any) -> None:
    derived.PYTHON_TRIAL_CALL = True
    files = {"model.py": model_source("hungry_model"), "hunger.json": b'{"megabytes": 700, "spare_zeros": true}'}
    version: ModelVersion = python_version(alice, "sly", files, VECTOR)
    # Measured at its trial call, on zeros: small.
    assert version.measured_memory_by == "its trial call at inspection"
    assert version.measured_memory_bytes is not None and version.measured_memory_bytes < 200 * Mi
    deployment = deploy(alice, "sly", [{"model": "sly"}])
    limit = _memory_limit(deployment)
    assert limit < 700 * Mi
    server = ready(deployment)
    with pytest.raises(urllib.error.HTTPError):
        infer(server, "sly", [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}])
    reconcile.reconcile(deployment.pk)  # the health check the reconciler runs every few seconds: one tick of it
    deployment.refresh_from_db()
    assert deployment.status != Deployment.Status.READY
    message = deployment.status_message
    assert "killed for memory" in message and "derived from what its models were measured to take" in message
    assert f"modelport deploy sly --memory {2 * limit // Mi}Mi" in message, message
    assert "resources.memory" in message
    assert gone(server)
    # It took the memory from nobody: what it held stayed within its limit.
    version.refresh_from_db()
    assert version.measured_memory_bytes is not None and version.measured_memory_bytes < limit


def test_the_sample_pipelines_python_step_never_measured_loads_and_answers_within_its_estimate(
        alice: Person, eager_tasks: Any, derived: Any) -> None:
    """Its requirements (numpy, pillow) skip the trial call, so it is never measured before it serves: estimated
    from its archive at POOL_MODEL_MEMORY_MIN (it was SANDBOX_DEFAULT_MEMORY, 4Gi), which a real stub with Pillow
    decoding a PNG fits in; its server then measures it."""
    import io
    import zipfile

    import numpy as np
    import tritonclient.http as httpclient

    from models_registry.samples import PREPROCESS_SIGNATURE, build_preprocess_zip, sample_digit_png

    archive = zipfile.ZipFile(io.BytesIO(build_preprocess_zip()))
    files = {name: archive.read(name) for name in archive.namelist()}
    version = python_version(alice, "preprocess", files, PREPROCESS_SIGNATURE.to_json())
    assert not version.measured_memory_bytes
    deployment = deploy(alice, "decode", [{"model": "preprocess"}])
    server = ready(deployment)
    assert _memory_limit(deployment) == 384 * Mi  # 256Mi for Triton + POOL_MODEL_MEMORY_MIN for the stub
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        image = httpclient.InferInput("image", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[sample_digit_png()]], dtype=object))
        features = client.infer("preprocess", [image]).as_numpy("input")
    finally:
        client.close()
    assert features is not None and features.shape == (1, 64)
    reconcile.reconcile(deployment.pk)
    version.refresh_from_db()
    assert version.measured_memory_bytes is not None and version.measured_memory_bytes < 128 * Mi
