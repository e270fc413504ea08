"""Hugging Face imports through the API (issue 35): POST a `source`, the import task as the worker runs it, then the
same inspection as an upload, against the local hub-compatible endpoint (tests/support/hf_hub_server.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from models_registry import import_worker
from models_registry.inspection import inspect_here
from models_registry.models import ModelVersion
from tests.support.hf_hub_server import (
    ONNX_COMMIT,
    PYTHON_COMMIT,
    HubRepo,
    HubServer,
    running_hub,
    standard_repos,
    tiny_onnx,
)
from tests.support.people import Person

URL = "/api/v1/models/tiny/versions/"


@pytest.fixture
def hf_hub_for_api() -> Iterator[HubServer]:
    """The local hub with the standard repos, the settings pointing at it, the team allowed acme/* (the default
    patterns), and retries without their backoff."""
    with running_hub(standard_repos()) as hub, override_settings(
            HF_ENDPOINT=hub.url, HF_TOKEN="hf_operator_token", IMPORT_HUGGINGFACE_REPOS="acme/*",
            IMPORT_RETRY_BACKOFF_SECONDS=0):
        yield hub


def _import(person: Person, source: dict[str, Any]) -> Any:
    return person.client().post(URL, {"source": source, "create_model": True}, format="json")


def _run(version_id: int) -> ModelVersion:
    """The import task as a worker runs it (its retries included), then inspection in this process."""
    for attempt in range(5):
        try:
            import_worker.run_import(version_id, attempt)
            break
        except import_worker.RetryLater:
            continue
    version = ModelVersion.objects.get(pk=version_id)
    return inspect_here(version_id) if version.status == ModelVersion.Status.VALIDATING else version


@pytest.mark.django_db(transaction=True)
def test_an_onnx_export_imports_as_a_ready_onnx_version(alice: Person, hf_hub_for_api: HubServer,
                                                         django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        created = _import(alice, {"kind": "huggingface", "repo": "acme/tiny-onnx", "revision": "v1"})
    assert created.status_code == 201, created.json()
    assert created.json()["source"] == {"kind": "huggingface", "repo": "acme/tiny-onnx", "revision": "v1"}
    version = _run(ModelVersion.objects.get().pk)
    assert version.status == ModelVersion.Status.READY, version.error
    assert version.format == "onnx" and version.size == len(tiny_onnx())
    assert version.source is not None
    assert version.source["fetched"] == {"repo": "acme/tiny-onnx", "revision": "v1", "commit": ONNX_COMMIT,
                                         "files": {"model.onnx": hashlib.sha256(tiny_onnx()).hexdigest()}}
    shown = alice.client().get(f"{URL}{version.number}/").json()
    assert shown["status"] == "ready" and shown["source"]["fetched"]["commit"] == ONNX_COMMIT
    assert [t["name"] for t in shown["signature"]["inputs"]] == ["x"]


@pytest.mark.django_db(transaction=True)
def test_a_branch_is_the_same_import_while_it_names_one_commit_and_a_new_version_once_it_moved(
        alice: Person, hf_hub_for_api: HubServer, django_capture_on_commit_callbacks: Any) -> None:
    source = {"kind": "huggingface", "repo": "acme/tiny-onnx", "revision": "main"}
    with django_capture_on_commit_callbacks(execute=False):
        first = _import(alice, source)
    assert first.status_code == 201, first.json()
    assert _run(ModelVersion.objects.get(number=first.json()["number"]).pk).status == ModelVersion.Status.READY
    # While main stays on its commit, importing it again is the same import: a retried CI job makes one version.
    with django_capture_on_commit_callbacks(execute=False):
        same = _import(alice, source)
    assert (same.status_code, same.json()["number"]) == (200, first.json()["number"])
    # A push moves main to another commit.
    moved = "e" * 40
    old = hf_hub_for_api.repos["acme/tiny-onnx"]
    hf_hub_for_api.repos["acme/tiny-onnx"] = HubRepo(commit=moved, files=old.files, lfs=old.lfs,
                                                     revisions=old.revisions)
    with django_capture_on_commit_callbacks(execute=False):
        again = _import(alice, source)
    assert again.status_code == 201, again.json()  # not the version of the commit main named before
    version = _run(ModelVersion.objects.get(number=again.json()["number"]).pk)
    assert version.status == ModelVersion.Status.READY, version.error
    assert version.source is not None and version.source["fetched"]["commit"] == moved
    # The commit main named, asked for by its sha, is the same bytes: the branch's version of it.
    pinned = {"kind": "huggingface", "repo": "acme/tiny-onnx", "revision": moved}
    with django_capture_on_commit_callbacks(execute=False):
        by_commit = _import(alice, pinned)
    assert (by_commit.status_code, by_commit.json()["number"]) == (200, again.json()["number"])


@pytest.mark.django_db(transaction=True)
def test_model_py_with_safetensors_imports_as_a_ready_python_version(alice: Person, hf_hub_for_api: HubServer,
                                                                     django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        created = _import(alice, {"kind": "huggingface", "repo": "acme/tiny-python"})
    assert created.status_code == 201, created.json()
    version = _run(ModelVersion.objects.get().pk)
    assert version.status == ModelVersion.Status.READY, version.error
    assert version.format == "python"
    assert version.source is not None
    assert version.source["fetched"]["commit"] == PYTHON_COMMIT
    assert sorted(version.source["fetched"]["files"]) == ["config.json", "model.py", "model.safetensors",
                                                          "signature.json"]
    shown = alice.client().get(f"{URL}{version.number}/").json()
    assert [t["name"] for t in shown["signature"]["outputs"]] == ["y"]


@pytest.mark.django_db(transaction=True)
def test_a_refused_import_leaves_an_invalid_version_saying_why(alice: Person, hf_hub_for_api: HubServer,
                                                               django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        created = _import(alice, {"kind": "huggingface", "repo": "acme/gated-onnx"})
    assert created.status_code == 201, created.json()
    version = _run(ModelVersion.objects.get().pk)
    assert version.status == ModelVersion.Status.INVALID
    assert "needs a token the operator has not allowed" in version.error
    assert set(hf_hub_for_api.authorizations()) == {""}


@pytest.mark.django_db
def test_the_api_refuses_a_bad_or_forbidden_repo_before_any_request(alice: Person, hf_hub_for_api: HubServer) -> None:
    bad = _import(alice, {"kind": "huggingface", "repo": "../../etc/passwd"})
    assert bad.status_code == 400
    assert "<org>/<name>" in str(bad.json())
    forbidden = _import(alice, {"kind": "huggingface", "repo": "globex/secret"})
    assert forbidden.status_code == 403
    assert "Team sources" in str(forbidden.json())
    assert hf_hub_for_api.received == []
    assert not ModelVersion.objects.exists()

