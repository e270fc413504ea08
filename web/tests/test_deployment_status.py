"""What the deployment page says about a deployment: status words that tell the truth during a rollout and after a
failure, the settings in effect, the revision history with what changed, the log without the CPU-only CUDA noise,
the signature as Triton serves it, and snippets that run as copied."""

from __future__ import annotations

import json
import shlex
import subprocess

from deployments import actions
from deployments.models import Deployment, TritonServer
from deployments.planning import Plan
from deployments.render import build_model_config, served_dims
from deployments.revision_spec import ModelEntry, RevisionSpec
from deployments.spec import ServedModel
from tests.support.deploying import deploy
from tests.support.people import Person, signed_in
from web import inference, revisions
from web.logs import fold_gpu_noise

PAGE = "/deployments/digits-prod/"


def _serving_r1(deployment: Deployment) -> None:
    deployment.set_status(Deployment.Status.READY, "Serving revision 1.", serving_revision=deployment.revision,
                          upstream_url="http://127.0.0.1:9")


def _new_revision(person: Person, deployment: Deployment, **settings: object) -> None:
    assert deployment.revision is not None
    spec = deployment.revision.spec.to_json()
    spec["models"][0].update(settings)
    plan = Plan(RevisionSpec.from_json(spec), tuple(deployment.revision.versions.all()))
    actions.update_deployment(deployment, person.user, plan)


def test_a_rollout_reads_updating_while_the_old_revision_serves(alice: Person, deployment: Deployment) -> None:
    _serving_r1(deployment)
    client = signed_in(alice)
    assert 'id="status-badge">ready<' in client.get(f"{PAGE}live/").content.decode()
    _new_revision(alice, deployment, dynamic_batching={"max_queue_delay_microseconds": 2000,
                                                        "preferred_batch_size": [4], "preserve_ordering": False})
    live = client.get(f"{PAGE}live/").content.decode()
    assert 'id="status-badge">updating (serving r1)<' in live
    assert 'data-serving="yes"' in live  # Try it keeps working on r1
    dashboard = client.get("/dashboard/live/").content.decode()
    assert ">updating (serving r1)<" in dashboard
    deployment.refresh_from_db()
    deployment.set_status(Deployment.Status.FAILED, "Revision 2 failed to start: boom. Revision 1 keeps serving.")
    assert 'id="status-badge">failed (serving r1)<' in client.get(f"{PAGE}live/").content.decode()


def test_installing_python_packages_shows_as_building_with_what_is_installed(
        alice: Person, deployment: Deployment) -> None:
    message = "Installing python packages for revision 1: numpy, tabulate>=0.9."
    deployment.set_status(Deployment.Status.BUILDING, message)
    live = signed_in(alice).get(f"{PAGE}live/").content.decode()
    assert 'class="badge status-building" id="status-badge">building<' in live
    assert f'id="status-message">{message.replace(">", "&gt;")}<' in live
    _serving_r1(deployment)
    _new_revision(alice, deployment, dynamic_batching={"max_queue_delay_microseconds": 2000,
                                                        "preferred_batch_size": [4], "preserve_ordering": False})
    deployment.refresh_from_db()
    deployment.set_status(Deployment.Status.BUILDING, message.replace("revision 1", "revision 2"))
    assert 'id="status-badge">updating (serving r1)<' in signed_in(alice).get(f"{PAGE}live/").content.decode()


def test_no_start_banner_is_promised_once_the_deployment_is_created(alice: Person, digits: object) -> None:
    from web.tests.deploy_forms import NEW, form_data

    response = signed_in(alice).post(NEW, form_data(), follow=True)
    content = response.content.decode()
    assert "created" in content and "in a moment" not in content


def test_the_page_summarises_the_settings_in_effect_and_the_revision_history(alice: Person,
                                                                              deployment: Deployment) -> None:
    _serving_r1(deployment)
    _new_revision(alice, deployment, instance_group={"count": 2, "kind": "cpu", "gpus": []},
                  dynamic_batching={"max_queue_delay_microseconds": 2000, "preferred_batch_size": [4, 8],
                                    "preserve_ordering": False})
    page = signed_in(alice).get(PAGE).content.decode()
    settings = page[page.index('id="settings-table"'):page.index('id="revisions-title"')]
    # Revision 1 serves until 2 is ready: its settings are the ones in effect.
    assert "Revision r1, the one serving." in page
    assert "max batch size 64, dynamic batching with a queue delay of 0 µs" in settings
    assert "1 CPU instance" in settings
    history = page[page.index('id="revision-history"'):]
    assert "r2" in history and "latest" in history and "serving" in history
    assert "digits: queue delay 0 µs → 2,000 µs (2 ms)" in history
    assert "digits: preferred batch sizes none → 4, 8" in history
    assert "digits: 1 CPU instance → 2 CPU instances" in history
    assert "first revision" in history


def test_revision_changes_name_each_setting_that_changed() -> None:
    old = RevisionSpec.from_json({"replicas": 1, "models": [
        {"name": "a", "version": 1, "format": "onnx", "max_batch_size": 8, "dynamic_batching": None,
         "instance_group": {"count": 1, "kind": "cpu"}}]})
    new = RevisionSpec.from_json({"replicas": 2, "models": [
        {"name": "a", "version": 2, "format": "onnx", "max_batch_size": 16,
         "dynamic_batching": {"max_queue_delay_microseconds": 500}, "instance_group": {"count": 1, "kind": "cpu"}},
        {"name": "b", "version": 3, "format": "python", "max_batch_size": 0}]})
    assert revisions.changes_between(old, new) == [
        "b: added (version 3)", "a: version 1 → 2", "a: max batch size 8 → 16", "a: dynamic batching on",
        "replicas 1 → 2"]
    assert revisions.changes_between(new, old)[:2] == ["b: removed", "a: version 2 → 1"]
    assert revisions.changes_between(old, old) == ["no change of settings (the same spec rendered again)"]
    pipeline = ModelEntry.from_json({"name": "p", "version": 1, "format": "ensemble", "max_batch_size": 8})
    assert revisions.batching_words(pipeline) == "batches of up to 8, each step batching with its own settings"
    assert revisions.instances_words(pipeline) == "runs in its steps' instances"


# Lines a CPU-only start of the nvidia-pytriton build prints, with two about models and the rest of the log.
LOG = """W1129 16:24:19.370663 9010 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"
I1129 16:24:19.370700 9010 cuda_memory_manager.cc:117] "CUDA memory pool disabled"
E1129 16:24:19.370781 9010 server.cc:241] "CudaDriverHelper has not been initialized."
I1129 16:24:19.371622 9010 model_lifecycle.cc:472] "loading: digits:1"
W1129 16:24:19.380000 9010 metrics.cc:811] "DCGM unable to start: DCGM initialization error"
W1129 16:24:19.380100 9010 metrics.cc:780] "Failed to initialize NVML"
E1129 16:24:19.713920 9010 model_lifecycle.cc:642] "failed to load 'gpu' version 1: Invalid argument: instance group gpu_0 of model gpu specifies invalid or unsupported gpu id 0. GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are:"
I1129 16:24:19.714000 9010 model_lifecycle.cc:839] "successfully loaded 'digits'"
"""  # noqa: E501 - Triton log lines, verbatim


def test_the_log_folds_the_cpu_only_cuda_noise_but_not_lines_about_models() -> None:
    folded = fold_gpu_noise(LOG)
    assert len(folded.gpu_noise) == 5
    assert "loading: digits:1" in folded.text and "successfully loaded 'digits'" in folded.text
    assert "failed to load 'gpu'" in folded.text  # names a model: stays in view even though it says CUDA
    assert "NVML" not in folded.text and "CudaDriverHelper" not in folded.text


def test_the_log_panel_shows_the_folded_lines_apart_and_never_says_not_started_once_ready(
        alice: Person, deployment: Deployment, tmp_path: object) -> None:
    from pathlib import Path

    client = signed_in(alice)
    _serving_r1(deployment)
    panel = client.get(f"{PAGE}logs/").content.decode()
    assert "has not started" not in panel and "Triton is serving; it has written nothing to its log yet." in panel
    log = Path(str(tmp_path)) / "triton.log"
    log.write_text(LOG)
    TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=1, http_port=1,
                                grpc_port=2, metrics_port=3, log_path=str(log), state=TritonServer.State.READY)
    panel = client.get(f"{PAGE}logs/").content.decode()
    shown = panel[:panel.index('id="log-gpu-noise"')]
    assert "loading: digits:1" in shown and "NVML" not in shown
    assert "5 lines about CUDA, NVML or DCGM folded away" in panel and "Failed to initialize NVML" in panel
    deployment.set_status(Deployment.Status.FAILED, "boom")
    TritonServer.objects.all().delete()
    assert "did not get to start" in client.get(f"{PAGE}logs/").content.decode()


def test_the_signature_shown_is_what_triton_serves(alice: Person) -> None:
    """digits' `label` is declared [-1]; Triton declares it [1] with a reshape, so its metadata and its answers say
    [-1, 1] / [1, 1]. The page shows the served shape, and the example request uses served shapes too."""
    data = {"name": "digits", "version": 1, "format": "onnx", "max_batch_size": 64, "signature": {
        "inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 64]},
                   {"name": "id", "datatype": "INT64", "dims": [-1]}],
        "outputs": [{"name": "label", "datatype": "INT64", "dims": [-1]}]}}
    served = inference.served_signature(ModelEntry.from_json(data))
    assert served["outputs"] == [{"name": "label", "datatype": "INT64", "dims": [-1, 1], "declared": [-1]}]
    assert served["inputs"][0] == data["signature"]["inputs"][0]  # type: ignore[index]
    request = inference.example_request(served)
    assert [t["shape"] for t in request["inputs"]] == [[1, 64], [1, 1]]
    unbatched = inference.served_signature(ModelEntry.from_json({**data, "max_batch_size": 0}))
    assert unbatched["outputs"][0]["dims"] == [-1] and "declared" not in unbatched["outputs"][0]


def test_served_dims_are_the_dims_the_rendered_config_declares() -> None:
    """One rule: what the page shows is what config.pbtxt tells Triton (batch dimension prepended)."""
    entry = {"name": "m", "version": 1, "format": "onnx", "max_batch_size": 8, "signature": {
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 3]}],
        "outputs": [{"name": "label", "datatype": "INT64", "dims": [-1]},
                    {"name": "p", "datatype": "FP32", "dims": [-1, 10]}]}}
    config = build_model_config(ServedModel.of(ModelEntry.from_json(entry), None), "local")
    for tensor in list(config.input) + list(config.output):
        declared = next(t for t in entry["signature"]["inputs"] + entry["signature"]["outputs"]  # type: ignore[index,operator]
                        if t["name"] == tensor.name)
        assert served_dims(declared["dims"], True) == [-1, *tensor.dims]


def test_the_curl_snippet_runs_as_copied_with_its_body_inline(alice: Person, deployment: Deployment) -> None:
    page = signed_in(alice).get(PAGE)
    [served] = page.context["served"]
    curl = next(code for label, code, key in served["snippets"] if key == "curl")
    assert curl.startswith("# export MODELPORT_TOKEN=<an API token> first; the request body is inline\n")
    argv = shlex.split(curl.split("\n", 1)[1].replace("\\\n", " "))
    body = json.loads(argv[argv.index("-d") + 1])
    assert body == json.loads(served["example"])
    assert '"$MODELPORT_TOKEN"' in curl or "$MODELPORT_TOKEN" in curl
    # The shell gives curl exactly that body, quotes and all (bash -n: it parses; echo: what it passes).
    shell = curl.split("\n", 1)[1].replace("curl -sS -X POST", "printf %s", 1)
    shell = shell.replace(' \\\n  -H "Authorization: Bearer $MODELPORT_TOKEN"', "")
    shell = shell.replace(' \\\n  -H "Content-Type: application/json"', "")
    shell = shell.replace(" http://testserver/serve/digits-prod/v2/models/digits/infer \\\n  -d", "")
    assert json.loads(subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout) == body
    cli = next(code for label, code, key in served["snippets"] if key == "cli")
    assert "export MODELPORT_URL=http://testserver" in cli
    content = page.content.decode()
    assert content.count("Download req.json") >= 3 and 'id="try-it-download"' in content


def test_a_long_body_goes_to_req_json_and_a_quote_in_it_cannot_break_out() -> None:
    long_body = {"inputs": [{"name": "x", "shape": [1, 1000], "datatype": "FP32", "data": [0.0] * 1000}]}
    assert inference.curl_snippet("http://h", "d", "m", long_body).endswith("-d @req.json")
    hostile = {"inputs": [{"name": "it's'; rm -rf / #", "shape": [1], "datatype": "BYTES", "data": ["'$(id)'"]}]}
    curl = inference.curl_snippet("http://h", "d", "m", hostile)
    argv = shlex.split(curl.split("\n", 1)[1].replace("\\\n", " "))
    assert json.loads(argv[argv.index("-d") + 1]) == hostile


def test_the_history_lists_every_revision_of_this_deployment_only(alice: Person, deployment: Deployment) -> None:
    for size in (32, 24, 8):  # each a change: the same spec again would make no revision
        _new_revision(alice, deployment, max_batch_size=size)
    second = deploy(alice, name="other")
    assert second.revision is not None
    page = signed_in(alice).get(PAGE).content.decode()
    assert page.count('<li id="revision-') == 4


def test_the_curl_snippet_of_an_image_model_says_where_the_file_goes() -> None:
    body = {"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES", "data": [""]}]}
    first_line = inference.curl_snippet("http://h", "d", "m", body).splitlines()[0]
    assert ("image is BYTES: this JSON sends text, and a file (an image) goes with Try it or the Python snippet"
            in first_line)


def test_the_settings_in_effect_follow_the_rollout_without_a_reload(alice: Person, deployment: Deployment) -> None:
    """The page once said "r1, not serving yet" beside a ready badge: the section was drawn at page load only. The
    live refresh now re-sends it out of band, so it says what serves."""
    client = signed_in(alice)
    page = client.get(PAGE).content.decode()
    assert "Revision r1, not serving yet." in page
    live = client.get(f"{PAGE}live/").content.decode()
    assert '<section aria-labelledby="settings-title" id="settings" hx-swap-oob="true">' in live
    assert "Revision r1, not serving yet." in live
    _serving_r1(deployment)
    live = client.get(f"{PAGE}live/").content.decode()
    assert "Revision r1, the one serving." in live and "not serving yet" not in live
    assert '<span class="badge status-ready">serving</span>' in live


def test_the_log_panel_shows_a_giant_line_within_the_cap(alice: Person, deployment: Deployment, tmp_path: object,
                                                          settings: object) -> None:
    """One line of many MiB without a newline (issue 21): the panel holds at most LOG_TAIL_MAX_BYTES of it."""
    from pathlib import Path

    log = Path(str(tmp_path)) / "triton.log"
    with open(log, "wb") as f:
        f.write(b"I0101 started\n" + b"<" * (5 * 1024**2))
    TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=1, http_port=1,
                                grpc_port=2, metrics_port=3, log_path=str(log), state=TritonServer.State.READY)
    settings.LOG_TAIL_MAX_BYTES = 256 * 1024  # type: ignore[attr-defined]
    settings.LOG_LINE_MAX_BYTES = 1024**2  # type: ignore[attr-defined]
    panel = signed_in(alice).get(f"{PAGE}logs/").content.decode()
    assert len(panel) <= 4 * 256 * 1024 + 2048  # "<" is "&lt;" in the page
    assert "&lt;" * 1000 in panel and "bytes cut)" in panel
