"""The upload page's "From a registry" tab (issue 35) in a real headless Chromium against the real portal (uvicorn, a
Celery worker and beat): web/tests/test_upload_import.py proves the form with Django's test client and a stub
fetcher; here the page is the browser's (the source's fields shown by the stylesheet's :has() as the kind is picked,
the model's page refreshing itself with htmx) and the fetch is the real Hugging Face fetcher's, on a worker, from the
local hub-compatible server (tests/support/hf_hub_server.py, in this process: the cheapest real source).

The hub holds its CDN's answers back until the test has seen the import under way on the model's page (its total
known, no byte fetched), so that the progress is seen every run however fast the machine, then lets the bytes go and
waits for the version to turn ready by itself. A source the operator did not allow the team is refused on the form's
field, with the page's 200, and nothing is created or fetched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.template.defaultfilters import filesizeformat

from models_registry.models import Model, ModelVersion, TeamSources
from tests.support.browser import sign_in
from tests.support.hf_hub_server import ONNX_COMMIT, HubServer, running_hub, standard_repos, tiny_onnx
from tests.support.people import Person

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def acme_sources(alice_tx: Person) -> Person:
    """alice, whose team acme an operator allowed its own Hugging Face repositories (a TeamSources row, as the admin
    console writes it: the web process and the worker both read it from the database)."""
    TeamSources.objects.create(team=alice_tx.team, huggingface_repos="acme/*")
    return alice_tx


@pytest.fixture
def held_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The local hub with its CDN held (cdn_hold), HF_ENDPOINT in the environment the worker inherits: requested
    before portal_url, so that the worker starts pointing at it. Released on the way out, whatever the test did, so
    that no fetch is left waiting."""
    with running_hub(standard_repos()) as hub:
        hub.cdn_hold = threading.Event()
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        try:
            yield hub
        finally:
            hub.cdn_hold.set()


def open_import_tab(page: Any, portal_url: str) -> None:
    """The upload page, then its "From a registry" tab, as a user clicks them."""
    page.goto(f"{portal_url}/models/upload/")
    with page.expect_navigation():
        page.click("#tab-import")
    assert page.get_attribute("#tab-import", "aria-current") == "page"
    assert page.query_selector("#upload-form") is None, "the file upload's form is not on the import tab"


def submit(page: Any) -> Any:
    """Click Import: the response of the navigation it makes (a redirect's final page, or the form again)."""
    with page.expect_navigation() as navigation:
        page.click("#import-submit")
    return navigation.value


def spaced(text: str) -> str:
    """Django's filesizeformat puts a no-break space between number and unit."""
    return text.replace("\xa0", " ")


def test_an_import_from_the_hub_shows_its_progress_then_turns_ready_on_the_models_page(
    browser: Any, acme_sources: Person, held_hub: HubServer, portal_url: str
) -> None:
    assert held_hub.cdn_hold is not None
    page = sign_in(browser, portal_url, "alice")
    open_import_tab(page, portal_url)
    # Each source's fields are shown only with their kind picked (the stylesheet's :has()): Playwright fills
    # visible fields only, so these fills prove the Hugging Face fieldset appeared.
    assert page.is_hidden("#id_hf_repo")
    page.fill("#id_name", "tiny")
    page.check("input[name=kind][value=huggingface]")
    assert page.is_visible("#id_hf_repo") and page.is_hidden("#id_mlflow_uri") and page.is_hidden("#id_uri")
    page.fill("#id_hf_repo", "acme/tiny-onnx")
    page.fill("#id_hf_revision", "v1")

    response = submit(page)
    assert response.status == 200 and page.url == f"{portal_url}/models/tiny/"
    assert "Importing tiny version 1." in page.inner_text("body")
    assert page.inner_text("#version-1-status").strip() == "importing"
    assert page.is_visible("#version-1-cancel")

    # The worker lists the repo and reserves its total before the first byte: the page, refreshing itself every
    # 2 s while the version imports, shows it (the CDN holds the bytes back meanwhile).
    total = filesizeformat(len(tiny_onnx()))
    page.wait_for_function("total => (document.getElementById('version-1-import') || {}).textContent"
                           "?.replace(/\\u00a0/g, ' ').includes('of ' + total)", arg=spaced(total), timeout=60_000)
    assert spaced(page.inner_text("#version-1-import")) == spaced(f"Fetching: {filesizeformat(0)} of {total}")
    assert ModelVersion.objects.get(model__name="tiny").status == "importing"

    held_hub.cdn_hold.set()
    # No reload: the version turns ready by itself (fetched, staged, inspected in the sandbox).
    page.wait_for_function("(document.getElementById('version-1-status') || {}).textContent?.trim() === 'ready'",
                           timeout=120_000)
    assert page.query_selector("#version-1-import") is None and page.query_selector("#version-1-cancel") is None
    assert page.is_visible("#deploy-version-1")
    source_line = page.inner_text("#version-1-source")
    assert "Imported from huggingface: acme/tiny-onnx" in source_line and ONNX_COMMIT[:12] in source_line

    version = ModelVersion.objects.get(model__name="tiny")
    assert isinstance(version.source, dict)
    assert (version.status, version.format, version.source["fetched"]["commit"]) == ("ready", "onnx", ONNX_COMMIT)
    assert any(item.path.startswith("/cdn/") for item in held_hub.received), "the bytes came from the hub's CDN"
    page.context.close()


# Refused sources: (kind, field, what is typed, what the field says). One portal for all three: each start of the web
# server, worker and beat costs seconds of a loaded machine.
REFUSED = [
    # Another organisation's repository: the operator allowed acme/* only.
    ("huggingface", "hf_repo", "globex/private-weights",
     "Your team may not import from the Hugging Face repository 'globex/private-weights'"),
    # A server-side fetch of the cloud metadata address: https imports are off unless the operator turns them on.
    ("uri", "uri", "https://169.254.169.254/latest/meta-data/", "The operator turned https imports off"),
    # A bucket the operator did not list for the team.
    ("uri", "uri", "s3://models/fraud.onnx", "is not in the buckets the operator allowed your team"),
]


def test_a_source_the_team_may_not_import_is_refused_on_its_field_and_nothing_is_fetched(
    browser: Any, acme_sources: Person, held_hub: HubServer, portal_url: str
) -> None:
    page = sign_in(browser, portal_url, "alice")
    for kind, field, value, refusal in REFUSED:
        open_import_tab(page, portal_url)
        page.fill("#id_name", "stolen")
        page.check(f"input[name=kind][value={kind}]")
        page.fill(f"#id_{field}", value)

        response = submit(page)

        assert response.status == 200, f"{value}: a refused source is the form again, never a server error"
        assert page.url == f"{portal_url}/models/upload/import/"
        assert "has-error" in (page.get_attribute(f"#field-{field}", "class") or ""), value
        assert page.is_visible(f"#field-{field}"), f"{value}: the refusal shows on the field of the kind picked"
        assert refusal in page.inner_text(f"#field-{field}"), value
        assert page.input_value(f"#id_{field}") == value and page.input_value("#id_name") == "stolen", \
            f"{value}: what the user typed is kept, to be corrected"
    assert not Model.objects.filter(team=acme_sources.team).exists()
    assert held_hub.received == [], "refused before anything was asked of any source"
    page.context.close()
