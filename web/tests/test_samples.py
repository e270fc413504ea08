"""The empty dashboard's sample buttons: one click creates the sample models in the user's team through the upload
path and deploys them; a second click lands on the same deployment and creates nothing."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pytest
from PIL import Image

from deployments.models import Deployment
from models_registry.models import Model, ModelVersion
from models_registry.samples import (
    SAMPLE_DIGIT_LABEL,
    SAMPLE_DIGIT_PIXELS,
    digits_holdout,
    digits_pipeline_definition,
    sample_artifacts,
)
from tests.support.people import Person, signed_in


@pytest.fixture
def sample_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The click's task runs in this process when the click commits (the test's transaction never commits), as the
    worker would run it; the other tasks (a reconcile tick, which would start Triton) are queued, never run."""
    from django.db import transaction

    from web import tasks

    monkeypatch.setattr(transaction, "on_commit", lambda func, using=None, robust=False: func())
    monkeypatch.setattr(tasks.deploy_sample, "delay", lambda *args: tasks.deploy_sample(*args))


def test_the_empty_dashboard_offers_both_samples(alice: Person, bare_runtime_env: Any) -> None:
    content = signed_in(alice).get("/").content.decode()
    assert "Deploy the sample digits classifier" in content
    assert "Deploy the sample image pipeline" in content
    assert 'name="sample" value="digits"' in content and 'name="sample" value="pipeline"' in content
    assert "local runtime serves ONNX, Python models and pipelines." in content


def test_the_sample_classifier_is_created_in_alices_team_and_deployed(alice: Person, charlie: Person,
                                                                     sample_worker: None) -> None:
    client = signed_in(alice)
    response = client.post("/samples/deploy/", {"sample": "digits"})
    assert response.status_code == 302 and response["Location"] == "/samples/digits/"
    response = client.get("/samples/digits/")  # the worker (here in-process) made it: the page opens it
    assert response.status_code == 302 and response["Location"] == "/deployments/digits/"
    version = ModelVersion.objects.get(model__team=alice.team, model__name="digits")
    assert version.status == ModelVersion.Status.READY and version.format == "onnx"
    assert version.sha256 == hashlib.sha256(sample_artifacts("digits")[0].data).hexdigest()
    assert version.created_by == alice.user and version.original_filename == "digits.onnx"
    deployment = Deployment.objects.get(team=alice.team, name="digits")
    assert deployment.runtime == "local" and deployment.created_by == alice.user
    assert deployment.revision is not None
    [entry] = deployment.revision.spec.to_json()["models"]
    assert entry["model"] == "digits" and entry["dynamic_batching"] is not None
    assert not Model.objects.filter(team=charlie.team).exists()  # nothing lands in another team

    page = client.get("/deployments/digits/").content.decode()
    assert "Created the sample models in your team and the deployment digits." in page
    # Try it holds a held-out 7, not zeros.
    assert ", ".join(f"{float(v)}" for v in SAMPLE_DIGIT_PIXELS[:8]) in page


def test_a_second_click_lands_on_the_same_deployment_and_creates_nothing(alice: Person, sample_worker: None) -> None:
    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "digits"})
    counts = (Model.objects.count(), ModelVersion.objects.count(), Deployment.objects.count())
    response = client.post("/samples/deploy/", {"sample": "digits"}, follow=True)
    assert response.redirect_chain[-1][0] == "/deployments/digits/"
    assert "digits was deployed already: here it is." in response.content.decode()
    assert (Model.objects.count(), ModelVersion.objects.count(), Deployment.objects.count()) == counts


def test_a_deleted_sample_deployment_is_deployed_again_from_the_same_versions(alice: Person,
                                                                             sample_worker: None) -> None:
    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "digits"})
    Deployment.objects.filter(name="digits").delete()
    client.post("/samples/deploy/", {"sample": "digits"})
    assert ModelVersion.objects.filter(model__name="digits").count() == 1  # the same bytes are not uploaded twice
    assert Deployment.objects.filter(name="digits").count() == 1


def test_the_sample_pipeline_brings_its_steps_and_offers_a_sample_digit(alice: Person, sample_worker: None) -> None:
    client = signed_in(alice)
    response = client.post("/samples/deploy/", {"sample": "pipeline"})
    assert response.status_code == 302 and response["Location"] == "/samples/pipeline/"
    assert client.get("/samples/pipeline/")["Location"] == "/deployments/digits-pipeline/"
    versions = {v.model.name: v for v in ModelVersion.objects.select_related("model")}
    assert set(versions) == {"preprocess", "digits", "postprocess", "digits-pipeline"}
    assert all(v.status == ModelVersion.Status.READY for v in versions.values())
    assert versions["preprocess"].format == "python" and versions["digits-pipeline"].format == "ensemble"
    assert versions["digits-pipeline"].definition == digits_pipeline_definition()
    deployment = Deployment.objects.get(name="digits-pipeline")
    assert deployment.revision is not None
    assert {m["model"] for m in deployment.revision.spec.to_json()["models"]} == {
        "digits-pipeline", "preprocess", "digits", "postprocess"}

    page = client.get("/deployments/digits-pipeline/").content.decode()
    assert 'id="try-it-use-sample-digits-pipeline"' in page
    assert 'data-file-input="try-it-file-digits-pipeline-image"' in page
    # Clicked again: the same pipeline version, no new step versions.
    client.post("/samples/deploy/", {"sample": "pipeline"})
    assert ModelVersion.objects.count() == 4


def test_the_sample_pipelines_first_revision_counts_what_its_steps_are_estimated_to_take(
        alice: Person, sample_worker: None, settings: Any) -> None:
    """Its python steps have requirements, so no trial call measures them: the first revision counted 4Gi
    (SANDBOX_DEFAULT_MEMORY) against the team. Each step is now estimated from its file, as a pool estimates it."""
    settings.SANDBOX_SERVER_MEMORY, settings.POOL_MODEL_MEMORY_MIN = "256Mi", "128Mi"
    settings.SANDBOX_DEFAULT_MEMORY = "4Gi"
    signed_in(alice).post("/samples/deploy/", {"sample": "pipeline"})
    assert not ModelVersion.objects.filter(model__name="preprocess").get().measured_memory_bytes
    memory = alice.client().get("/api/v1/deployments/digits-pipeline/").json()["memory"]
    # Triton's 256Mi + 128Mi (POOL_MODEL_MEMORY_MIN) for each of the three steps; the pipeline itself runs in Triton.
    assert (memory["limit"], memory["source"]) == ("640Mi", "derived"), memory
    assert "'preprocess' (not measured when planned: estimated from its" in memory["basis"]
    assert "python archive, with headroom)" in memory["basis"]


def test_an_unknown_sample_is_a_400_that_names_the_choices(alice: Person) -> None:
    response = signed_in(alice).post("/samples/deploy/", {"sample": "../../etc/passwd" * 10})
    assert response.status_code == 400
    assert "choose one of digits, pipeline" in response.content.decode()
    assert not Model.objects.exists()


def test_samples_need_a_signed_in_post(alice: Person, client: Any) -> None:
    assert client.post("/samples/deploy/", {"sample": "digits"}).status_code == 302  # to the sign-in page
    assert signed_in(alice).get("/samples/deploy/").status_code == 405
    assert not Model.objects.exists()


def test_the_sample_digit_is_a_png_of_the_held_out_seven(alice: Person) -> None:
    response = signed_in(alice).get("/samples/digit.png")
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    image = Image.open(io.BytesIO(response.content))
    assert image.size == (32, 32)
    X, y = digits_holdout()
    assert int(y[0]) == SAMPLE_DIGIT_LABEL
    assert [int(v) for v in X[0]] == list(SAMPLE_DIGIT_PIXELS)


def test_both_samples_stay_one_click_away_once_the_digits_sample_is_deployed(alice: Person,
                                                                              sample_worker: None) -> None:
    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "digits"})
    content = client.get("/").content.decode()
    assert 'id="deployments-table"' in content and 'id="samples-section"' in content
    # The deployed one opens (a click lands on it), the other still deploys.
    assert "Open the sample digits classifier" in content and "Deploy the sample digits classifier" not in content
    assert "Deploy the sample image pipeline" in content
    response = client.post("/samples/deploy/", {"sample": "pipeline"})
    assert response.status_code == 302
    content = client.get("/").content.decode()
    assert "Open the sample image pipeline" in content and "Open the sample digits classifier" in content


def test_the_click_lands_at_once_on_the_progress_page_and_the_worker_makes_the_sample(
        alice: Person, charlie: Person, django_capture_on_commit_callbacks: Any) -> None:
    """The click answers before anything is made (it used to make the models in the request, 22 s); the page then
    shows each step as the worker commits it, and opens the deployment once it is made."""
    from web.tasks import deploy_sample

    client = signed_in(alice)
    with django_capture_on_commit_callbacks() as queued:
        response = client.post("/samples/deploy/", {"sample": "pipeline"})
    assert response.status_code == 302 and response["Location"] == "/samples/pipeline/"
    assert len(queued) == 1  # the worker's task, sent once the click commits
    assert not Model.objects.exists() and not Deployment.objects.exists()
    page = client.get("/samples/pipeline/").content.decode()
    assert 'id="sample-progress" hx-get="/samples/pipeline/"' in page  # it polls
    steps = [line.strip() for line in page.split('data-state="')[2:]]
    assert [step.split('"', 1)[0] for step in steps] == ["pending"] * 5
    assert "Model preprocess" in page and "Pipeline digits-pipeline" in page and "Deployment digits-pipeline" in page
    assert client.get("/samples/pipeline/", headers={"HX-Request": "true"}).status_code == 200
    # Charlie's team sees none of it, nor can it follow alice's run.
    assert "Model preprocess</" not in signed_in(charlie).get("/samples/pipeline/").content.decode()

    # The worker's task (run here): the models, each inspected, the pipeline, then the deployment.
    deploy_sample(alice.team.pk, alice.user.pk, "pipeline")
    assert Deployment.objects.filter(team=alice.team, name="digits-pipeline").exists()
    polled = client.get("/samples/pipeline/", headers={"HX-Request": "true"})
    assert polled.status_code == 200 and polled["HX-Redirect"] == "/deployments/digits-pipeline/"
    page = client.get("/deployments/digits-pipeline/").content.decode()
    assert "Created the sample models in your team and the deployment digits-pipeline." in page


def test_the_progress_page_shows_each_model_as_the_worker_commits_it(alice: Person) -> None:
    from web import samples

    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "pipeline"})
    [artifact] = [a for a in sample_artifacts("pipeline") if a.name == "preprocess"]
    samples._sample_version(alice.team, alice.user, artifact)  # the worker's first step, committed
    progress = samples.progress(alice.team, "pipeline")
    assert [(s.label, s.word) for s in progress.steps] == [
        ("Model preprocess, version 1", "done"), ("Model digits", "waiting"), ("Model postprocess", "waiting"),
        ("Pipeline digits-pipeline", "waiting"), ("Deployment digits-pipeline", "waiting")]
    assert samples.MODELS["pipeline"][:-1] == tuple(a.name for a in sample_artifacts("pipeline"))


def test_a_sample_the_worker_cannot_make_says_why_and_stops_polling(alice: Person, monkeypatch: Any) -> None:
    from web import samples
    from web.tasks import deploy_sample

    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "digits"})

    def refuse(*args: Any) -> Any:
        raise samples.SampleError("The sample cannot be deployed here: no ONNX backend.")

    monkeypatch.setattr(samples, "_deploy", refuse)
    deploy_sample(alice.team.pk, alice.user.pk, "digits")
    page = client.get("/samples/digits/").content.decode()
    assert "The sample cannot be deployed here: no ONNX backend." in page
    assert "hx-get" not in page.split('id="sample-progress"', 1)[1].split(">", 1)[0]  # it stops polling
    # A new click starts a new run: the old failure is not shown for it.
    client.post("/samples/deploy/", {"sample": "digits"})
    assert "no ONNX backend" not in client.get("/samples/digits/").content.decode()


def test_an_unknown_sample_has_no_progress_page(alice: Person) -> None:
    assert signed_in(alice).get("/samples/nope/").status_code == 404


def test_the_pipeline_page_shows_the_pipeline_first_and_folds_its_steps_away(alice: Person, sample_worker: None,
                                                                              tmp_path: Any) -> None:
    """Four models' snippets in a row made the page 8,600 px tall, and its curl sent an empty image (400): the
    pipeline's endpoint comes first, its steps behind a disclosure, and its curl, Python and CLI snippets send the
    sample PNG."""
    import html
    import re
    import subprocess

    from models_registry.samples import sample_digit_png

    client = signed_in(alice)
    client.post("/samples/deploy/", {"sample": "pipeline"})
    page = client.get("/deployments/digits-pipeline/").content.decode()
    folded = page.index('<details id="pipeline-steps"')
    assert page.index('id="endpoint-digits-pipeline"') < folded
    for step in ("preprocess", "digits", "postprocess"):
        assert page.index(f'id="endpoint-{step}"') > folded, step
    assert page.count('<div class="endpoint"') == 4
    curl = html.unescape(re.search(r'<pre id="snippet-curl-digits-pipeline" tabindex="0"><code>(.*?)</code>', page,
                                   re.S).group(1))  # type: ignore[union-attr]
    assert "/serve/digits-pipeline/v2/models/digits-pipeline/infer" in curl and '"data":[""]' not in curl
    # Run as copied, with a shell function in curl's place that keeps the body it is given: the JSON header, then
    # the PNG as one BYTES element (a 4-byte little-endian length and the bytes).
    body = tmp_path / "body.bin"
    ran = subprocess.run(["bash", "-c", f'curl() {{ cat > {body}; printf "%s\\n" "$@" > {body}.args; }}\n{curl}'],
                         env={"MODELPORT_TOKEN": "t", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
    data, png = body.read_bytes(), sample_digit_png()
    args = (tmp_path / "body.bin.args").read_text().splitlines()
    header_length = int(next(a for a in args if a.startswith("Inference-Header-Content-Length:")).split(":")[1])
    header = json.loads(data[:header_length])
    assert header == {"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": len(png) + 4}}]}
    assert data[header_length:] == len(png).to_bytes(4, "little") + png
    # The Python snippet sends the same PNG (it used to send b"").
    python = html.unescape(re.search(r'<pre id="snippet-python-digits-pipeline" tabindex="0"><code>(.*?)</code>',
                                     page, re.S).group(1))  # type: ignore[union-attr]
    assert "base64.b64decode(" in python and 'np.array([b""]' not in python
    # The CLI snippet read req.json, where an image can only be empty or text: it writes the same PNG from base64
    # and sends it with `modelport infer --file`. Run as copied in an empty folder, with the real CLI (`modelport`
    # is `python -m modelport_cli` here) against a fake portal that keeps what it is sent.
    import sys

    from modelport_cli.tests.fake_portal import FakePortal, Reply
    from tests.processes import ROOT

    cli = html.unescape(re.search(r'<pre id="snippet-cli-digits-pipeline" tabindex="0"><code>(.*?)</code>', page,
                                  re.S).group(1))  # type: ignore[union-attr]
    assert "req.json" not in cli and "--file image=digit-7.png" in cli
    assert not re.search(r'class="small download-request" data-model="digits-pipeline"', page)  # no req.json to get
    answer = {"outputs": [{"name": "labels", "shape": [1, 3], "datatype": "BYTES", "data": ["7", "1", "9"]}]}
    folder = tmp_path / "shell"
    folder.mkdir()
    with FakePortal() as portal:
        portal.on("POST", "/serve/digits-pipeline/v2/models/digits-pipeline/infer", Reply(200, answer))
        shim = f'modelport() {{ MODELPORT_URL={portal.url} {sys.executable} -m modelport_cli "$@"; }}\n'
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", shim + cli], cwd=folder, capture_output=True,
                             text=True, timeout=60,
                             env={"MODELPORT_TOKEN": "t", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        [sent] = portal.seen("POST")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == 'labels (BYTES [1x3]): ["7", "1", "9"]\n'
    assert (folder / "digit-7.png").read_bytes() == png
    header_length = int(sent.headers["inference-header-content-length"])
    assert json.loads(sent.body[:header_length]) == header
    assert sent.body[header_length:] == len(png).to_bytes(4, "little") + png


def test_clicks_while_a_sample_is_being_made_join_that_run_and_queue_nothing_more(
        alice: Person, charlie: Person, django_capture_on_commit_callbacks: Any, settings: Any) -> None:
    """Hostile: a team that clicks the button again and again while its sample is made must not fill the inspection
    lane every team's uploads share (each run would upload and inspect the models once more). Another team's click
    still starts its own run at once."""
    from django.utils import timezone

    from audit.models import AuditEntry

    client = signed_in(alice)
    with django_capture_on_commit_callbacks() as queued:
        for _ in range(20):
            response = client.post("/samples/deploy/", {"sample": "pipeline"})
            assert response.status_code == 302 and response["Location"] == "/samples/pipeline/"
    assert len(queued) == 1
    assert AuditEntry.objects.filter(team=alice.team, action="sample.deploy").count() == 1
    with django_capture_on_commit_callbacks() as theirs:
        assert signed_in(charlie).post("/samples/deploy/", {"sample": "pipeline"}).status_code == 302
    assert len(theirs) == 1
    # A run that never finished (a worker killed mid-way) stops counting past its time limit: a click starts anew.
    AuditEntry.objects.filter(team=alice.team, action="sample.deploy").update(
        time=timezone.now() - timezone.timedelta(seconds=4 * settings.INSPECTION_TIME_LIMIT_SECONDS + 1))
    with django_capture_on_commit_callbacks() as again:
        client.post("/samples/deploy/", {"sample": "pipeline"})
    assert len(again) == 1


def test_the_dashboard_offers_the_sample_text_generator_beside_the_two_others(alice: Person,
                                                                              bare_runtime_env: Any) -> None:
    content = signed_in(alice).get("/").content.decode()
    assert "Deploy the sample text generator" in content and 'name="sample" value="textgen"' in content


def test_the_sample_text_generator_is_a_streaming_version_on_a_server_of_its_own(
        alice: Person, bob: Person, charlie: Person, sample_worker: None, settings: Any) -> None:
    from models_registry.samples import TEXTGEN_SIGNATURE, build_textgen_zip

    settings.DEPLOYMENT_DEFAULT_PLACEMENT = "shared"  # whatever the operator's default: never a shared pool
    client = signed_in(alice)
    response = client.post("/samples/deploy/", {"sample": "textgen"})
    assert response.status_code == 302 and response["Location"] == "/samples/textgen/"
    assert client.get("/samples/textgen/")["Location"] == "/deployments/textgen/"
    version = ModelVersion.objects.get(model__team=alice.team, model__name="textgen")
    assert version.status == ModelVersion.Status.READY, version.error
    assert version.format == "python" and version.decoupled is True
    assert version.sha256 == hashlib.sha256(build_textgen_zip()).hexdigest()
    assert version.signature == TEXTGEN_SIGNATURE.to_json()
    assert [i["name"] for i in version.signature["inputs"] if i.get("optional")] == [
        "max_tokens", "temperature", "top_p", "stream", "stop", "seed"]
    assert version.example_request is not None  # the trial call sends it, not zeros
    deployment = Deployment.objects.get(team=alice.team, name="textgen")
    assert deployment.revision is not None
    spec = deployment.revision.spec
    assert spec.placement.mode == "dedicated"
    [entry] = spec.models
    assert entry.name == "textgen" and entry.decoupled is True
    # The version's JSON in the API shows the optional inputs; bob (same team) sees it, charlie does not.
    shown = bob.client().get(f"/api/v1/models/textgen/versions/{version.number}/").json()
    assert shown["decoupled"] is True and shown["signature"] == TEXTGEN_SIGNATURE.to_json()
    assert charlie.client().get(f"/api/v1/models/textgen/versions/{version.number}/").status_code == 404
    assert signed_in(charlie).get("/deployments/textgen/").status_code == 404
    assert not Model.objects.filter(team=charlie.team).exists()
    # A second click (bob's) lands on the same deployment and makes nothing.
    counts = (ModelVersion.objects.count(), Deployment.objects.count())
    again = signed_in(bob).post("/samples/deploy/", {"sample": "textgen"})
    assert again["Location"] == "/deployments/textgen/"
    assert (ModelVersion.objects.count(), Deployment.objects.count()) == counts


def test_the_sample_text_generator_asked_into_the_shared_pool_is_refused(alice: Person, sample_worker: None) -> None:
    """The rule the button keeps by asking for a server of its own: a shared pool serves no streaming python
    model."""
    from deployments import planning
    from deployments.model_entry import ModelEntry

    signed_in(alice).post("/samples/deploy/", {"sample": "textgen"})
    request = planning.DeployRequest(runtime=Deployment.Runtime.LOCAL, models=(ModelEntry.asked("textgen"),),
                                     placement=planning.PlacementRequest(mode="shared"))
    with pytest.raises(planning.PlanError) as caught:
        planning.plan(alice.team, request)
    assert "placement" in caught.value.errors, caught.value.errors
    assert "python" in " ".join(caught.value.errors["placement"]).lower()


def test_the_text_generators_page_streams_in_try_it_with_snippets_that_stream(
        alice: Person, bob: Person, charlie: Person, sample_worker: None, settings: Any) -> None:
    settings.GATEWAY_GRPC_PORT = 8081
    signed_in(alice).post("/samples/deploy/", {"sample": "textgen"})
    page = signed_in(bob).get("/deployments/textgen/").content.decode()  # bob: the same team
    assert 'id="try-stream-generate"' in page and 'id="try-stream-stop"' in page
    assert 'data-path="/serve/textgen/v2/models/textgen/generate_stream"' in page
    assert "js/try_stream.js" in page
    # No /infer Try it for a model that has no single answer, and the endpoint is the stream's.
    assert 'id="try-it-send"' not in page
    assert "POST http://testserver/serve/textgen/v2/models/textgen/generate_stream" in page
    import re
    assert "First Citizen:\n</textarea>" in page, re.findall(r"try-stream-prompt.{0,300}", page)
    assert "curl -sS -N -X POST http://testserver/serve/textgen/v2/models/textgen/generate_stream" in page
    assert "OpenAI(base_url=&quot;http://testserver/serve/textgen/v1&quot;" in page
    assert "client.chat.completions.create(" in page and "stream=True" in page
    assert "client.start_stream(" in page and "async_stream_infer(&quot;textgen&quot;" in page
    assert signed_in(charlie).get("/deployments/textgen/").status_code == 404
