"""The upload-and-deploy flow in a real headless Chromium (Debian's package, driven by Playwright) against the
real portal: uvicorn, a Celery worker and beat, and Triton. Screenshots of the main pages go to a temporary folder,
or to docs/screenshots/ (the README's pictures) with `make screenshots`: a plain `make test` leaves tracked files as
they are.

test_the_newcomer_path walks what a new user does in the first ten minutes (issue 14): the sample button, Try it,
the curl snippet run as copied, a pipeline created from its JSON, deployed and tried with the sample PNG, and the
same pages at phone width. test_each_kind_of_bad_file_says_what_it_is_and_leaves_nothing and
test_tune_apply_lists_its_changes_and_asks_before_narrowing prove issue 25 ("Nothing silent") on the page."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.browser import sign_in
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.browser, pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(os.environ.get("MODELPORT_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "modelport-screenshots")


@pytest.fixture
def alice_user(transactional_db: Any) -> Person:
    return make_person("alice", "acme", role="admin")


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def upload(page: Any, portal_url: str, model: str, path: Path) -> None:
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.fill("#id_name", model)
    page.set_input_files("#id_file", str(path))
    page.click("#upload-submit")


def test_sign_in_upload_deploy_try_it_and_stop(browser: Any, alice_user: Person, portal_url: str,
                                               tmp_path: Path) -> None:
    from models_registry.samples import digits_holdout, make_digits_onnx

    sample = tmp_path / "digits.onnx"
    make_digits_onnx(sample)
    page = sign_in(browser, portal_url, "alice")

    upload(page, portal_url, "digits", sample)
    page.wait_for_function("document.getElementById('upload-progress').value >= 100")
    page.wait_for_selector("#upload-deploy:not([hidden])", timeout=60_000)
    assert "ready" in page.inner_text("#upload-result")
    assert "input" in page.inner_text("#upload-signature")
    shot(page, "upload")

    page.click("#upload-deploy")
    page.wait_for_selector("#deploy-form")
    page.fill("#id_name", "digits-prod")
    if not page.is_checked("#id_m0-dynamic_batching"):
        page.check("#id_m0-dynamic_batching")
    page.fill("#id_m0-max_queue_delay_microseconds", "2000")
    shot(page, "deploy-form")
    page.click("#deploy-submit")
    page.wait_for_url(f"{portal_url}/deployments/digits-prod/")
    # No reload: the live status turns ready by itself.
    page.wait_for_function("document.getElementById('status-badge').textContent.trim().toLowerCase() === 'ready'",
                           timeout=120_000)
    settings = Deployment.objects.get(name="digits-prod").revision.spec.to_json()["models"][0]
    assert settings["dynamic_batching"]["max_queue_delay_microseconds"] == 2000

    X, y = digits_holdout()
    request = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                           "data": [float(v) for v in np.asarray(X[0], dtype=np.float32)]}]}
    page.fill("#try-it-input", json.dumps(request))
    page.click("#try-it-send")
    page.wait_for_function("document.getElementById('try-it-output').textContent.includes('label')")
    output = page.inner_text("#try-it-output")
    label = json.loads(output)["outputs"]
    predicted = next(o for o in label if o["name"] == "label")["data"][0]
    assert predicted == int(y[0])
    assert "ms" in page.inner_text("#try-it-latency")

    # Edit settings: revision 2 rolls out while revision 1 serves, and the page says so.
    page.click("#deployment-edit")
    page.fill("#id_m0-max_queue_delay_microseconds", "10000000")
    assert "Check this value: 10,000,000." in page.inner_text("#id_m0-max_queue_delay_microseconds_warning")
    page.fill("#id_m0-max_queue_delay_microseconds", "3000")
    assert page.is_hidden("#id_m0-max_queue_delay_microseconds_warning")
    page.fill("#id_m0-instance_count", "2")
    page.click("#deploy-submit")
    page.wait_for_url(f"{portal_url}/deployments/digits-prod/")
    # A new Triton takes seconds to start: the page shows the rollout while r1 keeps serving.
    assert "updating (serving r1)" in page.inner_text("#status-badge")
    assert page.is_visible("#try-it-send")
    page.wait_for_function("document.getElementById('status-badge').textContent.trim() === 'ready'"
                           " && document.getElementById('deployment-revision').textContent.trim() === 'r2'",
                           timeout=120_000)
    page.reload()
    history = page.inner_text("#revision-history")
    assert "digits: queue delay 2,000 µs (2 ms) → 3,000 µs (3 ms)" in history
    assert "digits: 1 CPU instance → 2 CPU instances" in history
    settings_text = page.inner_text("#settings-digits")
    assert "3,000 µs" in settings_text and "2 CPU instances" in settings_text

    page.goto(f"{portal_url}/models/")
    shot(page, "models")

    page.goto(f"{portal_url}/deployments/digits-prod/")
    # A plain form POST: wait for the page it redirects to, else the status is looked for on a page half replaced.
    with page.expect_navigation():
        page.click("#deployment-stop")
    page.wait_for_function("document.getElementById('status-badge').textContent.trim().toLowerCase() === 'stopped'",
                           timeout=60_000)
    assert Deployment.objects.get(name="digits-prod").desired_state == "stopped"


def test_an_upload_interrupted_half_way_resumes(browser: Any, alice_user: Person, portal_url: str,
                                                tmp_path: Path) -> None:
    from tests.artifacts import tiny_onnx

    big = tmp_path / "wide.onnx"
    big.write_bytes(tiny_onnx(in_features=64, out_features=50_000))  # ~12.8 MB: three 5 MiB chunks
    page = sign_in(browser, portal_url, "alice")
    dropped: list[str] = []

    def drop_second_patch(route: Any) -> None:
        if (route.request.method == "PATCH" and route.request.headers.get("upload-offset") not in (None, "0")
                and not dropped):
            dropped.append(route.request.headers["upload-offset"])
            route.abort("connectionreset")  # the network drops mid-upload
        else:
            route.continue_()

    page.route("**/api/v1/uploads/**", drop_second_patch)
    upload(page, portal_url, "wide", big)
    page.wait_for_selector("#upload-deploy:not([hidden])", timeout=120_000)
    assert dropped, "the test did not interrupt the upload"
    version = ModelVersion.objects.get(model__name="wide")
    assert version.status == "ready"
    assert version.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()


def test_another_teams_user_cannot_reach_the_deployment_page(browser: Any, alice_user: Person, portal_url: str) -> None:
    from tests.support.versions import make_ready_version

    make_ready_version(alice_user)
    response = alice_user.client().post("/api/v1/deployments/",
                                        {"name": "digits-prod", "models": [{"model": "digits"}]},
                                        format="json")
    assert response.status_code == 201
    make_person("charlie", "globex")
    page = sign_in(browser, portal_url, "charlie")
    answer = page.goto(f"{portal_url}/deployments/digits-prod/")
    assert answer.status == 404
    assert page.query_selector("#status-badge") is None  # nothing of the deployment is shown
    page.goto(f"{portal_url}/tokens/")
    shot(page, "tokens")


def test_a_new_token_is_shown_once_and_failed_sign_ins_are_throttled(browser: Any, alice_user: Person,
                                                                     portal_url: str) -> None:
    """In a real browser: the one-time display crosses the redirect through its cookie (path /tokens/, SameSite
    Strict, HttpOnly), and the sign-in page answers 429 with the reason past the failures of an account."""
    import uuid

    from accounts.models import ApiToken, hash_token

    page = sign_in(browser, portal_url, "alice")
    page.goto(f"{portal_url}/tokens/")
    assert "Tokens live at most 365 days" in page.inner_text("#token-lifetime")
    page.fill("#id_name", "ci")
    page.check("#id_manage_tokens")
    page.click("#token-create")
    raw = page.inner_text("#new-token-value")
    token = ApiToken.objects.get(name="ci")
    assert hash_token(raw) == token.digest
    assert token.scopes == ["tokens"]
    assert not [c for c in page.context.cookies() if c["name"] == "modelport_new_token"]  # the pad is gone
    page.reload()
    assert page.query_selector("#new-token") is None

    # A made-up account (counters may be shared through Redis in CI: never lock out alice).
    guessed = f"nobody-{uuid.uuid4().hex[:8]}"
    guesser = browser.new_context().new_page()
    statuses = []
    for _ in range(6):
        guesser.goto(f"{portal_url}/login/")
        guesser.fill("#id_username", guessed)
        guesser.fill("#id_password", "wrong")
        with guesser.expect_navigation() as navigation:
            guesser.click("#login-submit")
        statuses.append(navigation.value.status)
    assert statuses == [200] * 5 + [429]
    assert "Too many failed sign-ins for this account" in guesser.inner_text("#login-throttled")
    guesser.context.close()


def test_a_refused_first_upload_leaves_no_model(browser: Any, alice_user: Person, portal_url: str,
                                                tmp_path: Path) -> None:
    """The page created the model before uploading: a refused file left an empty model behind. Now the model comes
    with its first version, and a bad name is caught before any byte is sent."""
    from models_registry.models import Model, Upload

    notes = tmp_path / "notes.txt"
    notes.write_text("hello, not a model\n")
    page = sign_in(browser, portal_url, "alice")
    upload(page, portal_url, "Bad Name", notes)
    page.wait_for_selector("#id_name_error")
    assert "is not a valid name" in page.inner_text("#id_name_error")
    assert not Upload.objects.exists()  # refused before the upload started
    page.fill("#id_name", "notes")
    page.click("#upload-submit")
    page.wait_for_selector("#id_file_error", timeout=60_000)
    assert "but it is text, not a model" in page.inner_text("#id_file_error")
    assert not Model.objects.filter(name="notes").exists()


def test_the_streams_checkbox_is_sent_and_its_refusal_on_an_onnx_file_shown_beside_it(
    browser: Any, alice_user: Person, portal_url: str, digits_onnx: Path
) -> None:
    """Issue 33: the page's script sends the checkbox as the API's decoupled=true, and the API's 400 for a format
    that cannot stream lands beside the checkbox, with no model left behind."""
    from models_registry.models import Model

    page = sign_in(browser, portal_url, "alice")
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.fill("#id_name", "digits")
    page.set_input_files("#id_file", str(digits_onnx))
    page.check("#id_decoupled")
    page.click("#upload-submit")
    page.wait_for_selector("#id_decoupled_error", timeout=60_000)
    shown = page.inner_text("#id_decoupled_error")
    assert "decoupled=true is for python models only" in shown and "ONNX" in shown
    assert not Model.objects.filter(name="digits").exists()


# --- The first ten minutes of a new user (issue 14) -----------------------------------------------------------

NO_HORIZONTAL_OVERFLOW = "document.documentElement.scrollWidth <= window.innerWidth"


def wait_ready(page: Any, timeout: int = 180_000) -> None:
    """The live status turns ready by itself, without a reload."""
    page.wait_for_function("document.getElementById('status-badge').textContent.trim() === 'ready'", timeout=timeout)


def wait_output(page: Any, text: str, timeout: int = 60_000) -> str:
    page.wait_for_function(f"document.getElementById('try-it-output').textContent.includes({json.dumps(text)})",
                           timeout=timeout)
    return str(page.inner_text("#try-it-output"))


def test_the_newcomer_path(browser: Any, alice_user: Person, portal_url: str, grpc_gateway: Any,
                           tmp_path: Path) -> None:
    """Sample button -> Try it -> the curl snippet copied and run -> a pipeline created from its JSON in the UI ->
    deployed -> Try it with the sample PNG; then the dashboard and deployment page at phone width."""
    from models_registry.samples import (
        SAMPLE_DIGIT_LABEL,
        make_digits_pipeline_json,
        make_postprocess_zip,
        make_preprocess_zip,
    )

    page = sign_in(browser, portal_url, "alice")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=portal_url)
    assert page.is_visible("#sample-digits") and page.is_visible("#sample-pipeline")
    assert "local runtime serves ONNX" in page.inner_text("#empty-state")
    assert page.get_attribute("link[rel=icon]", "href") == "/static/img/favicon.svg"
    shot(page, "dashboard-empty")

    # 1. One click: the sample classifier is uploaded, inspected and deployed; Try it opens once it serves. The click
    # lands at once on a page that follows each step the worker takes (it used to show nothing for 22 s).
    page.click("#sample-digits")
    page.wait_for_url(f"{portal_url}/samples/digits/", timeout=15_000)
    page.wait_for_selector("#sample-steps")
    assert "Model digits" in page.inner_text("#sample-steps")
    assert "Deployment digits" in page.inner_text("#sample-steps")
    shot(page, "sample-progress")
    page.wait_for_url(f"{portal_url}/deployments/digits/", timeout=120_000)
    assert "Created the sample models in your team and the deployment digits." in page.inner_text("main")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    assert "in a moment" not in page.inner_text("main")
    wait_ready(page)
    page.wait_for_selector("#try-it:not([hidden])")
    assert page.is_hidden("#try-it-waiting")
    assert page.query_selector("#deployment-retry") is None and page.is_visible("#deployment-stop")
    page.click("#try-it-send")
    output = json.loads(wait_output(page, "label"))
    label = next(o for o in output["outputs"] if o["name"] == "label")
    assert label["data"] == [SAMPLE_DIGIT_LABEL]  # the held-out 7 the panel holds
    # The signature shows what Triton answered: label [-1] comes back [1, 1], and the page says [-1, 1].
    assert label["shape"] == [1, 1]
    shot(page, "deployment")
    signature = page.text_content("#signature-digits") or ""
    assert "-1 × 1" in signature and "the model declares -1" in signature

    # 2. Copy the curl snippet: "Copied" only because the clipboard took it.
    page.click("#copy-curl-digits")
    page.wait_for_function("document.getElementById('copy-curl-digits').textContent === 'Copied'")
    curl = page.evaluate("navigator.clipboard.readText()")
    assert curl == page.inner_text("#snippet-curl-digits")
    # ... and run it as copied, after one `export MODELPORT_TOKEN=...` (a token made on the API tokens page).
    page.goto(f"{portal_url}/tokens/")
    page.fill("#id_name", "shell")
    page.click("#token-create")
    token = page.inner_text("#new-token-value")
    ran = subprocess.run(["bash", "-c", f"export MODELPORT_TOKEN={token}\n{curl}"], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert next(o for o in answer["outputs"] if o["name"] == "label")["data"] == [SAMPLE_DIGIT_LABEL]
    # The Python snippet as shown, and its gRPC twin against this test's gRPC gateway: the same 7, not zeros' 4.
    from web import grpc_snippet

    page.goto(f"{portal_url}/deployments/digits/")
    python = page.inner_text("#snippet-python-digits")
    for code in (python, grpc_snippet.python_grpc_snippet(python, grpc_gateway.address, False, "digits")):
        ran = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MODELPORT_TOKEN": token},
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[0] == f"[[{SAMPLE_DIGIT_LABEL}]]", ran.stdout
    # Both samples stay one click away on the dashboard now that the team has a model.
    page.goto(f"{portal_url}/")
    page.wait_for_selector("#deployments-table")
    assert page.inner_text("#sample-digits") == "Open the sample digits classifier"
    assert page.inner_text("#sample-pipeline") == "Deploy the sample image pipeline"

    # A canary from the edit form, with its guardrails; the panel compares both revisions since it began.
    page.goto(f"{portal_url}/deployments/digits/edit/")
    page.wait_for_selector("#deploy-form")
    assert page.input_value("#id_canary_window_seconds") == "120"
    assert page.input_value("#id_canary_min_requests") == "100"
    # The local runtime has no GPU: the instance kind does not offer one.
    assert page.get_attribute("#id_m0-instance_kind option[value=gpu]", "disabled") is not None
    assert page.input_value("#id_m0-instance_kind") == "cpu"
    page.fill("#id_m0-instance_count", "2")
    page.fill("#id_canary_percent", "20")
    page.fill("#id_canary_window_seconds", "300")
    page.fill("#id_canary_min_requests", "200")
    page.fill("#id_canary_max_error_percent", "2")
    page.click("#deploy-submit")
    page.wait_for_url(f"{portal_url}/deployments/digits/")
    page.wait_for_selector("#canary-panel")
    assert "2.0% errors" in page.inner_text("#canary-guardrails-note")
    assert "over 300 s (errors judged from 200 canary requests" in page.inner_text("#canary-guardrails-note")
    page.wait_for_selector("#canary-promote", timeout=120_000)  # it serves
    # Once it serves, what the guardrails judge on the figures so far (nothing yet: no requests).
    page.wait_for_selector("#canary-judged")
    assert "p99 not judged: 0 of the 200 requests needed" in page.inner_text("#canary-judged")
    assert "since the canary began serving" in page.inner_text("#canary-since")
    page.click("#canary-rollback")
    page.wait_for_function("!document.getElementById('canary-panel')", timeout=60_000)
    # Triton's own metadata agrees with the signature the page shows.
    metadata = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {token}",
                               f"{portal_url}/serve/digits/v2/models/digits"], capture_output=True, text=True,
                              timeout=60)
    served = {t["name"]: t["shape"] for t in json.loads(metadata.stdout)["outputs"]}
    assert served == {"label": [-1, 1], "probabilities": [-1, 10]}
    # Without a clipboard (plain http on another host): the text is selected and the button says how to copy.
    plain = browser.new_context(viewport={"width": 1280, "height": 900})
    plain.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    other = plain.new_page()
    other.goto(f"{portal_url}/login/")
    other.fill("#id_username", "alice")
    other.fill("#id_password", "password")
    other.click("#login-submit")
    other.goto(f"{portal_url}/deployments/digits/")
    other.wait_for_selector("body[data-js=ready]", state="attached")
    other.click("#copy-curl-digits")
    assert other.inner_text("#copy-curl-digits") == "Press Ctrl+C"
    assert other.evaluate("window.getSelection().toString()") == curl
    # Download req.json holds what Try it holds; the CLI snippet reads it.
    with other.expect_download() as download:
        other.click(".snippet:has(#snippet-cli-digits) .download-request")
    request_file = tmp_path / "req.json"
    download.value.save_as(str(request_file))
    assert json.loads(request_file.read_text()) == json.loads(other.input_value("#try-it-input"))
    plain.close()

    # Before a TensorRT plan goes up for a laptop, the page says the local runtime cannot serve it.
    (tmp_path / "engine.plan").write_bytes(b"\0" * 64)
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    from web.serving import serving

    note = page.inner_text("#serving-note")
    assert note == serving().note()  # what the deploy path accepts here (with or without the framework extras)
    assert "local runtime serves ONNX" in note and "TensorRT plans" in note.split("serves", 1)[1].split(".", 1)[1]
    page.set_input_files("#id_file", str(tmp_path / "engine.plan"))
    page.wait_for_selector("#format-warning:not([hidden])")
    assert "A TensorRT plan cannot be served by this portal's local runtime" in page.inner_text("#format-warning")

    # 3. The pipeline's python steps through the upload page: the signature editor opens for a .zip, and the
    # .signature.json beside it is imported.
    make_preprocess_zip(tmp_path / "preprocess.zip")
    make_postprocess_zip(tmp_path / "postprocess.zip")
    make_digits_pipeline_json(tmp_path / "digits-pipeline.json")
    # A new model's name is checked without asking the API for a model that does not exist (a 404 in the console).
    not_found: list[str] = []
    page.on("response", lambda response: not_found.append(response.url) if response.status == 404 else None)
    for step in ("preprocess", "postprocess"):
        page.goto(f"{portal_url}/models/upload/")
        page.wait_for_selector("body[data-js=ready]", state="attached")
        page.fill("#id_name", step)
        page.set_input_files("#id_file", str(tmp_path / f"{step}.zip"))
        page.wait_for_selector("#signature-editor:not([hidden])")
        page.set_input_files("#signature-import", str(tmp_path / f"{step}.signature.json"))
        page.wait_for_function("document.getElementById('id_signature').value !== ''")
        expected = json.loads((tmp_path / f"{step}.signature.json").read_text())
        assert json.loads(page.input_value("#id_signature")) == expected
        page.click("#upload-submit")
        page.wait_for_selector("#upload-deploy:not([hidden])", timeout=60_000)
    assert not not_found, not_found
    # The same bytes again, and a signature that differs from version 1's: both said before anything is sent.
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.fill("#id_name", "preprocess")
    page.set_input_files("#id_file", str(tmp_path / "preprocess.zip"))
    page.wait_for_selector("#same-bytes:not([hidden])")
    assert "Version 1 of preprocess has exactly these bytes already" in page.inner_text("#same-bytes")
    changed = json.loads((tmp_path / "preprocess.signature.json").read_text())
    changed["outputs"][0]["dims"] = [-1, 32]
    (tmp_path / "changed.signature.json").write_text(json.dumps(changed))
    page.set_input_files("#signature-import", str(tmp_path / "changed.signature.json"))
    page.wait_for_selector("#signature-diff:not([hidden])")
    assert "output input: FP32 -1 × 64 → FP32 -1 × 32" in page.inner_text("#signature-diff")
    page.click("#upload-submit")
    assert page.inner_text("#upload-submit") == "Upload anyway"
    assert ModelVersion.objects.filter(model__name="preprocess").count() == 1  # nothing sent

    # 4. The pipeline from its JSON: drawn before saving, errors beside their step, then created and deployed.
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    broken = json.loads((tmp_path / "digits-pipeline.json").read_text())
    broken["steps"][1]["input_map"] = {"input": "pixels"}
    page.click("#pipeline-paste")
    assert page.is_hidden("#drop-zone")  # a pipeline has no file
    page.fill("#id_name", "digits-pipeline")
    page.fill("#pipeline-definition", json.dumps(broken))
    page.wait_for_selector("#pipeline-problems")
    assert "Step 2 · digits" in page.inner_text("#pipeline-problems")
    assert "input input" in page.inner_text("#pipeline-problems")
    assert page.query_selector("#pipeline-preview .pipeline-step.has-error[data-step='1']") is not None
    page.set_input_files("#id_file", str(tmp_path / "digits-pipeline.json"))  # the file replaces what was pasted
    page.wait_for_selector("#pipeline-valid")
    assert page.inner_text("#upload-submit") == "Create the pipeline"
    assert page.evaluate("(() => { const f = document.querySelector('#pipeline-preview figure');"
                         " const s = f.querySelector('.diagram-across svg').getBoundingClientRect();"
                         " return s.width > 0 && s.right <= f.getBoundingClientRect().right + 1; })()")
    shot(page, "pipeline")
    page.click("#upload-submit")
    page.wait_for_selector("#upload-deploy:not([hidden])")
    # Saved once: the button cannot make a second, identical version.
    assert page.is_disabled("#upload-submit") and page.inner_text("#upload-submit") == "Pipeline created"
    page.click("#upload-deploy")
    page.wait_for_selector("#deploy-form")
    assert page.query_selector("#id_m0-instance_count") is None and page.is_visible("#m0-pipeline-settings")
    assert page.is_hidden("#field-replicas") and page.is_visible("#local-runtime-note")
    assert page.get_attribute("option[value=kubernetes]", "disabled") is not None
    page.fill("#id_m0-max_batch_size", "1000000")
    assert "A batch this large must fit in memory" in page.inner_text("#id_m0-max_batch_size_warning")
    page.fill("#id_m0-max_batch_size", "64")
    shot(page, "deploy-form-pipeline")
    page.click("#deploy-submit")
    page.wait_for_url(f"{portal_url}/deployments/digits-pipeline/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    wait_ready(page)
    page.wait_for_selector("#try-it:not([hidden])")
    page.click("#try-it-use-sample-digits-pipeline")
    page.wait_for_function("document.getElementById('try-it-file-digits-pipeline-image').files.length === 1")
    page.click("#try-it-send")
    output = json.loads(wait_output(page, "labels"))
    labels = next(o for o in output["outputs"] if o["name"] == "labels")
    assert labels["data"][0] == str(SAMPLE_DIGIT_LABEL)
    # The pipeline's curl comes first, its other snippets and its steps' folded away: Try it no longer sits below
    # sixteen snippets, 8,600 px down the page. The whole page was still 3,385 px once its charts and log had
    # loaded: the Try it box ten rows tall for one line, the Tune panel's three fields stacked, the events up to
    # 22 rem and the log, open while it serves, 24 rem. Now under 3,000 px (2,654 here;
    # 2,860 with the performance panel, whose table waits for two readings of Triton's statistics: 3,097 with it
    # full of dashes).
    page.reload()
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.wait_for_function("!document.getElementById('triton-log').textContent.includes('Loading')")
    metrics = page.evaluate("({height: document.body.scrollHeight, tryIt: Math.round("
                            "document.getElementById('try-it-section').getBoundingClientRect().top + scrollY)})")
    print("pipeline page", metrics)
    assert metrics["tryIt"] < 1500 and metrics["height"] < 3000, metrics
    assert page.is_hidden("#triton-log")  # folded while it serves
    assert page.is_visible("#snippet-curl-digits-pipeline") and page.is_hidden("#snippet-python-digits-pipeline")
    assert page.is_hidden("#snippet-curl-preprocess")
    page.click("#pipeline-steps > summary")
    assert page.is_visible("#snippet-curl-preprocess")
    page.click("#more-snippets-digits-pipeline > summary")
    assert page.is_visible("#snippet-python-digits-pipeline")
    # Its curl snippet posts the sample PNG and answers the 7 as copied (it used to send an empty image: a 400).
    curl = page.inner_text("#snippet-curl-digits-pipeline")
    ran = subprocess.run(["bash", "-c", f"export MODELPORT_TOKEN={token}\n{curl}"], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert next(o for o in answer["outputs"] if o["name"] == "labels")["data"][0] == str(SAMPLE_DIGIT_LABEL), answer
    # Its Python snippet sends the same PNG (it sent b"", a 400) and prints the 7 first.
    python = page.inner_text("#snippet-python-digits-pipeline")
    ran = subprocess.run([sys.executable, "-c", python], env={**os.environ, "MODELPORT_TOKEN": token},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"[[b'{SAMPLE_DIGIT_LABEL}'"), ran.stdout
    # Its CLI snippet writes the same PNG and sends it with --file (it read a req.json whose image was empty), run
    # as shown in an empty folder, `modelport` being the CLI of this checkout.
    cli = page.inner_text("#snippet-cli-digits-pipeline")
    assert "--file image=digit-7.png" in cli and "req.json" not in cli
    shell = tmp_path / "shell"
    (shell / "bin").mkdir(parents=True)
    (shell / "bin" / "modelport").write_text(f'#!/bin/sh\nexec {sys.executable} -m modelport_cli "$@"\n')
    (shell / "bin" / "modelport").chmod(0o755)
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", cli], cwd=shell, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MODELPORT_TOKEN": token,
                                          "PATH": f"{shell / 'bin'}:{os.environ['PATH']}",
                                          "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert ran.returncode == 0, ran.stderr
    assert any(line.startswith(f'labels (BYTES [1x3]): ["{SAMPLE_DIGIT_LABEL}"')
               for line in ran.stdout.splitlines()), ran.stdout
    # Settings in effect say the pipeline batches in its steps; the log has the CPU-only GPU lines folded away.
    assert "each step batching with its own settings" in page.inner_text("#settings-digits-pipeline")
    page.wait_for_function("!document.getElementById('triton-log').textContent.includes('Loading')")
    assert "has not started" not in page.inner_text("#triton-log")
    assert "NVML" not in page.inner_text("#triton-log")

    # 5. Traffic: a request Triton refuses shows as a status code; the dashboard counts the same window.
    page.fill("#try-it-input",
              '{"inputs": [{"name": "image", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}')
    page.set_input_files("#try-it-file-digits-pipeline-image", [])
    page.click("#try-it-send")
    page.wait_for_function("document.getElementById('try-it-latency').textContent.startsWith('HTTP 4')")
    page.reload()
    page.wait_for_function("document.getElementById('metrics-codes') && "
                           "!document.getElementById('metrics-codes').hidden"
                           " && document.getElementById('metrics-codes').textContent.includes('HTTP 400')",
                           timeout=60_000)
    assert "last 5 minutes" in page.inner_text("#metrics-summary")

    page.goto(f"{portal_url}/")
    page.wait_for_selector("#deployments-table")
    assert "(last 5 min)" in page.inner_text("#deployments-table thead")
    shot(page, "dashboard")

    # 6. At phone width: nothing overflows the page, the wide table says it scrolls, the diagram fits.
    phone = sign_in(browser, portal_url, "alice", width=390, height=844)
    phone.wait_for_selector("#deployments-table")
    phone.wait_for_selector("body[data-js=ready]", state="attached")
    assert phone.evaluate(NO_HORIZONTAL_OVERFLOW)
    phone.wait_for_selector(".table-wrap[data-overflowing] + .scroll-hint", state="visible")
    shot(phone, "dashboard-phone")
    for path in ("/deployments/digits/", "/deployments/digits-pipeline/", "/models/digits-pipeline/"):
        phone.goto(f"{portal_url}{path}")
        phone.wait_for_selector("body[data-js=ready]", state="attached")
        assert phone.evaluate(NO_HORIZONTAL_OVERFLOW), path
    assert phone.is_visible(".pipeline-diagram .diagram-down svg")
    assert phone.is_hidden(".pipeline-diagram .diagram-across")
    assert phone.evaluate("(() => { const f = document.querySelector('.pipeline-diagram');"
                          " const s = f.querySelector('.diagram-down svg').getBoundingClientRect();"
                          " const svg = f.querySelector('.diagram-down svg');"
                          " return s.right <= f.getBoundingClientRect().right + 1"
                          "   && s.width / svg.viewBox.baseVal.width >= 0.85; })()")  # the text stays readable
    phone.goto(f"{portal_url}/deployments/digits-pipeline/")
    phone.wait_for_selector("body[data-js=ready]", state="attached")
    shot(phone, "deployment-phone")


def echo_text_onnx(path: Path) -> None:
    """An ONNX model that answers its text input as it came: STRING [-1, 1] in and out (BYTES to Triton)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["text"], ["echo"])], "echo",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])],
                              [helper.make_tensor_value_info("echo", TensorProto.STRING, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def test_try_it_offers_a_text_box_for_a_text_input(browser: Any, alice_user: Person, portal_url: str,
                                                    tmp_path: Path) -> None:
    """A BYTES input that takes text had only a file picker: a text box writes the text into the request."""
    echo_text_onnx(tmp_path / "echo.onnx")
    page = sign_in(browser, portal_url, "alice")
    upload(page, portal_url, "echo", tmp_path / "echo.onnx")
    page.wait_for_selector("#upload-deploy:not([hidden])", timeout=60_000)
    page.click("#upload-deploy")
    page.wait_for_selector("#deploy-form")
    page.fill("#id_name", "echo")
    page.click("#deploy-submit")
    page.wait_for_url(f"{portal_url}/deployments/echo/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    wait_ready(page)
    page.wait_for_selector("#try-it:not([hidden])")
    page.fill("#try-it-text-echo-text", "héllo, Triton")
    request = json.loads(page.input_value("#try-it-input"))
    assert request["inputs"][0]["data"] == ["héllo, Triton"]
    page.click("#try-it-send")
    output = json.loads(wait_output(page, "echo"))
    assert output["outputs"][0]["data"] == ["héllo, Triton"], output


def test_the_upload_form_takes_an_example_request_and_says_what_is_wrong_with_a_bad_one(
        browser: Any, alice_user: Person, portal_url: str, tmp_path: Path) -> None:
    """Issue 31, item 1: the API and the CLI took an example request, the upload page had no field for it. Through
    the page: text that is no JSON is refused beside the field in the API's words, before any version exists; a
    request of the wrong datatype is refused at inspection (an ONNX file carries its signature), beside the field
    too; a good one imported from a file goes up with the version and shows on the model's page. No 500 anywhere."""
    echo_text_onnx(tmp_path / "echo.onnx")
    errors: list[str] = []
    page = sign_in(browser, portal_url, "alice")
    page.on("response", lambda response: errors.append(response.url) if response.status >= 500 else None)
    upload_page = f"{portal_url}/models/upload/"
    page.goto(upload_page)
    page.wait_for_selector("body[data-js=ready]", state="attached")
    assert page.is_hidden("#id_example_request")  # folded: most models need none
    page.fill("#id_name", "echo")
    page.set_input_files("#id_file", str(tmp_path / "echo.onnx"))
    page.click("#example-request > summary")
    page.fill("#id_example_request", "{not json")
    page.click("#upload-submit")
    page.wait_for_selector("#id_example_request_error", timeout=60_000)
    assert page.inner_text("#id_example_request_error").startswith("The example request is not JSON (")
    assert not ModelVersion.objects.filter(model__name="echo").exists()

    wrong = {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    page.fill("#id_example_request", json.dumps(wrong))
    page.click("#upload-submit")
    page.wait_for_selector("#id_example_request_error:has-text('FP32')", timeout=60_000)  # not the first one's
    said = "inputs[0] ('text').datatype is 'FP32'; the signature declares BYTES."
    assert page.inner_text("#id_example_request_error") == said
    assert said in page.inner_text("#upload-error")
    assert ModelVersion.objects.get(model__name="echo", number=1).status == "invalid"

    good = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["héllo"]}]}
    (tmp_path / "example.json").write_text(json.dumps(good, ensure_ascii=False), encoding="utf-8")
    page.set_input_files("#example-request-import", str(tmp_path / "example.json"))
    page.wait_for_function("document.getElementById('id_example_request').value.includes('héllo')")
    page.click("#upload-submit")
    page.wait_for_selector("#upload-deploy:not([hidden])", timeout=60_000)
    assert "Uploaded with its example request, checked against the signature." in page.inner_text("#upload-signature")
    version = ModelVersion.objects.get(model__name="echo", number=2)
    assert version.status == "ready" and version.example_data() == {"text": ["héllo"]}
    page.goto(f"{portal_url}/models/echo/")
    assert (page.inner_text("#version-2-example")
            == "Uploaded with an example request (text BYTES 1 × 1), checked against the signature.")
    assert not errors, errors


def test_the_deploy_form_offers_a_shared_pool_with_what_fits(browser: Any, alice_user: Person, portal_url: str) -> None:
    from deployments.models import ModelMemory
    from deployments.pools import fingerprint
    from tests.support.versions import make_ready_version

    version = make_ready_version(alice_user)
    ModelMemory.objects.create(version=version, fingerprint=fingerprint(), memory_bytes=300 * 2**20)
    page = sign_in(browser, portal_url, "alice")
    page.goto(f"{portal_url}/deployments/new/?model=digits")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    # Dedicated by default: the pool's fields stay hidden until Shared is chosen.
    assert page.is_checked("input[name=placement][value=dedicated]")
    assert not page.is_visible("#shared-fields")
    page.check("input[name=placement][value=shared]")
    page.wait_for_selector("#shared-fields", state="visible")
    assert "Shared: loads on demand, costs less" in page.inner_text("#field-placement")
    # Half the 2 GiB pool is the team's to take (POOL_TEAM_SHARE): 2 copies of 300 MiB reserved at 1.5 times.
    assert "fits 2 more (450 MiB each)" in page.inner_text("#pool-fit-shared")
    assert "fits 2 more" in page.inner_text("#id_pool option[value=shared]")
    # Each option's text fits in the select (the long ones were cut off: the list below says it all).
    assert page.evaluate("(() => { const s = document.getElementById('id_pool');"
                         " const c = document.createElement('canvas').getContext('2d');"
                         " c.font = getComputedStyle(s).font;"
                         " return Array.from(s.options).every(o => c.measureText(o.text).width < s.clientWidth - 40);"
                         " })()")
    page.check("input[name=placement][value=dedicated]")
    page.wait_for_selector("#shared-fields", state="hidden")


# --- Nothing silent (issue 25): a bad file of each kind, and a tune's Apply ----------------------------------

def bad_files(folder: Path) -> list[tuple[str, Path, str]]:
    """(model name, file, what the page must say the file is): one of each kind an uploader sends by mistake."""
    import zipfile

    from tests.artifacts import tiny_onnx

    folder.mkdir()
    text = folder / "text" / "model.onnx"
    text.parent.mkdir()
    text.write_text("hello, not a model\n")
    cut = folder / "cut" / "model.onnx"
    cut.parent.mkdir()
    whole = tiny_onnx()
    cut.write_bytes(whole[: len(whole) // 2])
    noise = folder / "noise" / "model.onnx"
    noise.parent.mkdir()
    noise.write_bytes(np.random.default_rng(25).bytes(3 * 2**20))  # seeded: no header of any format by chance
    data = folder / "data.zip"
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("README.md", "# Our model\n")
        archive.writestr("data.csv", "a,b\n1,2\n")
    return [
        ("text", text, "named 'model.onnx' but it is text, not a model (it starts with 'hello, not a model')"),
        ("cut", cut, f"an ONNX file cut off after {len(whole) // 2:,} bytes"),
        ("noise", noise, "named 'model.onnx' but it is 3.0 MB with no header of a format the portal reads"),
        ("data", data, "a zip archive with no model in it: no model.py (a Triton python model)"),
    ]


def test_each_kind_of_bad_file_says_what_it_is_and_leaves_nothing(browser: Any, alice_user: Person, portal_url: str,
                                                                 tmp_path: Path) -> None:
    """A text file named model.onnx, an ONNX cut off half way, megabytes of random bytes and a zip of a README and
    a CSV: each refused with its own words beside the file field, and no model or version left behind."""
    from models_registry.models import Model

    page = sign_in(browser, portal_url, "alice")
    shown: dict[str, str] = {}
    for name, path, expected in bad_files(tmp_path / "bad"):
        upload(page, portal_url, name, path)
        page.wait_for_selector("#id_file_error", timeout=60_000)
        shown[name] = page.inner_text("#id_file_error")
        assert expected in shown[name], (name, shown[name])
        assert page.is_hidden("#upload-deploy")
        assert not Model.objects.filter(name=name).exists(), name
        assert not ModelVersion.objects.filter(model__name=name).exists(), name
    assert len(set(shown.values())) == len(shown)  # four files, four messages: not one message for every bad file


TUNED = {"settings": {"instances": 2, "batching": True, "max_batch_size": 16, "queue_delay_us": 500},
         "label": "2 inst, batch 16, delay 500 µs", "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0,
         "concurrency": 4}


def finished_tune(deployment: Deployment) -> Any:
    """A tune as the worker leaves it when done (the search itself is tuning's own tests'): its results, frontier and
    a recommendation that lowers the max batch size from 64 to 16."""
    from tuning.models import TuneRun

    points = [{"concurrency": 1, "throughput": 100.0, "p50_ms": 5.0, "p99_ms": 8.0, "errors": 0},
              {"concurrency": 4, "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0, "errors": 0}]
    return TuneRun.objects.create(
        deployment=deployment, team=deployment.team, model_version=ModelVersion.objects.get(model__name="digits"),
        p99_target_ms=20, budget_seconds=60, status=TuneRun.Status.DONE, request_body={"inputs": []}, host="box",
        machine={"hostname": "box", "cpu_model": "Test CPU", "cores": 2, "gpu": "none"},
        results=[{"settings": TUNED["settings"], "label": TUNED["label"], "error": "", "meets_target": True,
                  "throughput": 300.0, "p50_ms": 9.0, "p99_ms": 15.0, "concurrency": 4, "errors": 0,
                  "points": points}],
        frontier=[{"throughput": p["throughput"], "p99_ms": p["p99_ms"], "concurrency": p["concurrency"]}
                  for p in points],
        recommendation=TUNED, message="Recommended.")


def test_tune_apply_lists_its_changes_and_asks_before_narrowing(browser: Any, alice_user: Person,
                                                               portal_url: str) -> None:
    """The Tune panel lists every setting Apply changes, before and after; the lower max batch size needs its own
    checkbox (the browser holds the form back without it, and the portal refuses it without it too); after Apply the
    deployment's new revision serves the tuned settings."""
    from deployments.models import Revision
    from tests.support.versions import make_ready_version

    make_ready_version(alice_user)
    response = alice_user.client().post("/api/v1/deployments/",
                                        {"name": "digits-prod", "models": [{"model": "digits"}]},
                                        format="json")
    assert response.status_code == 201
    deployment = Deployment.objects.get(name="digits-prod")
    page = sign_in(browser, portal_url, "alice")
    page.goto(f"{portal_url}/deployments/digits-prod/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    wait_ready(page)
    tune = finished_tune(deployment)
    page.reload()
    page.wait_for_selector("body[data-js=ready]", state="attached")
    changes = page.inner_text("#tune-changes").splitlines()
    assert changes == [
        "digits: max_batch_size 64 → 16 (a request of more than 16 rows, accepted today, would be refused with a 400)",
        "digits: max_queue_delay_microseconds 0 → 500",
        "digits: instances 1 → 2",
    ]
    assert page.get_attribute("#tune-changes li:first-child", "class") == "error"  # the narrowing one stands out

    # Unticked, Apply does not go: the browser says why at the checkbox, and no revision is made.
    page.click("#tune-apply")
    assert page.evaluate("document.getElementById('tune-apply-narrow').validationMessage") != ""
    assert page.url == f"{portal_url}/deployments/digits-prod/"
    assert Revision.objects.filter(deployment=deployment).count() == 1
    # A client that skips the checkbox (its `required` taken away) is refused by the portal, naming the change.
    page.evaluate("document.getElementById('tune-apply-narrow').removeAttribute('required')")
    with page.expect_navigation():
        page.click("#tune-apply")
    assert "would narrow what clients may send: digits: max_batch_size 64 → 16" in page.inner_text("main")
    assert Revision.objects.filter(deployment=deployment).count() == 1

    # Ticked, and left a few live refreshes long: the choice stays, and Apply makes revision 2.
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.check("#tune-apply-narrow")
    page.evaluate("window.liveRefreshes = 0; document.body.addEventListener('htmx:afterSettle',"
                  " () => { window.liveRefreshes += 1; })")
    page.wait_for_function("window.liveRefreshes >= 2", timeout=30_000)  # every 2 s
    assert page.is_checked("#tune-apply-narrow")
    shot(page, "tune-apply")
    with page.expect_navigation():
        page.click("#tune-apply")
    message = page.inner_text("main")
    assert "Revision 2 rolls out the tuned settings to every request once ready." in message
    assert "Changed: digits: max_batch_size 64 → 16" in message and "digits: instances 1 → 2" in message
    [entry] = Revision.objects.get(deployment=deployment, number=2).spec.models
    assert (entry.max_batch_size, entry.instance_group.count) == (16, 2)
    assert entry.dynamic_batching is not None and entry.dynamic_batching.max_queue_delay_microseconds == 500
    tune.refresh_from_db()
    assert tune.applied_revision == 2
    page.wait_for_function("document.getElementById('status-badge').textContent.trim() === 'ready'"
                           " && document.getElementById('deployment-revision').textContent.trim() === 'r2'",
                           timeout=180_000)
    page.wait_for_selector("#tune-applied")
    assert page.inner_text("#tune-applied") == "Applied as revision 2."
    settings = page.inner_text("#settings-digits")
    assert "max batch size 16" in settings and "2 CPU instances" in settings, settings


# Installed before Generate: every change of the streamed text is recorded with the panel's state, so that pieces
# arriving one read at a time (not one buffered answer) show as several lengths seen while it still streamed.
# `stopAfter`: Stop is clicked once that many pieces have arrived.
_WATCH_STREAM = """(stopAfter) => {
  const output = document.getElementById('try-stream-output');
  window.seen = [];
  new MutationObserver(() => {
    window.seen.push([output.textContent.length, output.dataset.state, Number(output.dataset.pieces)]);
    if (stopAfter && Number(output.dataset.pieces) >= stopAfter && output.dataset.state === 'streaming') {
      document.getElementById('try-stream-stop').click();
    }
  }).observe(output, {childList: true, characterData: true, subtree: true, attributes: true});
}"""


def test_the_sample_text_generator_streams_in_try_it_and_stops(browser: Any, alice_user: Person,
                                                                portal_url: str) -> None:
    """One click deploys the sample text generator; its Try it shows the pieces as they arrive through the real
    gateway from the real Triton, Stop ends a stream mid-way, and the curl snippet streams as copied."""
    page = sign_in(browser, portal_url, "alice")
    page.click("#sample-textgen")
    page.wait_for_url(f"{portal_url}/samples/textgen/", timeout=15_000)
    page.wait_for_url(f"{portal_url}/deployments/textgen/", timeout=180_000)
    page.wait_for_selector("body[data-js=ready]", state="attached")
    wait_ready(page)
    page.wait_for_selector("#try-stream:not([hidden])")
    assert page.query_selector("#try-it-send") is None  # no /infer Try it for a model that streams

    page.fill("#try-stream-prompt-textgen", "MENENIUS:\n")
    page.fill("#try-stream-max-tokens-textgen", "600")
    page.evaluate(_WATCH_STREAM, 0)
    page.click("#try-stream-generate")
    page.wait_for_function("document.getElementById('try-stream-output').dataset.state === 'done'", timeout=60_000)
    text = page.inner_text("#try-stream-output")
    assert page.get_attribute("#try-stream-output", "data-pieces") == "600"
    assert len(text.split()) > 100  # words of generated text, not an error
    seen = page.evaluate("window.seen")
    growing = sorted({length for length, state, _ in seen if state == "streaming" and 0 < length < len(text)})
    assert len(growing) >= 2, seen  # the text grew over at least two observations before it was whole
    assert "600 pieces in" in page.inner_text("#try-stream-status")
    shot(page, "try-it-stream")

    # Stop aborts the fetch after a few pieces: the stream ends there, far short of what was asked.
    page.fill("#try-stream-max-tokens-textgen", "1024")
    page.evaluate(_WATCH_STREAM, 3)
    page.click("#try-stream-generate")
    page.wait_for_function("document.getElementById('try-stream-output').dataset.state === 'stopped'",
                           timeout=60_000)
    assert int(page.get_attribute("#try-stream-output", "data-pieces") or 0) < 1024
    assert page.inner_text("#try-stream-status").startswith("Stopped after")
    assert page.is_enabled("#try-stream-generate") and not page.is_enabled("#try-stream-stop")

    # A bad setting: the model's own words arrive as the error.
    page.fill("#try-stream-max-tokens-textgen", "5000")
    page.click("#try-stream-generate")
    page.wait_for_function("document.getElementById('try-stream-output').dataset.state === 'failed'",
                           timeout=60_000)
    assert "max_tokens must be between 1 and 1024" in page.inner_text("#try-stream-output")

    # The curl snippet, run as copied after `export MODELPORT_TOKEN=...`, streams Server-Sent Events.
    curl = page.inner_text("#snippet-curl-stream-textgen")
    assert "curl -sS -N" in curl
    page.goto(f"{portal_url}/tokens/")
    page.fill("#id_name", "shell")
    page.click("#token-create")
    token = page.inner_text("#new-token-value")
    ran = subprocess.run(["bash", "-c", f"export MODELPORT_TOKEN={token}\n{curl}"], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line[len("data:"):]) for line in ran.stdout.splitlines() if line.startswith("data:")]
    assert len(events) > 1 and all(e["text_output"] for e in events), ran.stdout
