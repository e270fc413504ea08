"""The deployment page: live status and events, the endpoint with its snippets, a valid example request for Try it,
and the Stop / Start / Delete buttons changing the deployment's state."""

from __future__ import annotations

import json

from deployments import reconcile
from deployments.models import Deployment, Event
from tests.support.people import Person, signed_in
from web import inference

PAGE = "/deployments/digits-prod/"


def test_the_page_shows_status_events_and_the_endpoint_with_snippets(alice: Person, deployment: Deployment) -> None:
    content = signed_in(alice).get(PAGE).content.decode()
    assert '<span class="badge status-pending" id="status-badge">pending</span>' in content
    assert "Created by alice with revision 1." in content
    assert "http://testserver/serve/digits-prod/v2/models/digits/infer" in content
    assert "modelport infer digits-prod digits --input req.json" in content
    assert 'InferenceServerClient(url=&quot;testserver/serve/digits-prod&quot;)' in content
    assert "np.zeros([1, 4], dtype=np.float32)" in content
    for element_id in ["try-it-send", "try-it-input", "try-it-output", "try-it-latency", "deployment-stop",
                       "deployment-edit", "deployment-delete", "chart-requests", "chart-latency", "metrics-summary",
                       "triton-log", "event-timeline"]:
        assert f'id="{element_id}"' in content, element_id
    assert 'data-metrics-url="/api/v1/deployments/digits-prod/metrics/?minutes=5"' in content


def test_try_it_is_prefilled_with_a_valid_request_for_the_signature(alice: Person, deployment: Deployment) -> None:
    response = signed_in(alice).get(PAGE)
    [served] = response.context["served"]
    assert json.loads(served["example"]) == {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 0.0, 0.0, 0.0]}]}
    assert served["path"] == "/serve/digits-prod/v2/models/digits/infer"
    assert 'data-infer-path="/serve/digits-prod/v2/models/digits/infer"' in response.content.decode()


def test_the_status_and_events_refresh_themselves(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    assert 'hx-trigger="every 2s"' in client.get(PAGE).content.decode()
    deployment.set_status(Deployment.Status.FAILED, "Revision 1 failed to start: boom")
    Event.objects.create(deployment=deployment, kind=Event.Kind.ERROR, message="Revision 1 failed to start: boom")
    live = client.get(f"{PAGE}live/").content.decode()
    assert 'id="status-badge">failed<' in live
    assert "Revision 1 failed to start: boom" in live
    assert "kind-error" in live


def test_the_log_tail_says_when_there_is_no_log_yet(alice: Person, deployment: Deployment) -> None:
    response = signed_in(alice).get(f"{PAGE}logs/")
    assert response.status_code == 200
    assert b"No log yet" in response.content


def test_stop_and_start_change_the_deployments_state(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    response = client.post(f"{PAGE}stop/")
    assert response.status_code == 302 and response["Location"] == PAGE
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.STOPPED
    assert deployment.status == Deployment.Status.STOPPING
    assert Event.objects.filter(deployment=deployment, message="Stop requested by alice.").exists()
    page = client.get(PAGE).content.decode()
    assert 'id="deployment-start"' in page and 'id="deployment-stop"' not in page

    client.post(f"{PAGE}start/")
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.RUNNING
    assert deployment.status == Deployment.Status.PENDING


def test_starting_a_running_deployment_says_so_instead_of_failing(alice: Person, deployment: Deployment) -> None:
    response = signed_in(alice).post(f"{PAGE}start/", follow=True)
    assert response.status_code == 200
    assert b"The deployment is running already." in response.content


def test_a_failed_deployment_offers_retry_and_edit_not_stop_or_try_it(alice: Person, deployment: Deployment) -> None:
    deployment.set_status(Deployment.Status.FAILED, "Revision 1 failed to start: boom")
    client = signed_in(alice)
    page = client.get(PAGE).content.decode()
    assert 'id="deployment-retry"' in page and 'id="deployment-edit"' in page
    assert 'id="deployment-stop"' not in page
    assert '<div id="try-it" hidden>' in page
    assert "it failed to start (see the status above)" in page
    # The buttons follow the status: the live refresh carries them out of band.
    live = client.get(f"{PAGE}live/").content.decode()
    assert 'id="deployment-actions" hx-swap-oob="true"' in live and 'id="deployment-retry"' in live
    assert 'data-serving="no"' in live
    client.post(f"{PAGE}start/")
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.PENDING


def test_state_changes_take_only_posts(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    for action in ["stop", "start"]:
        assert client.get(f"{PAGE}{action}/").status_code == 405
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.Desired.RUNNING


def test_delete_asks_first_then_deletes(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    confirm = client.get(f"{PAGE}delete/")
    assert b'id="delete-confirm"' in confirm.content
    assert Deployment.objects.filter(pk=deployment.pk).exists()
    response = client.post(f"{PAGE}delete/", follow=True)
    assert response.redirect_chain == [("/", 302)]
    assert "digits-prod is being deleted: it no longer serves" in response.content.decode()
    # Gone for the user at once; the worker tears it down (the request runs no reconciler).
    assert Deployment.objects.get(pk=deployment.pk).desired_state == Deployment.Desired.DELETED
    assert client.get(PAGE).status_code == 404
    reconcile.reconcile(deployment.pk)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()


# --- The example request and snippets (no database) ----------------------------------------------------------


SIGNATURE = {
    "inputs": [
        {"name": "image", "datatype": "BYTES", "dims": [-1, 1]},
        {"name": "mask", "datatype": "BOOL", "dims": [-1, 2]},
        {"name": "ids", "datatype": "INT64", "dims": [-1, -1]},
    ],
    "outputs": [{"name": "label", "datatype": "FP32", "dims": [-1, 10]}],
}


def test_the_example_request_has_the_right_shapes_and_datatypes() -> None:
    request = inference.example_request(SIGNATURE)
    assert request == {"inputs": [
        {"name": "image", "shape": [1, 1], "datatype": "BYTES", "data": [""]},
        {"name": "mask", "shape": [1, 2], "datatype": "BOOL", "data": [False, False]},
        {"name": "ids", "shape": [1, 1], "datatype": "INT64", "data": [0]},
    ]}


def test_the_example_request_is_written_one_line_per_input() -> None:
    image = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 3, 224, 224]},
                        {"name": "scale", "datatype": "FP32", "dims": [-1, 1]}], "outputs": []}
    text = inference.example_request_json(image)
    assert text.count("\n") == 3
    assert len(json.loads(text)["inputs"][0]["data"]) == 3 * 224 * 224


def test_the_python_snippet_uses_tls_for_an_https_portal() -> None:
    snippet = inference.python_snippet("https://models.example.com", "digits-prod", "digits", SIGNATURE)
    assert 'InferenceServerClient(url="models.example.com/serve/digits-prod", ssl=True)' in snippet
    assert 'httpclient.InferInput("image", [1, 1], "BYTES")' in snippet
    assert "dtype=np.bool_" in snippet
    assert 'print(result.as_numpy("label"))' in snippet
    compile(snippet, "snippet", "exec")


def test_the_live_status_sends_the_browser_away_once_the_deployment_is_gone(alice: Person,
                                                                            deployment: Deployment) -> None:
    client = signed_in(alice)
    deployment.delete()
    response = client.get(f"{PAGE}live/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/"
    assert client.get(f"{PAGE}live/").status_code == 404


def test_the_example_leaves_out_inputs_too_large_to_prefill() -> None:
    """An uploader's dims of [-1, 100000, 100000] built a list of ten billion zeros in the web process."""
    huge = {"inputs": [{"name": "volume", "datatype": "FP32", "dims": [-1, 100_000, 100_000]},
                       {"name": "scale", "datatype": "FP32", "dims": [-1, 1]}], "outputs": []}
    request = inference.example_request(huge)
    assert request["inputs"][0] == {"name": "volume", "shape": [1, 100_000, 100_000], "datatype": "FP32", "data": []}
    assert request["inputs"][1]["data"] == [0.0]
    assert "volume (1 × 100000 × 100000 = 10,000,000,000 elements)" in inference.example_note(huge)
    at_the_cap = {"inputs": [{"name": "x", "datatype": "INT8", "dims": [inference.EXAMPLE_MAX_ELEMENTS]}]}
    assert len(inference.example_request(at_the_cap)["inputs"][0]["data"]) == inference.EXAMPLE_MAX_ELEMENTS
    assert inference.example_note(at_the_cap) == ""


def test_the_page_of_a_model_with_huge_inputs_stays_small(alice: Person, deployment: Deployment) -> None:
    revision = deployment.revision
    assert revision is not None
    spec = revision.spec.to_json()
    spec["models"][0]["signature"]["inputs"][0]["dims"] = [-1, 2**40, 64]
    type(revision).objects.filter(pk=revision.pk).update(spec=spec)
    response = signed_in(alice).get(PAGE)
    assert response.status_code == 200
    assert len(response.content) < 100_000
    content = response.content.decode()
    assert 'class="try-it-note muted small" data-model="digits"' in content
    assert "Too large to prefill here: x (1 × 1099511627776 × 64 = 70,368,744,177,664 elements)" in content


def test_the_try_it_box_is_as_tall_as_its_example() -> None:
    """Ten rows for a pipeline's one line of an image were part of what made its page 3,385 px tall."""
    from web.deployment_page import example_rows

    image = inference.request_json({"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES",
                                                "data": [""]}]})
    pixels = inference.request_json({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                 "data": [16.0] * 64}]})
    assert example_rows(image) == 4  # three lines and one to type in
    assert 6 <= example_rows(pixels) <= 10  # the 64 pixels wrap
    assert example_rows(inference.request_json({"inputs": [{"name": "x", "shape": [1, 9999], "datatype": "FP32",
                                                            "data": [0.0] * 9999}]})) == 10


def test_the_log_is_folded_while_the_deployment_serves_and_open_otherwise(alice: Person,
                                                                         deployment: Deployment) -> None:
    """Open, its 24 rem were an eighth of a pipeline's page that serves; folded while it starts or fails, nobody
    would see why."""
    client = signed_in(alice)
    assert '<details id="log-box" class="log-box" open>' in client.get(PAGE).content.decode()  # pending
    deployment.set_status(Deployment.Status.READY, "Serving revision 1.")
    assert '<details id="log-box" class="log-box">' in client.get(PAGE).content.decode()
    deployment.set_status(Deployment.Status.FAILED, "Revision 1 failed to start: boom")
    assert '<details id="log-box" class="log-box" open>' in client.get(PAGE).content.decode()
