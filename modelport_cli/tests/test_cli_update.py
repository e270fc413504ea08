"""`modelport deploy` on a name that exists takes the update path (issue 31): the CLI asks for the deployment
first and PATCHes only what it is given, POSTs otherwise (a 409 from a create made in between turns into the
update); --memory and --cpu; a model the token's team lacks is exit 2. Against the fake portal of test_cli.py: the
same paths against the real API are in test_cli_portal.py."""

from __future__ import annotations

from decimal import Decimal

import pytest

from modelport.core import quantity
from modelport_cli import quantities
from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from modelport_cli.tests.fake_portal import (
    NO_DEPLOYMENT,
    TUNED,
    FakePortal,
    Reply,
    api_error,
    deployment,
    error_line,
    existing,
)

TEXT = {"model": "text", "version": 4, "format": "onnx", "max_batch_size": 8, "dynamic_batching": None,
        "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False, "warmup": None}
SHARED = {"mode": "shared", "pool": "shared", "idle_unload_seconds": 600, "state": "loaded"}


def test_an_option_alone_sends_only_that_option(portal: FakePortal) -> None:
    existing(portal, TUNED, placement=SHARED)

    assert main(["deploy", "digits-prod", "--idle-unload", "5m"]) == 0
    assert main(["deploy", "digits-prod", "--pool", "shared"]) == 0

    assert portal.seen("POST") == []
    first, second = (r.json() for r in portal.seen("PATCH", "/api/v1/deployments/digits-prod/"))
    assert first == {"placement": {"idle_unload_seconds": 300}}  # no models: the API keeps them as they are
    assert second == {"placement": {"pool": "shared"}}


def test_model_options_without_a_model_apply_to_each_served_model_at_its_version(portal: FakePortal) -> None:
    existing(portal, TUNED, TEXT)

    assert main(["deploy", "digits-prod", "--instances", "3"]) == 0

    digits, text = portal.seen("PATCH")[0].json()["models"]
    assert digits["version"] == 1 and digits["instance_group"] == {"count": 3, "kind": "cpu", "gpus": []}
    assert digits["dynamic_batching"]["max_queue_delay_microseconds"] == 1000  # kept
    assert text["version"] == 4 and text["instance_group"]["count"] == 3 and text["max_batch_size"] == 8
    assert "format" not in digits  # output only: nothing the API does not take is sent


def test_a_deployment_created_between_the_get_and_the_post_is_updated(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", [NO_DEPLOYMENT, Reply(200, deployment(models=[TUNED]))])
    portal.on("POST", "/api/v1/deployments/",
              api_error(409, "A deployment named 'digits-prod' exists already.", "conflict"))
    portal.on("PATCH", "/api/v1/deployments/digits-prod/", Reply(200, deployment(revision=2)))

    assert main(["deploy", "digits-prod", "--model", "digits", "--instances", "1"]) == 0

    assert capsys.readouterr().out == "digits-prod: revision 2 updated (pending)\n"
    (patch,) = portal.seen("PATCH")
    assert patch.json()["models"][0]["max_batch_size"] == 32  # its current settings, read after the 409


def test_a_new_name_without_a_model_exits_2_saying_to_add_one(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", NO_DEPLOYMENT)

    assert main(["deploy", "digits-prod", "--idle-unload", "5m"]) == ExitCode.USAGE

    line = error_line(capsys)
    assert "digits-prod is a new deployment, so it needs a model: add --model MODEL[:VERSION]" in line
    assert "in team 'acme'" in line  # the portal's 404: a token of another team is the likely mistake
    assert portal.seen("POST") == []


def test_memory_and_cpu_are_sent_on_create(portal: FakePortal) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))

    assert main(["deploy", "a", "--model", "digits", "--memory", "512Mi", "--cpu", "1.5"]) == 0
    assert main(["deploy", "b", "--model", "digits", "--cpu", "500m"]) == 0

    first, second = (r.json() for r in portal.seen("POST"))
    assert first["resources"] == {"memory": "512Mi", "cpu": "1.5"}
    assert second["resources"] == {"cpu": "500m"}


def test_memory_on_update_keeps_the_other_resources(portal: FakePortal) -> None:
    """The API's PATCH replaces "resources" whole: the CLI sends the current ones with the one given changed."""
    existing(portal, TUNED, resources={"cpu": "2", "memory": "4Gi", "gpu": 0})

    assert main(["deploy", "digits-prod", "--memory", "2Gi"]) == 0

    (patch,) = portal.seen("PATCH")
    assert patch.json() == {"resources": {"cpu": "2", "memory": "2Gi", "gpu": 0}}


def test_another_runtime_on_update_exits_2_and_the_same_one_is_not_sent(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    existing(portal, TUNED)

    assert main(["deploy", "digits-prod", "--runtime", "kubernetes", "--instances", "2"]) == ExitCode.USAGE
    assert "runs on the local runtime, which cannot change" in error_line(capsys)
    assert portal.seen("PATCH") == []

    assert main(["deploy", "digits-prod", "--runtime", "local", "--instances", "2"]) == 0
    assert "runtime" not in portal.seen("PATCH")[0].json()  # not a field of a PATCH


def test_a_model_the_team_lacks_exits_2_with_the_portals_404(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(400, "Invalid input.", "invalid", {
        "models[0].model": ["no model named 'nosuch' in your team"]}))
    portal.on("GET", "/api/v1/models/nosuch/", api_error(
        404, "There is no model named 'nosuch' in team 'acme', the team this request acts for.", "not_found"))

    assert main(["deploy", "digits-prod", "--model", "nosuch"]) == ExitCode.USAGE

    assert error_line(capsys) == ("error: --model nosuch: There is no model named 'nosuch' in team 'acme', the team "
                                  "this request acts for.")


def test_a_refusal_of_another_field_does_not_ask_about_the_models(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(400, "Invalid input.", "invalid", {
        "resources.memory": ["4Gi more would make 12Gi ... TEAM_MAX_MEMORY"]}))

    assert main(["deploy", "digits-prod", "--model", "digits"]) == ExitCode.ERROR

    assert "TEAM_MAX_MEMORY" in error_line(capsys)
    assert portal.seen("GET", "/api/v1/models/digits/") == []


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--memory", "512MB", "'512MB' is not a memory size: write e.g. 512Mi, 4Gi or 16G (did you mean 512M?)"),
    ("--memory", "2gb", "(did you mean 2G?)"),
    ("--memory", "512m", "m means thousandths; Mi is mebibytes"),
    ("--memory", "4096", "memory needs a unit"),
    ("--memory", "17Ti", "at most 16Ti"),
    ("--memory", "-1Gi", "'-1Gi' is not a memory size: write e.g. 512Mi, 4Gi or 16G, and not negative"),
    ("--memory", "1.5", "memory needs a unit"),
    ("--cpu", "two", "'two' is not a number of cores: write e.g. 2, 0.5 or 500m"),
    ("--cpu", "0.0001", "at least 1m"),
    ("--cpu", "2000", "at most 1024 cores"),
    ("--cpu", "0.0015", "more precise than Kubernetes allows"),
    ("--cpu", "1" * 40, "40 characters"),
])
def test_a_bad_memory_or_cpu_exits_2_saying_how_to_write_it(
        portal: FakePortal, option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "digits-prod", "--model", "digits", f"{option}={value}"]) == ExitCode.USAGE

    line = error_line(capsys)
    assert f"argument {option}:" in line and says in line
    assert portal.requests == []


SAMPLES = ["512Mi", "2Gi", "1Mi", "16Ti", "17Ti", "1048576", "1048575", "1.5Gi", "0.5Mi", "1e6", "1E9", "2e3Mi",
           "1P", "500m", "1.5", "2", "0.001", "0.0005", "1024", "1025", "1k", ".5", "5.", "1Ki", "1KiB", "1 Gi", "",
           "-1", "+1", "1e", "1.2.3", "0", "4096m", "1000000000000m", "3.3333", "12345678901234567890123456789012",
           "123456789012345678901234567890123"]


@pytest.mark.parametrize("text", SAMPLES)
def test_the_clis_quantity_rule_is_the_portals(text: str) -> None:
    """The CLI cannot import the portal's parser (it is its own distribution): the two agree on what they take."""
    for cli_check, bounds in ((quantities.memory, quantity.MEMORY), (quantities.cpu, quantity.CPU)):
        try:
            value: Decimal | None = quantity.check_quantity(text, bounds)
        except quantity.QuantityError:
            value = None
        try:
            accepted = cli_check(text) == text
        except Exception:  # argparse.ArgumentTypeError: refused
            accepted = False
        assert accepted == (value is not None), (text, bounds.examples)
