"""push --from: an import the portal fetches itself (issue 35), against the fake portal: what --from becomes in
the request, the progress while importing, and the usage errors of a malformed source before any request."""

from __future__ import annotations

from typing import Any

import pytest

from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from modelport_cli.tests.fake_portal import FakePortal, Reply, error_line

IMPORTING = {"number": 2, "model": "fraud", "status": "importing", "size": 0, "format": "",
             "source": {"kind": "mlflow", "uri": "models:/fraud/3"}, "import": {"done_bytes": 0, "total_bytes": None}}


def imports(portal: FakePortal, polls: list[dict[str, Any]], created: int = 201) -> None:
    portal.on("POST", "/api/v1/models/fraud/versions/", Reply(created, IMPORTING))
    portal.on("GET", "/api/v1/models/fraud/versions/2/", [Reply(200, {**IMPORTING, **poll}) for poll in polls])


READY = {"status": "ready", "error": "", "format": "onnx", "size": 1000, "import": None}


@pytest.mark.parametrize(("spec", "source"), [
    ("models:/fraud/3", {"kind": "mlflow", "uri": "models:/fraud/3"}),
    ("models:/fraud@champion", {"kind": "mlflow", "uri": "models:/fraud@champion"}),
    ("hf://org/name", {"kind": "huggingface", "repo": "org/name", "revision": "main"}),
    ("hf://org/name@v1.2", {"kind": "huggingface", "repo": "org/name", "revision": "v1.2"}),
    ("s3://bucket/models/fraud.onnx", {"kind": "uri", "uri": "s3://bucket/models/fraud.onnx"}),
    ("https://example.com/fraud.onnx", {"kind": "uri", "uri": "https://example.com/fraud.onnx"}),
])
def test_push_from_sends_the_source_and_waits_through_importing_until_ready(
    portal: FakePortal, capsys: pytest.CaptureFixture[str], spec: str, source: dict[str, Any]
) -> None:
    imports(portal, [{}, {"status": "validating"}, READY])

    code = main(["push", "fraud", "--from", spec])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == "2\n"
    assert portal.seen("POST", "/api/v1/models/fraud/versions/")[0].json() == {"source": source, "create_model": True}
    assert len(portal.seen("GET", "/api/v1/models/fraud/versions/2/")) == 3


def test_push_from_hf_sends_the_files_named_and_new_version_when_asked(portal: FakePortal) -> None:
    imports(portal, [READY])

    code = main(["push", "fraud", "--from", "hf://org/name@main", "--file", "model.onnx", "--file", "config.json",
                 "--new-version", "--format", "onnx"])

    assert code == 0
    assert portal.seen("POST", "/api/v1/models/fraud/versions/")[0].json() == {
        "source": {"kind": "huggingface", "repo": "org/name", "revision": "main",
                   "files": ["model.onnx", "config.json"]},
        "create_model": True, "new_version": True, "format": "onnx"}


def test_push_from_prints_the_bytes_imported_of_the_total(portal: FakePortal,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    imports(portal, [{"import": {"done_bytes": 0, "total_bytes": 2048}},
                     {"import": {"done_bytes": 1024, "total_bytes": 2048}},
                     {"import": {"done_bytes": 2048, "total_bytes": 2048}}, READY])

    code = main(["push", "fraud", "--from", "models:/fraud/3", "--verbose"])

    err = capsys.readouterr().err
    assert code == 0, err
    assert "importing it from models:/fraud/3" in err
    assert "fraud version 2: importing: 1.0 KiB of 2.0 KiB (50%)" in err
    assert "fraud version 2: importing: 2.0 KiB of 2.0 KiB (100%)" in err


def test_push_from_a_source_imported_already_says_so_and_waits_for_that_version(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    imports(portal, [READY], created=200)

    code = main(["push", "fraud", "--from", "models:/fraud/3", "--verbose"])

    out, err = capsys.readouterr()
    assert (code, out) == (0, "2\n")
    assert "was imported from this source already (--new-version imports it again)" in err


def test_an_import_that_fails_exits_3_and_a_cancelled_one_exits_1(portal: FakePortal,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    imports(portal, [{"status": "invalid", "error": "models:/fraud/3: no such version in the registry"}])
    assert main(["push", "fraud", "--from", "models:/fraud/3"]) == ExitCode.INVALID_MODEL
    assert error_line(capsys) == "error: fraud version 2 is invalid: models:/fraud/3: no such version in the registry"

    imports(portal, [{"status": "cancelled"}])
    assert main(["push", "fraud", "--from", "models:/fraud/3"]) == ExitCode.ERROR
    assert error_line(capsys) == "error: fraud version 2: its import was cancelled"


def test_an_import_still_running_at_the_timeout_exits_5(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    imports(portal, [{}])

    assert main(["push", "fraud", "--from", "models:/fraud/3", "--timeout", "0.1"]) == ExitCode.TIMEOUT
    assert "to be imported and validated (status importing)" in error_line(capsys)


@pytest.mark.parametrize(("argv", "message"), [
    (["--from", "models:/fraud"], "an MLflow model is models:/NAME/VERSION or models:/NAME@ALIAS"),
    (["--from", "models:/fraud/3/extra"], "an MLflow model is models:/NAME/VERSION"),
    (["--from", "hf://name-without-org"], "a Hugging Face model is hf://ORG/REPO"),
    (["--from", "hf://org/name@"], "a Hugging Face model is hf://ORG/REPO"),
    (["--from", "s3://bucket"], "an S3 object is s3://BUCKET/KEY"),
    (["--from", "https:///path"], "the URL has no host"),
    (["--from", "ftp://host/file"], "use models:/NAME/VERSION, models:/NAME@ALIAS, hf://ORG/REPO[@REVISION]"),
    (["--from", "s3://bucket/key", "--file", "a.onnx"], "--file picks files of a Hugging Face repository"),
    (["--from", "hf://org/name", "--file", "../secret"], "--file '../secret': name a file inside the repository"),
    (["model.onnx", "--from", "models:/fraud/3"], "give either a file to upload or --from, not both"),
    ([], "push needs a file to upload, or --from"),
    (["model.onnx", "--new-version"], "--file and --new-version go with --from"),
])
def test_a_malformed_from_is_a_usage_error_before_any_request(
    portal: FakePortal, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["push", "fraud", *argv]) == ExitCode.USAGE
    assert message in error_line(capsys)
    assert not portal.requests
