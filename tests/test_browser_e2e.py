"""The upload-and-deploy flow in a real headless Chromium (Debian's package, driven by Playwright) against the
real portal: uvicorn, a Celery worker and beat, and Triton. Screenshots of the main pages go to docs/screenshots/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import Person, make_person
from deployments.models import Deployment
from models_registry.models import ModelVersion

pytestmark = [pytest.mark.browser, pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
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


def sign_in(browser: Any, portal_url: str, username: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
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
    shot(page, "dashboard-empty")

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
    settings = Deployment.objects.get(name="digits-prod").revision.spec["models"][0]
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
    shot(page, "deployment")

    page.goto(f"{portal_url}/")
    page.wait_for_selector("#deployments-table")
    shot(page, "dashboard")
    page.goto(f"{portal_url}/models/")
    shot(page, "models")

    page.goto(f"{portal_url}/deployments/digits-prod/")
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
