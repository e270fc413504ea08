"""The CLI against a fake portal (see fake_portal.py for why a fake): the tus client's resuming, its checksums,
and what each command sends, prints and exits with."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from modelport_cli import client as client_module
from modelport_cli import main as main_module
from modelport_cli import tus
from modelport_cli.client import Client
from modelport_cli.errors import CliError, ExitCode
from modelport_cli.main import main
from modelport_cli.output import Progress
from modelport_cli.tests.fake_portal import (
    TOKEN,
    TUNED,
    FakePortal,
    FakeTus,
    Reply,
    api_error,
    deployment,
    error_line,
    existing,
    new,
)


def artifact(tmp_path: Path, size: int, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


# ------------------------------------------------------------------------------------------------- tus client


def test_an_upload_resumes_from_the_servers_offset_after_the_connection_drops_mid_chunk(
    portal: FakePortal, tmp_path: Path
) -> None:
    fake_tus = FakeTus(portal, faults=["", "drop"])
    path = artifact(tmp_path, 300_000)
    chunk = 64 * 1024

    result = tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=chunk)

    assert bytes(fake_tus.uploads[result.upload_id]["data"]) == path.read_bytes()
    patches = portal.seen("PATCH")
    assert patches[1].headers["upload-offset"] == str(chunk)  # the one that was dropped half-way
    assert portal.seen("HEAD"), "the client must ask the server how much it kept"
    # The server kept half of the dropped chunk; the client goes on from exactly there, not from a chunk boundary.
    assert patches[2].headers["upload-offset"] == str(chunk + chunk // 2)


def test_an_upload_asks_for_the_offset_and_goes_on_after_a_500(portal: FakePortal, tmp_path: Path) -> None:
    fake_tus = FakeTus(portal, faults=["", "500"])
    path = artifact(tmp_path, 200_000)

    notes: list[str] = []

    result = tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024, notify=notes.append)

    assert bytes(fake_tus.uploads[result.upload_id]["data"]) == path.read_bytes()
    methods = [r.method for r in portal.requests]
    assert methods == ["POST", "PATCH", "PATCH", "HEAD", "PATCH", "PATCH", "PATCH"]
    assert notes == ["PATCH answered 500 (Internal server error.); trying again in 0 s (1 of 6)"]


def test_an_upload_asks_for_the_offset_after_a_409(portal: FakePortal, tmp_path: Path) -> None:
    fake_tus = FakeTus(portal, faults=["409"])
    path = artifact(tmp_path, 100_000)

    result = tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024)

    assert bytes(fake_tus.uploads[result.upload_id]["data"]) == path.read_bytes()
    assert [r.method for r in portal.requests][:4] == ["POST", "PATCH", "HEAD", "PATCH"]


def test_a_chunk_is_sent_again_after_a_checksum_mismatch(portal: FakePortal, tmp_path: Path) -> None:
    fake_tus = FakeTus(portal, faults=["", "460"])
    path = artifact(tmp_path, 100_000)

    result = tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024)

    assert bytes(fake_tus.uploads[result.upload_id]["data"]) == path.read_bytes()
    patches = portal.seen("PATCH")
    assert [p.headers["upload-offset"] for p in patches] == ["0", "65536", "65536"]
    assert patches[1].body == patches[2].body
    assert not portal.seen("HEAD")  # a 460 leaves the offset where it was: no need to ask


def test_every_chunk_carries_the_tus_headers_and_the_sha256_of_its_own_bytes(portal: FakePortal,
                                                                             tmp_path: Path) -> None:
    FakeTus(portal)
    path = artifact(tmp_path, 150_000, name="résumé model.onnx")

    tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024)

    create = portal.seen("POST")[0]
    assert create.headers["tus-resumable"] == "1.0.0"
    assert create.headers["upload-length"] == "150000"
    key, _, value = create.headers["upload-metadata"].partition(" ")
    assert key == "filename" and base64.b64decode(value).decode() == "résumé model.onnx"
    patches = portal.seen("PATCH")
    assert [len(p.body) for p in patches] == [65536, 65536, 150_000 - 2 * 65536]
    for patch in patches:
        assert patch.headers["tus-resumable"] == "1.0.0"
        assert patch.headers["content-type"] == "application/offset+octet-stream"
        assert patch.headers["content-length"] == str(len(patch.body))  # not chunked transfer encoding
        digest = base64.b64encode(hashlib.sha256(patch.body).digest()).decode()
        assert patch.headers["upload-checksum"] == "sha256 " + digest
        assert patch.headers["authorization"] == f"Bearer {TOKEN}"


def test_an_upload_gives_up_with_one_line_after_failing_again_and_again(portal: FakePortal, tmp_path: Path) -> None:
    FakeTus(portal, faults=["500"] * 20)
    path = artifact(tmp_path, 1000)

    with pytest.raises(CliError) as failure:
        tus.upload_file(Client(portal.url, TOKEN), path)

    assert "failed after 7 attempts in a row" in failure.value.message
    assert "500" in failure.value.message


def test_running_the_command_again_after_a_crash_resumes_the_remembered_upload(portal: FakePortal,
                                                                               tmp_path: Path) -> None:
    fake_tus = FakeTus(portal, faults=["", "500", "500", "500", "500", "500", "500", "500"])
    path = artifact(tmp_path, 200_000)
    state = tus.UploadState(tmp_path / "state")
    with pytest.raises(CliError):
        tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024, state=state)
    assert len(fake_tus.uploads) == 1
    portal.requests.clear()

    result = tus.upload_file(Client(portal.url, TOKEN), path, chunk_size=64 * 1024, state=state)

    assert result.resumed_from == 64 * 1024
    assert not portal.seen("POST"), "the second run must not start a new upload"
    assert [r.method for r in portal.requests][0] == "HEAD"
    assert bytes(fake_tus.uploads[result.upload_id]["data"]) == path.read_bytes()


def test_an_edited_file_is_a_new_upload_and_an_unknown_remembered_one_is_forgotten(portal: FakePortal,
                                                                                   tmp_path: Path) -> None:
    fake_tus = FakeTus(portal)
    path = artifact(tmp_path, 1000)
    state = tus.UploadState(tmp_path / "state")
    first = tus.upload_file(Client(portal.url, TOKEN), path, state=state)
    path.write_bytes(os.urandom(2000))
    second = tus.upload_file(Client(portal.url, TOKEN), path, state=state)
    assert second.upload_id != first.upload_id

    del fake_tus.uploads[second.upload_id]  # expired on the server
    third = tus.upload_file(Client(portal.url, TOKEN), path, state=state)

    assert third.upload_id not in (first.upload_id, second.upload_id)
    assert state.get(third.state_key) == third.url


# ------------------------------------------------------------------------------------------------------ push


def versions_of(portal: FakePortal, model: str, statuses: list[dict[str, Any]]) -> None:
    portal.on("POST", f"/api/v1/models/{model}/versions/", Reply(201, {"number": 4, "status": "validating"}))
    portal.on("GET", f"/api/v1/models/{model}/versions/4/",
              [Reply(200, {"number": 4, "model": model, "size": 10, "format": "onnx", **s}) for s in statuses])


def test_push_uploads_creates_the_version_and_prints_its_number_once_ready(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_tus = FakeTus(portal)
    versions_of(portal, "digits", [{"status": "validating", "error": ""}, {"status": "ready", "error": ""}])
    path = artifact(tmp_path, 5000)
    signature = tmp_path / "signature.json"
    signature.write_text(json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}], "outputs": []}))

    code = main(["push", "digits", str(path), "--format", "onnx", "--signature", str(signature), "--max-batch-size",
                 "8"])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == "4\n"
    assert not portal.seen("POST", "/api/v1/models/"), "the model comes with its first version (create_model)"
    (upload_id,) = fake_tus.uploads
    assert portal.seen("POST", "/api/v1/models/digits/versions/")[0].json() == {
        "upload_id": upload_id, "create_model": True, "format": "onnx", "max_batch_size": 8,
        "signature": {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}], "outputs": []},
    }
    assert len(portal.seen("GET", "/api/v1/models/digits/versions/4/")) == 2
    assert not json.loads((tmp_path / "cache" / "uploads.json").read_text()), "a used upload is not remembered"


def test_push_sends_the_example_request_file_and_says_the_versions_notes(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    note = "not checked: the model raised UnidentifiedImageError on inputs of zeros"
    versions_of(portal, "digits", [{"status": "ready", "error": "", "notes": [note]}])
    example = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": [{"b64": "iVBORw0K"}]}]}
    (tmp_path / "example.json").write_text(json.dumps(example))

    code = main(["push", "digits", str(artifact(tmp_path, 500)), "--example-request", str(tmp_path / "example.json"),
                 "--verbose"])

    _, err = capsys.readouterr()
    assert code == 0, err
    assert portal.seen("POST", "/api/v1/models/digits/versions/")[0].json()["example_request"] == example
    assert f"note: digits version 4: {note}" in err


def test_push_decoupled_declares_a_streaming_model_and_says_nothing_of_it_otherwise(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "ready", "error": "", "decoupled": True}])

    assert main(["push", "digits", str(artifact(tmp_path, 500)), "--decoupled"]) == 0
    assert main(["push", "digits", str(artifact(tmp_path, 500))]) == 0

    first, second = portal.seen("POST", "/api/v1/models/digits/versions/")
    assert first.json()["decoupled"] is True
    assert "decoupled" not in second.json()


def test_a_broken_example_request_file_is_a_usage_error(portal: FakePortal, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "example.json").write_text("{not json")

    assert main(["push", "digits", str(artifact(tmp_path, 10)), "--example-request",
                 str(tmp_path / "example.json")]) == 2
    assert "is not valid JSON" in error_line(capsys)


def test_an_example_request_the_portal_refuses_is_a_usage_error(portal: FakePortal, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    FakeTus(portal)
    portal.on("POST", "/api/v1/models/digits/versions/", api_error(400, "Invalid input.", "invalid", fields={
        "example_request": ["inputs[0].name: 'nope' is not an input of the signature (its inputs: 'x')."]}))
    (tmp_path / "example.json").write_text(json.dumps({"inputs": [{"name": "nope"}]}))

    assert main(["push", "digits", str(artifact(tmp_path, 10)), "--example-request",
                 str(tmp_path / "example.json")]) == ExitCode.USAGE
    assert error_line(capsys) == ("error: --example-request: the portal refused it: inputs[0].name: 'nope' is not an "
                                  "input of the signature (its inputs: 'x').")


def test_an_example_request_that_does_not_fit_the_signature_inspection_read_is_a_usage_error(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "invalid", "error": "example_request: inputs[0].name: 'nope' is not "
                                    "an input of the signature (its inputs: 'x')."}])
    (tmp_path / "example.json").write_text(json.dumps({"inputs": [{"name": "nope"}]}))

    assert main(["push", "digits", str(artifact(tmp_path, 10)), "--example-request",
                 str(tmp_path / "example.json")]) == ExitCode.USAGE
    assert "--example-request: digits version 4 refused it: inputs[0].name: 'nope'" in error_line(capsys)


def test_a_model_refused_beside_its_example_is_still_an_invalid_model(portal: FakePortal, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    FakeTus(portal)
    portal.on("POST", "/api/v1/models/digits/versions/", api_error(400, "Invalid input.", "invalid", fields={
        "signature": ["not JSON"], "example_request": ["needs a signature"]}))
    (tmp_path / "example.json").write_text(json.dumps({"inputs": []}))
    assert main(["push", "digits", str(artifact(tmp_path, 10)), "--example-request",
                 str(tmp_path / "example.json")]) == ExitCode.INVALID_MODEL
    capsys.readouterr()
    versions_of(portal, "digits", [{"status": "invalid", "error": "onnx.checker found problems: bad"}])
    assert main(["push", "digits", str(artifact(tmp_path, 10))]) == ExitCode.INVALID_MODEL
    assert "digits version 4 is invalid: onnx.checker found problems: bad" in error_line(capsys)


def test_push_of_the_same_bytes_again_says_which_version_they_are_identical_to(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "ready", "error": "", "identical_to": 3}])

    assert main(["push", "digits", str(artifact(tmp_path, 500)), "--verbose"]) == 0

    out, err = capsys.readouterr()
    assert out == "4\n"  # still the bare number a CI script reads
    assert "note: digits version 4 is identical to version 3 (the same bytes): nothing changed since" in err


def test_push_of_a_model_that_turns_out_invalid_exits_3_with_the_portals_reason(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "invalid", "error": "ONNX inspection failed:\nbad graph"}])

    code = main(["push", "digits", str(artifact(tmp_path, 100))])

    assert code == ExitCode.INVALID_MODEL == 3
    assert error_line(capsys) == "error: digits version 4 is invalid: ONNX inspection failed: bad graph"


def test_push_rejected_by_the_portal_at_once_exits_3_with_its_reason(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [])
    reason = "The file is not a valid ONNX model: it is an ONNX file cut off after 100 bytes: upload the whole file."
    portal.on("POST", "/api/v1/models/digits/versions/",
              api_error(400, f"upload_id: {reason}", "invalid", {"upload_id": [reason]}))

    code = main(["push", "digits", str(artifact(tmp_path, 100)), "--format", "onnx"])

    assert code == 3
    assert error_line(capsys) == f"error: digits: the portal rejected the model: {reason}"


def test_push_that_is_still_validating_at_the_timeout_exits_5(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "validating", "error": ""}])

    code = main(["push", "digits", str(artifact(tmp_path, 100)), "--timeout", "0.2"])

    assert code == ExitCode.TIMEOUT == 5
    assert "timed out after 0.2 s waiting for digits version 4" in error_line(capsys)


def test_push_json_prints_the_version_as_json(portal: FakePortal, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "ready", "error": ""}])

    code = main(["push", "digits", str(artifact(tmp_path, 100)), "--json"])

    out, err = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["status"] == "ready"
    assert err == "", "no progress bar or notes in --json mode"


def test_push_sends_an_idempotency_key_when_it_creates_the_model_with_its_version(
    portal: FakePortal, tmp_path: Path
) -> None:
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "ready", "error": ""}])

    assert main(["push", "digits", str(artifact(tmp_path, 100)), "--no-wait"]) == 0
    assert main(["push", "digits", str(artifact(tmp_path, 100)), "--no-wait"]) == 0

    keys = [request.headers["idempotency-key"] for request in portal.seen("POST", "/api/v1/models/digits/versions/")]
    assert all(uuid.UUID(key).version == 4 for key in keys)
    assert len(set(keys)) == 2  # one per create call, so a retried step does not create twice and two pushes do
    assert not portal.seen("GET")  # --no-wait


# ---------------------------------------------------------------------------------------------------- deploy



def test_deploy_sends_the_serving_options_and_an_idempotency_key(portal: FakePortal,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))

    code = main(["deploy", "digits-prod", "--model", "digits:3", "--model", "text", "--dynamic-batching",
                 "--max-queue-delay-us", "2000", "--preferred-batch-size", "4", "8", "--max-batch-size", "32",
                 "--instances", "2", "--kind", "cpu", "--runtime", "local"])

    assert code == 0, capsys.readouterr().err
    (create,) = portal.seen("POST", "/api/v1/deployments/")
    options = {"max_batch_size": 32,
               "dynamic_batching": {"max_queue_delay_microseconds": 2000, "preferred_batch_size": [4, 8]},
               "instance_group": {"count": 2, "kind": "cpu"}}
    assert create.json() == {"name": "digits-prod", "runtime": "local",
                             "models": [{"model": "digits", "version": 3, **options}, {"model": "text", **options}]}
    assert uuid.UUID(create.headers["idempotency-key"]).version == 4


def test_deploy_leaves_batching_to_the_portal_unless_told_and_sends_null_to_turn_it_off(portal: FakePortal) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))

    assert main(["deploy", "a", "--model", "digits:1"]) == 0
    assert main(["deploy", "b", "--model", "digits:1", "--no-dynamic-batching"]) == 0

    first, second = (r.json()["models"][0] for r in portal.seen("POST", "/api/v1/deployments/"))
    assert first == {"model": "digits", "version": 1}
    assert second == {"model": "digits", "version": 1, "dynamic_batching": None}





def test_deploy_of_an_existing_deployment_patches_it_with_the_same_models(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    existing(portal)

    code = main(["deploy", "digits-prod", "--model", "digits:2", "--instances", "2", "--json"])

    out, _ = capsys.readouterr()
    assert code == 0
    # It exists: the update path at once, no create tried first (the portal checks a create's body before its
    # name, and would refuse what a PATCH takes).
    assert portal.seen("POST") == []
    (patch,) = portal.seen("PATCH", "/api/v1/deployments/digits-prod/")
    assert patch.json() == {"models": [{"model": "digits", "version": 2,
                                        "instance_group": {"count": 2, "kind": "cpu"}}]}
    assert json.loads(out)["revision"] == 2


def test_deploy_of_an_existing_deployment_changes_only_the_settings_given(portal: FakePortal) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--model", "digits", "--instances", "1"]) == 0

    (patch,) = portal.seen("PATCH", "/api/v1/deployments/digits-prod/")
    # The tuned 1,000 us queue delay, the batch size and the cache stay; the version is the latest (none given).
    assert patch.json() == {"models": [{
        "model": "digits", "max_batch_size": 32,
        "dynamic_batching": {"max_queue_delay_microseconds": 1000, "preferred_batch_size": [4, 8],
                             "preserve_ordering": False},
        "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": True, "warmup": None}]}


def test_one_field_of_batching_changes_and_the_other_stays(portal: FakePortal) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--model", "digits:3", "--max-queue-delay-us", "500", "--kind", "gpu"]) == 0

    (entry,) = portal.seen("PATCH")[0].json()["models"]
    assert entry["version"] == 3
    assert entry["dynamic_batching"] == {"max_queue_delay_microseconds": 500, "preferred_batch_size": [4, 8],
                                         "preserve_ordering": False}
    assert entry["instance_group"] == {"count": 2, "kind": "gpu"}


def test_no_dynamic_batching_turns_a_tuned_batching_off(portal: FakePortal) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--model", "digits", "--no-dynamic-batching"]) == 0

    (entry,) = portal.seen("PATCH")[0].json()["models"]
    assert entry["dynamic_batching"] is None
    assert entry["instance_group"]["count"] == 2


def test_a_model_new_to_the_deployment_starts_from_the_portals_defaults(portal: FakePortal) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--model", "digits", "--model", "text:1"]) == 0

    digits, text = portal.seen("PATCH")[0].json()["models"]
    assert digits["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert text == {"model": "text", "version": 1}


def test_reset_starts_from_the_portals_defaults_instead_of_the_current_settings(portal: FakePortal) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--model", "digits", "--instances", "1", "--reset"]) == 0

    (patch,) = portal.seen("PATCH")
    assert patch.json() == {"models": [{"model": "digits", "instance_group": {"count": 1, "kind": "cpu"}}]}


def test_deploy_help_says_what_an_existing_deployment_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--help"]) == 0

    out = " ".join(capsys.readouterr().out.split())
    assert "An existing name (in the token's team) takes the update path" in out
    assert "only what is given changes" in out and "--model may be left out" in out
    assert "A new deployment needs --model" in out
    assert "--reset starts each model from the portal's defaults" in out


def test_a_canary_keeps_the_current_settings_too(portal: FakePortal) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(models=[TUNED])))
    portal.on("PATCH", "/api/v1/deployments/digits-prod/",
              Reply(200, deployment(status="ready", serving_revision=1, canary=CANARY)))

    assert main(["deploy", "digits-prod", "--model", "digits:2", "--canary", "10"]) == 0

    (entry,) = portal.seen("PATCH")[0].json()["models"]
    assert entry["version"] == 2
    assert entry["dynamic_batching"]["max_queue_delay_microseconds"] == 1000


def test_a_canary_of_an_unknown_deployment_exits_2_and_says_to_deploy_it_first(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["deploy", "digits-prod", "--model", "digits:2", "--canary", "10"])

    assert code == ExitCode.USAGE
    assert "deploy digits-prod without --canary first" in error_line(capsys)
    assert portal.seen("PATCH") == []


def test_deploy_wait_waits_until_the_new_revision_serves_not_the_old_one(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(409, "exists", "conflict"))
    portal.on("PATCH", "/api/v1/deployments/digits-prod/", Reply(200, deployment(revision=2, serving_revision=1)))
    portal.on("GET", "/api/v1/deployments/digits-prod/", [
        Reply(200, deployment(status="ready", revision=1, serving_revision=1)),  # the current settings
        Reply(200, deployment(status="ready", revision=2, serving_revision=1)),
        Reply(200, deployment(status="starting", revision=2, serving_revision=1)),
        Reply(200, deployment(status="ready", revision=2, serving_revision=2)),
    ])

    code = main(["deploy", "digits-prod", "--model", "digits:2", "--wait"])

    out, _ = capsys.readouterr()
    assert code == 0
    assert len(portal.seen("GET")) == 4  # the current settings, then three polls
    assert out == f"digits-prod is ready: revision 2 at {portal.url}/serve/digits-prod\n"


def test_a_failed_deployment_exits_4_with_the_first_line_of_its_message(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    new(portal, Reply(200, deployment(status="starting")),
        Reply(200, deployment(status="failed", status_message="Triton failed to start: broken: load failed\nline 2")))

    code = main(["deploy", "digits-prod", "--model", "digits:1", "--wait"])

    assert code == ExitCode.DEPLOYMENT_FAILED == 4
    assert error_line(capsys) == "error: deployment digits-prod failed: Triton failed to start: broken: load failed"


def test_waiting_for_a_stopped_deployment_fails_at_once_instead_of_at_the_timeout(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(409, "exists", "conflict"))
    stopped = deployment(desired_state="stopped", status="stopped", revision=2, serving_revision=None)
    portal.on("PATCH", "/api/v1/deployments/digits-prod/", Reply(200, stopped))
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, stopped))

    assert main(["deploy", "digits-prod", "--model", "digits", "--wait"]) == 4
    assert "modelport start digits-prod" in error_line(capsys)


def test_a_deployment_that_does_not_get_ready_in_time_exits_5(portal: FakePortal,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    new(portal, Reply(200, deployment(status="starting", status_message="Loading.")))

    code = main(["deploy", "digits-prod", "--model", "digits:1", "--wait", "--timeout", "0.2"])

    assert code == 5
    assert error_line(capsys) == ("error: timed out after 0.2 s waiting for digits-prod to serve revision 1 "
                                  "(status starting: Loading.)")


def test_a_timeout_with_no_status_message_ends_with_the_status_alone(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    """It ended "(status pending: )" when the portal had no message to add."""
    new(portal, Reply(200, deployment(status="pending", status_message="")))

    assert main(["deploy", "digits-prod", "--model", "digits:1", "--wait", "--timeout", "0.1"]) == 5
    assert error_line(capsys).endswith("to serve revision 1 (status pending)")


def test_on_failure_stderr_holds_only_the_error_line_unless_verbose(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The help promises one line on stderr: the upload's progress and the notes come only with --verbose (or on
    a terminal, which a script capturing stderr is not)."""
    FakeTus(portal)
    versions_of(portal, "digits", [{"status": "invalid", "error": "bad graph"}])
    path = artifact(tmp_path, 3000)

    assert main(["push", "digits", str(path)]) == 3
    assert capsys.readouterr().err == "error: digits version 4 is invalid: bad graph\n"

    FakeTus(portal)
    assert main(["push", "digits", str(path), "--verbose"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: digits version 4 is invalid: bad graph"
    assert any(line.startswith("uploading model.onnx: ") for line in err)
    assert any("uploaded; waiting for the portal to validate it" in line for line in err)
    assert "--verbose" in main_module.__doc__ and "only line" in main_module.__doc__


@pytest.mark.parametrize("argv", [
    ["push", "Digits", "model.onnx"],
    ["push", "digits_v2", "model.onnx"],
    ["pipeline", "create", "pipe_1", "--definition", "def.json"],
    ["deploy", "prod!", "--model", "digits"],
    ["deploy", "prod", "--model", "Digits:1"],
    ["status", "a" * 64],
    ["stop", "x--"],
    ["infer", "prod", "my model", "--input", "req.json"],
])
def test_an_invalid_name_exits_2_before_anything_is_sent(
    portal: FakePortal, tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == ExitCode.USAGE == 2
    assert "is not a valid name: use 1 to 63 characters" in error_line(capsys)
    assert not portal.requests


def test_the_clis_name_rule_is_the_portals() -> None:
    from infra.names import NAME_RE

    assert main_module.NAME_RE.pattern == NAME_RE.pattern


def test_a_validation_error_is_one_line_with_the_field_messages(portal: FakePortal,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(
        400, "models[0].version: model 'digits' has no version 9", "invalid",
        {"models[0].version": ["model 'digits' has no version 9"], "replicas": ["use replicas 1"]}))
    portal.on("GET", "/api/v1/models/digits/", Reply(200, {"name": "digits"}))  # the model exists: a refusal (1)

    code = main(["deploy", "digits-prod", "--model", "digits:9"])

    assert code == 1
    assert error_line(capsys) == ("error: models[0].version: model 'digits' has no version 9; replicas: use replicas 1 "
                                  "(HTTP 400 from POST /api/v1/deployments/)")


# ---------------------------------------------------------------------------------- status, logs and the rest


def test_status_of_an_unknown_deployment_exits_2_a_wrong_name_as_help_says(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["status", "nope"])

    assert code == ExitCode.USAGE
    assert "2 wrong command line, input file or name" in main_module.__doc__
    assert error_line(capsys) == "error: Not found. (HTTP 404 from GET /api/v1/deployments/nope/)"


def test_status_json_parses_and_the_options_work_before_or_after_the_command(
    portal: FakePortal, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MODELPORT_URL")
    monkeypatch.delenv("MODELPORT_TOKEN")
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(status="ready", serving_revision=1)))

    assert main(["--url", portal.url, "status", "digits-prod", "--token", "other", "--json"]) == 0

    assert json.loads(capsys.readouterr().out)["status"] == "ready"
    assert portal.seen("GET")[0].headers["authorization"] == "Bearer other"


def test_status_prints_the_deployment_for_people(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    models = [{"model": "digits", "version": 1, "format": "onnx", "max_batch_size": 64,
               "dynamic_batching": {"max_queue_delay_microseconds": 2000, "preferred_batch_size": []},
               "instance_group": {"count": 2, "kind": "cpu", "gpus": []}}]
    portal.on("GET", "/api/v1/deployments/digits-prod/",
              Reply(200, deployment(status="ready", status_message="Serving revision 1.", serving_revision=1,
                                    models=models)))

    assert main(["status", "digits-prod"]) == 0

    out = capsys.readouterr().out
    assert "ready - Serving revision 1." in out
    assert f"{portal.url}/serve/digits-prod" in out
    assert "digits:1  onnx  max_batch_size=64  dynamic_batching(delay=2000us)  instances=2xcpu" in out


def test_logs_prints_the_log_and_asks_for_the_lines_wanted(portal: FakePortal,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/logs/", Reply(200, {"log": "I0101 Started HTTPService"}))

    assert main(["logs", "digits-prod", "--lines", "50"]) == 0

    assert capsys.readouterr().out == "I0101 Started HTTPService\n"
    assert portal.seen("GET")[0].query == {"lines": ["50"]}



def test_logs_says_whose_log_it_is_and_asks_for_a_revision_by_number(portal: FakePortal,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/logs/",
              Reply(200, {"log": "I0101 serving", "revision": 1, "revision_role": "serving", "canary_revision": 2}))

    assert main(["logs", "digits-prod", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert out == "I0101 serving\n"  # stdout stays the log alone
    assert "the log of revision 1 (serving)" in err
    assert "modelport logs digits-prod --revision 2" in err

    assert main(["logs", "digits-prod", "--revision", "2", "--lines", "5"]) == 0
    assert portal.seen("GET")[-1].query == {"lines": ["5"], "revision": ["2"]}

CPU_ONLY_LOG = """W0101 pinned memory pool init failed: CUDA driver version is insufficient
E0101 Failed to initialize NVML
I0101 loading: digits:1
E0101 failed to load 'gpu-model' version 1: CUDA error: no CUDA-capable device
I0101 Started HTTPService
"""


def test_logs_fold_the_cuda_lines_of_a_machine_without_a_gpu_as_the_page_does(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/logs/", Reply(200, {"log": CPU_ONLY_LOG}))

    assert main(["logs", "digits-prod", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert out == ("I0101 loading: digits:1\nE0101 failed to load 'gpu-model' version 1: CUDA error: no "
                   "CUDA-capable device\nI0101 Started HTTPService\n")
    assert "2 line(s) about CUDA, NVML or DCGM" in err and "--all shows them" in err

    assert main(["logs", "digits-prod", "--all"]) == 0
    assert capsys.readouterr().out == CPU_ONLY_LOG


def test_the_clis_log_fold_is_the_pages() -> None:
    from web import logs

    assert main_module.GPU_NOISE.pattern == logs.GPU_NOISE.pattern
    folded = logs.fold_gpu_noise(CPU_ONLY_LOG).text
    assert main_module.fold_gpu_noise(CPU_ONLY_LOG)[0].splitlines() == folded.splitlines()


def test_logs_refuses_an_answer_over_its_cap_rather_than_hold_it_and_strips_terminal_escapes(
    portal: FakePortal, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(main_module, "MAX_LOG_ANSWER_BYTES", 1024**2)
    portal.on("GET", "/api/v1/deployments/digits-prod/logs/", Reply(200, {"log": "x" * (3 * 1024**2)}))

    assert main(["logs", "digits-prod"]) == 1
    assert "the portal's answer is over 1,048,576 bytes" in error_line(capsys)

    portal.on("GET", "/api/v1/deployments/digits-prod/logs/", Reply(200, {"log": "\x1b]0;owned\x07\x1b[2Jok\tfine"}))
    assert main(["logs", "digits-prod"]) == 0
    assert capsys.readouterr().out == "\ufffd]0;owned\ufffd\ufffd[2Jok\tfine\n"


def test_stop_start_and_delete_succeed_and_stopping_twice_is_not_an_error(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("POST", "/api/v1/deployments/digits-prod/stop", [
        Reply(202, deployment(status="stopping", status_message="Stopping Triton.")),
        api_error(409, "The deployment is stopped already.", "conflict"),
    ])
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(status="stopped")))
    portal.on("POST", "/api/v1/deployments/digits-prod/start", Reply(202, deployment(status="pending")))
    portal.on("DELETE", "/api/v1/deployments/digits-prod/", [Reply(204), Reply(202)])

    assert main(["stop", "digits-prod"]) == 0
    assert main(["stop", "digits-prod"]) == 0
    assert main(["start", "digits-prod"]) == 0
    assert main(["delete", "digits-prod", "--json"]) == 0
    assert main(["delete", "digits-prod"]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0] == "digits-prod: stopping (Stopping Triton.)"
    assert out[1] == "digits-prod: The deployment is stopped already."
    assert json.loads("\n".join(out[3:-1])) == {"name": "digits-prod", "deleted": True, "status": "deleted"}
    assert "being deleted" in out[-1]


def test_infer_posts_the_input_file_to_the_gateway_and_prints_the_outputs(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    (tmp_path / "input.json").write_text(json.dumps(request))
    portal.on("POST", "/serve/digits-prod/v2/models/digits/infer",
              Reply(200, {"model_name": "digits",
                          "outputs": [{"name": "label", "shape": [1], "datatype": "INT64", "data": [7]}]}))

    assert main(["infer", "digits-prod", "digits", "--input", str(tmp_path / "input.json")]) == 0

    assert capsys.readouterr().out == "label (INT64 [1]): [7]\n"
    assert portal.seen("POST")[0].json() == request


def test_infer_sends_a_file_as_the_raw_bytes_of_a_bytes_input(portal: FakePortal, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An image cannot travel in JSON (Triton reads a JSON string's UTF-8, and a PNG is not UTF-8): --file sends it
    with Triton's binary tensor extension, as the page's Try it does, one element in a batch of one."""
    png = b"\x89PNG\r\n\x1a\n\x00\xff not UTF-8"
    (tmp_path / "digit.png").write_bytes(png)
    portal.on("POST", "/serve/pipe/v2/models/pipe/infer",
              Reply(200, {"outputs": [{"name": "labels", "shape": [1, 1], "datatype": "BYTES", "data": ["7"]}]}))

    assert main(["infer", "pipe", "pipe", "--file", f"image={tmp_path / 'digit.png'}"]) == 0

    assert capsys.readouterr().out == 'labels (BYTES [1x1]): ["7"]\n'
    [sent] = portal.seen("POST")
    assert sent.headers["content-type"] == "application/octet-stream"
    length = int(sent.headers["inference-header-content-length"])
    assert json.loads(sent.body[:length]) == {"inputs": [
        {"name": "image", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(png) + 4}}]}
    assert sent.body[length:] == len(png).to_bytes(4, "little") + png


def test_infer_sends_a_file_beside_the_json_inputs_in_the_shape_input_gives(portal: FakePortal,
                                                                            tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    request = {"inputs": [{"name": "scale", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]},
                          {"name": "image", "shape": [2, 1], "datatype": "BYTES", "data": ["", ""]}]}
    (tmp_path / "req.json").write_text(json.dumps(request))
    portal.on("POST", "/serve/pipe/v2/models/pipe/infer", Reply(200, {"outputs": []}))

    assert main(["infer", "pipe", "pipe", "--input", str(tmp_path / "req.json"),
                 "--file", f"image={tmp_path / 'a.bin'}"]) == 0

    [sent] = portal.seen("POST")
    length = int(sent.headers["inference-header-content-length"])
    assert json.loads(sent.body[:length])["inputs"] == [
        request["inputs"][0],
        {"name": "image", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 14}}]
    assert sent.body[length:] == (b"\x03\x00\x00\x00abc") * 2


@pytest.mark.parametrize(("argv", "message"), [
    (["infer", "pipe", "pipe"], "give --input FILE.json, or --file INPUT=PATH for a BYTES input (or both)"),
    (["infer", "pipe", "pipe", "--file", "digit.png"], "--file 'digit.png': expected INPUT=PATH"),
    (["infer", "pipe", "pipe", "--file", "image=nope.png"], "--file image=nope.png: No such file or directory"),
    (["infer", "pipe", "pipe", "--input", "req.json", "--file", "scale=digit.png"],
     "--file scale=...: --input gives scale as FP32; a file is sent to a BYTES input"),
])
def test_infer_refuses_a_file_it_cannot_send_before_anything_is_sent(
        portal: FakePortal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digit.png").write_bytes(b"png")
    (tmp_path / "req.json").write_text(json.dumps(
        {"inputs": [{"name": "scale", "shape": [1], "datatype": "FP32", "data": [1.0]}]}))
    assert main(argv) == ExitCode.USAGE
    assert error_line(capsys).startswith(f"error: {message}")
    assert not portal.requests


def test_an_error_of_the_gateway_is_one_line_too(portal: FakePortal, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "input.json").write_text(json.dumps({"inputs": []}))
    portal.on("POST", "/serve/digits-prod/v2/models/digits/infer",
              Reply(400, {"error": "unexpected inference input 'x' for model 'digits'"}))

    assert main(["infer", "digits-prod", "digits", "--input", str(tmp_path / "input.json")]) == 1
    assert error_line(capsys) == ("error: unexpected inference input 'x' for model 'digits' "
                                  "(HTTP 400 from POST /serve/digits-prod/v2/models/digits/infer)")


def test_pipeline_create_posts_an_ensemble_definition(portal: FakePortal, tmp_path: Path) -> None:
    definition = {"steps": [{"model": "tokenizer", "input_map": {"x": "text"}, "output_map": {"y": "ids"}}]}
    (tmp_path / "pipeline.json").write_text(json.dumps(definition))
    portal.on("POST", "/api/v1/models/pipe/versions/", Reply(201, {"number": 1, "status": "validating"}))

    assert main(["pipeline", "create", "pipe", "--definition", str(tmp_path / "pipeline.json"), "--no-wait"]) == 0

    assert portal.seen("POST", "/api/v1/models/pipe/versions/")[0].json() == {
        "format": "ensemble", "definition": definition, "create_model": True}


# ------------------------------------------------------------------------------------------ errors and usage


def test_an_unreachable_portal_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(client_module, "RETRY_DELAYS", (0.0,))

    code = main(["--url", f"http://127.0.0.1:{port}", "--token", "t", "status", "x"])

    assert code == 1
    assert error_line(capsys) == f"error: cannot reach the portal: Connection refused (GET http://127.0.0.1:{port}/api/v1/deployments/x/)"


def test_a_get_is_retried_after_a_502_from_a_proxy(portal: FakePortal) -> None:
    portal.on("GET", "/api/v1/deployments/x/", [Reply(502, b"<html>Bad Gateway</html>"), Reply(200, deployment())])

    assert main(["status", "x", "--json"]) == 0
    assert len(portal.seen("GET")) == 2


def test_a_rejected_token_says_where_the_token_comes_from(portal: FakePortal,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/x/", api_error(401, "Invalid token.", "authentication_failed"))

    assert main(["status", "x"]) == 1
    assert "Invalid token. (check MODELPORT_TOKEN or --token) (HTTP 401" in error_line(capsys)


@pytest.mark.parametrize("argv", [
    [],
    ["deploy", "x", "--model", "digits:v2"],
    ["deploy", "x", "--memory", "512MB"],
    ["deploy", "x", "--cpu", "two"],
    ["deploy", "x", "--model", "d:1", "--no-dynamic-batching", "--max-queue-delay-us", "5"],
    ["push", "digits"],
    ["push", "digits", "/no/such/file.onnx"],
    ["logs", "x", "--lines", "0"],
])
def test_usage_errors_exit_2_with_one_line(portal: FakePortal, argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == ExitCode.USAGE == 2
    assert error_line(capsys)
    assert not portal.requests


def test_a_missing_url_or_token_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MODELPORT_URL", raising=False)
    monkeypatch.setenv("MODELPORT_TOKEN", "t")
    assert main(["status", "x"]) == 2
    assert error_line(capsys) == "error: no portal URL: set MODELPORT_URL or pass --url"

    monkeypatch.setenv("MODELPORT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("MODELPORT_TOKEN")
    assert main(["status", "x"]) == 2
    assert error_line(capsys) == "error: no API token: set MODELPORT_TOKEN or pass --token"


def test_a_broken_signature_file_is_a_usage_error(portal: FakePortal, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sig.json").write_text("{not json")

    assert main(["push", "digits", str(artifact(tmp_path, 10)), "--signature", str(tmp_path / "sig.json")]) == 2
    assert "is not valid JSON" in error_line(capsys)


def test_the_cli_imports_nothing_but_requests_and_the_standard_library() -> None:
    import subprocess
    import sys

    # What a CI job installs is `requests` alone; an import of Django or of the portal's code would break it there.
    code = ("import sys, modelport_cli.main, modelport_cli.tus; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                            cwd=Path(__file__).resolve().parents[2])
    allowed = set(sys.stdlib_module_names) | {"__main__", "modelport_cli", "requests", "urllib3", "idna", "certifi",
                                               "charset_normalizer", "chardet", "brotli", "brotlicffi", "zstandard",
                                               "simplejson", "socks", "cryptography", "OpenSSL", "sitecustomize",
                                               "usercustomize", "_distutils_hack"}
    # Compiled extensions of those packages show up under names of their own (_brotli, _cython_3_3_1, ...).
    foreign = {m for m in set(result.stdout.split()) - allowed if not m.startswith(("_", "cython_"))}
    assert foreign == set()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_the_progress_bar_redraws_one_line_on_a_terminal_and_prints_every_tenth_in_a_log() -> None:
    terminal, log = _Stream(tty=True), _Stream(tty=False)
    for stream in (terminal, log):
        progress = Progress(1000, "uploading m.onnx", stream)
        for done in range(0, 1001, 50):
            progress.update(done)
        progress.finish()

    assert terminal.getvalue().count("\n") == 1
    assert "\r" in terminal.getvalue()
    last = terminal.getvalue().split("\r")[-1]
    assert "[########################] 1000 B / 1000 B 100%" in last and "B/s" in last
    lines = log.getvalue().splitlines()
    assert len(lines) == 11
    assert lines[-1].startswith("uploading m.onnx: 1000 B / 1000 B (100%), ")


# --- Canary rollouts -------------------------------------------------------------------------------------------

CANARY = {"revision": 2, "percent": 10, "state": "starting", "serving_since": None, "max_error_rate": 0.05,
          "max_p99_ratio": 2.0, "window_seconds": 60, "min_requests": 20, "auto_promote": False}


def test_deploy_canary_patches_with_a_rollout_and_waits_until_the_canary_serves(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("PATCH", "/api/v1/deployments/digits-prod/",
              Reply(200, deployment(status="ready", serving_revision=1, canary=CANARY)))
    portal.on("GET", "/api/v1/deployments/digits-prod/", [
        Reply(200, deployment(status="ready", serving_revision=1, canary=CANARY)),
        Reply(200, deployment(status="ready", serving_revision=1, canary={**CANARY, "state": "serving"})),
    ])

    code = main(["deploy", "digits-prod", "--model", "digits:2", "--canary", "10", "--wait"])

    out, _ = capsys.readouterr()
    assert code == 0
    assert portal.seen("POST") == []  # a canary needs the deployment: no create
    (patch,) = portal.seen("PATCH")
    assert patch.json() == {"models": [{"model": "digits", "version": 2}],
                            "rollout": {"strategy": "canary", "percent": 10}}
    assert out.startswith("digits-prod: canary revision 2 serves 10% of the requests (revision 1 the rest)")


def test_a_canary_that_ends_before_serving_exits_4(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("PATCH", "/api/v1/deployments/digits-prod/",
              Reply(200, deployment(status="ready", serving_revision=1, canary=CANARY)))
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(status="ready", serving_revision=1,
                                                                               canary=None)))

    code = main(["deploy", "digits-prod", "--model", "digits:2", "--canary", "10", "--wait"])

    assert code == ExitCode.DEPLOYMENT_FAILED
    assert error_line(capsys).startswith("error: the canary of revision 2 of digits-prod ended before it served")


@pytest.mark.parametrize("percent", ["0", "100", "ten", "-5"])
def test_deploy_canary_refuses_a_percent_out_of_range(portal: FakePortal, percent: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "digits-prod", "--model", "digits:2", f"--canary={percent}"]) == ExitCode.USAGE
    assert portal.seen() == []
    assert "--canary" in capsys.readouterr().err


def test_promote_and_rollback_post_and_say_what_serves(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(serving_revision=1, canary=CANARY)))
    portal.on("POST", "/api/v1/deployments/digits-prod/promote", Reply(200, deployment(serving_revision=2)))
    portal.on("POST", "/api/v1/deployments/digits-prod/rollback", Reply(200, deployment(serving_revision=1)))

    assert main(["promote", "digits-prod"]) == 0
    assert capsys.readouterr().out == "digits-prod: revision 2 promoted; it serves every request\n"
    assert main(["rollback", "digits-prod"]) == 0
    assert capsys.readouterr().out == ("digits-prod: canary revision 2 rolled back; revision 1 serves every "
                                       "request\n")


def test_promote_without_a_canary_is_an_error_with_the_portals_reason(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(serving_revision=1, canary=None)))
    portal.on("POST", "/api/v1/deployments/digits-prod/promote", api_error(409, "There is no canary to promote.",
                                                                            "conflict"))

    assert main(["promote", "digits-prod"]) == ExitCode.ERROR
    line = error_line(capsys)
    assert line == ("error: digits-prod has no canary to promote: start one with 'modelport deploy digits-prod "
                    "--model MODEL[:VERSION] --canary PERCENT'")


def test_status_shows_a_canary(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/",
              Reply(200, deployment(status="ready", serving_revision=1, canary={**CANARY, "state": "serving"})))

    assert main(["status", "digits-prod"]) == 0
    assert "canary:    revision 2 for 10% (serving)\n" in capsys.readouterr().out
