"""A real Celery worker process (not eager mode) takes the inspection task from the real broker (files under var/,
or Redis in CI) and the version becomes ready; a bad one becomes invalid with its reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from portal.celery import app
from tests.artifacts import tiny_onnx
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_inspects_an_upload_and_the_version_becomes_ready(alice_tx: Person,
                                                                        celery_processes: Any) -> None:
    assert not app.conf.task_always_eager
    client = alice_tx.client()
    client.post("/api/v1/models/", {"name": "tiny"}, format="json")
    good = client.post("/api/v1/models/tiny/versions/", {"file": SimpleUploadedFile("m.onnx", tiny_onnx())},
                       format="multipart")
    assert good.json()["status"] == "validating"
    version = wait_for(lambda: (v := client.get("/api/v1/models/tiny/versions/1/").json())["status"]
                       != "validating" and v,
                       30, what="the worker to inspect the upload")
    assert version["status"] == "ready"
    assert version["signature"]["inputs"] == [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}]
    assert len(version["sha256"]) == 64


def test_a_real_worker_marks_a_broken_model_invalid_with_its_reason(alice_tx: Person, celery_processes: Any) -> None:
    client = alice_tx.client()
    client.post("/api/v1/models/", {"name": "tiny"}, format="json")
    client.post("/api/v1/models/tiny/versions/", {"file": SimpleUploadedFile("m.onnx", tiny_onnx(batch=False)),
                                                  "max_batch_size": "8"}, format="multipart")
    version = wait_for(lambda: (v := client.get("/api/v1/models/tiny/versions/1/").json())["status"] != "validating"
                       and v,
                       30, what="the worker to inspect the upload")
    assert version["status"] == "invalid"
    assert "needs a batch dimension" in version["error"]
