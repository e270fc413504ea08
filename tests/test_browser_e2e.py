"""The upload-and-deploy flow in a real headless Chromium (Debian's package, driven by Playwright) against the
real portal: uvicorn, a Celery worker and beat, and Triton. Screenshots of the main pages go to docs/screenshots/.

test_the_newcomer_path walks what a new user does in the first ten minutes (issue 14): the sample button, Try it,
the curl snippet run as copied, a pipeline created from its JSON, deployed and tried with the sample PNG, and the
same pages at phone width."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import Person, make_person
from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.markers import require

pytestmark = [pytest.mark.browser, pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require("browser", "drives a real browser")
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: `make browser-deps` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the tests' own database calls are still
    # synchronous and safe, so Django's async guard is told so (Django's documented escape hatch), for these
    # tests only.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield instance
            instance.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def alice_user(transactional_db: Any) -> Person:
    return make_person("alice", "acme", role="admin")


def sign_in(browser: Any, portal_url: str, username: str, width: int = 1280, height: int = 900) -> Any:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{portal_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "password")
    page.click("#login-submit")
    page.wait_for_url(f"{portal_url}/")
    return page


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def upload(page: Any, portal_url: str, model: str, path: Path) -> None:
    page.goto(f"{portal_url}/models/upload/")
    page.wait_for_selector("body[data-js=ready]", state="attached")
    page.fill("#id_name", model)
    page.set_input_files("#id_file", str(path))
    page.click("#upload-submit")


def test_sign_in_upload_deploy_try_it_and_stop(browser: Any, alice_user: Person, portal_url: str, tmp_path: Path) -> None:
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
    assert "3,000 µs" in page.inner_text("#settings-digits") and "2 CPU instances" in page.inner_text("#settings-digits")

    page.goto(f"{portal_url}/models/")
    shot(page, "models")

    page.goto(f"{portal_url}/deployments/digits-prod/")
    # A plain form POST: wait for the page it redirects to, else the status is looked for on a page half replaced.
    with page.expect_navigation():
        page.click("#deployment-stop")
    page.wait_for_function("document.getElementById('status-badge').textContent.trim().toLowerCase() === 'stopped'",
                           timeout=60_000)
    assert Deployment.objects.get(name="digits-prod").desired_state == "stopped"


def test_an_upload_interrupted_half_way_resumes(browser: Any, alice_user: Person, portal_url: str, tmp_path: Path) -> None:
    from tests.artifacts import tiny_onnx

    big = tmp_path / "wide.onnx"
    big.write_bytes(tiny_onnx(in_features=64, out_features=50_000))  # ~12.8 MB: three 5 MiB chunks
    page = sign_in(browser, portal_url, "alice")
    dropped: list[str] = []

    def drop_second_patch(route: Any) -> None:
        if route.request.method == "PATCH" and route.request.headers.get("upload-offset") not in (None, "0") and not dropped:
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
    from deployments.tests.conftest import make_ready_version

    make_ready_version(alice_user)
    response = alice_user.client().post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]},
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


def test_a_refused_first_upload_leaves_no_model(browser: Any, alice_user: Person, portal_url: str, tmp_path: Path) -> None:
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
    assert "detect the model format" in page.inner_text("#id_file_error")
    assert not Model.objects.filter(name="notes").exists()


# --- The first ten minutes of a new user (issue 14) -----------------------------------------------------------

NO_HORIZONTAL_OVERFLOW = "document.documentElement.scrollWidth <= window.innerWidth"


def wait_ready(page: Any, timeout: int = 180_000) -> None:
    """The live status turns ready by itself, without a reload."""
    page.wait_for_function("document.getElementById('status-badge').textContent.trim() === 'ready'", timeout=timeout)


def wait_output(page: Any, text: str, timeout: int = 60_000) -> str:
    page.wait_for_function(f"document.getElementById('try-it-output').textContent.includes({json.dumps(text)})",
                           timeout=timeout)
    return str(page.inner_text("#try-it-output"))


def test_the_newcomer_path(browser: Any, alice_user: Person, portal_url: str, tmp_path: Path) -> None:
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

    # 1. One click: the sample classifier is uploaded, inspected and deployed; Try it opens once it serves.
    page.click("#sample-digits")
    page.wait_for_url(f"{portal_url}/deployments/digits/")
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
    # Triton's own metadata agrees with the signature the page shows.
    metadata = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {token}",
                               f"{portal_url}/serve/digits/v2/models/digits"], capture_output=True, text=True, timeout=60)
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
    for step in ("preprocess", "postprocess"):
        page.goto(f"{portal_url}/models/upload/")
        page.wait_for_selector("body[data-js=ready]", state="attached")
        page.fill("#id_name", step)
        page.set_input_files("#id_file", str(tmp_path / f"{step}.zip"))
        page.wait_for_selector("#signature-editor:not([hidden])")
        page.set_input_files("#signature-import", str(tmp_path / f"{step}.signature.json"))
        page.wait_for_function("document.getElementById('id_signature').value !== ''")
        assert json.loads(page.input_value("#id_signature")) == json.loads((tmp_path / f"{step}.signature.json").read_text())
        page.click("#upload-submit")
        page.wait_for_selector("#upload-deploy:not([hidden])", timeout=60_000)
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
    page.fill("#id_name", "digits-pipeline")
    page.fill("#pipeline-definition", json.dumps(broken))
    page.wait_for_selector("#pipeline-problems")
    assert "Step 1 · digits" in page.inner_text("#pipeline-problems")
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
    # Settings in effect say the pipeline batches in its steps; the log has the CPU-only GPU lines folded away.
    assert "each step batching with its own settings" in page.inner_text("#settings-digits-pipeline")
    page.wait_for_function("!document.getElementById('triton-log').textContent.includes('Loading')")
    assert "has not started" not in page.inner_text("#triton-log")
    assert "NVML" not in page.inner_text("#triton-log")

    # 5. Traffic: a request Triton refuses shows as a status code; the dashboard counts the same window.
    page.fill("#try-it-input", '{"inputs": [{"name": "image", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}')
    page.set_input_files("#try-it-file-digits-pipeline-image", [])
    page.click("#try-it-send")
    page.wait_for_function("document.getElementById('try-it-latency').textContent.startsWith('HTTP 4')")
    page.reload()
    page.wait_for_function("document.getElementById('metrics-codes') && !document.getElementById('metrics-codes').hidden"
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
    assert phone.is_visible(".pipeline-diagram .diagram-down svg") and phone.is_hidden(".pipeline-diagram .diagram-across")
    assert phone.evaluate("(() => { const f = document.querySelector('.pipeline-diagram');"
                          " const s = f.querySelector('.diagram-down svg').getBoundingClientRect();"
                          " const svg = f.querySelector('.diagram-down svg');"
                          " return s.right <= f.getBoundingClientRect().right + 1"
                          "   && s.width / svg.viewBox.baseVal.width >= 0.85; })()")  # the text stays readable
    phone.goto(f"{portal_url}/deployments/digits-pipeline/")
    phone.wait_for_selector("body[data-js=ready]", state="attached")
    shot(phone, "deployment-phone")
