"""Resource quantities in deployment specs: Kubernetes' own grammar, sane bounds, and a 400 naming the field for
every bad value, through the API and the web form (which goes through the same serializer)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from deployments.models import Deployment
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from modelport.core.quantity import CPU, MEMORY, QuantityError, check_quantity, parse_quantity
from models_registry.models import ModelVersion
from tests.support.people import Person, signed_in
from web.tests.deploy_forms import NEW, form_data


@pytest.mark.parametrize(("text", "value"), [
    ("2", Decimal(2)), ("500m", Decimal("0.5")), ("0.5", Decimal("0.5")), (".5", Decimal("0.5")), ("5.", Decimal(5)),
    ("1.5e3", Decimal(1500)), ("2E-3", Decimal("0.002")), ("4Gi", Decimal(4 * 2**30)), ("16G", Decimal(16 * 10**9)),
    ("1k", Decimal(1000)), ("1Ki", Decimal(1024)), ("1Ei", Decimal(2**60)),
])
def test_it_parses_the_kubernetes_grammar_exactly(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ("9" * 400, "a value of 400 characters is not a Kubernetes quantity"),
    ("1e999Gi", "'1e999Gi' is not a Kubernetes quantity"),  # an exponent and a suffix: not the grammar
    ("1e999", "'1e999' is more than a deployment may ask for (at most 1024 cores)"),
    ("1e-999", "'1e-999' is less than a deployment may ask for (at least 1m"),
    ("-1", "'-1' is not a Kubernetes quantity: write a number with an optional suffix"),
    ("", "'' is not a Kubernetes quantity"),
    ("0", "'0' is less than a deployment may ask for"),
    ("2 cores", "'2 cores' is not a Kubernetes quantity"),
    ("1025", "at most 1024 cores"),
    ("0.0005", "'0.0005' is less than a deployment may ask for"),
    ("1.0005", "'1.0005' is more precise than Kubernetes allows: the smallest step is a thousandth of a core (1m)"),
    ("inf", "'inf' is not a Kubernetes quantity"),
    ("NaN", "'NaN' is not a Kubernetes quantity"),
    ("1_000", "'1_000' is not a Kubernetes quantity"),
    ("\uff12", "is not a Kubernetes quantity"),  # a fullwidth digit: \d in Python, not in Kubernetes
    ("2\n", "is not a Kubernetes quantity"),
])
def test_bad_cpu_values_are_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as caught:
        check_quantity(text, CPU)
    assert message in str(caught.value)


@pytest.mark.parametrize(("text", "message"), [
    ("4GB", '(did you mean "4G"?)'),
    ("4gi", '(did you mean "4Gi"?)'),
    ("512mb", '(did you mean "512M"?)'),
    ("2 Gi", '(did you mean "2Gi"?)'),
    ("500m", "'500m' is 0.500 bytes (m means thousandths; Mi is mebibytes)"),
    ("4", "'4' is 4 bytes: memory needs a unit"),
    ("17Ti", "'17Ti' is more than a deployment may ask for (at most 16Ti)"),
    ("1e999", "at most 16Ti"),
    ("1.5", "at least 1Mi"),
    ("1048576.5", "more precise than Kubernetes allows: the smallest step is one byte"),
    ("-4Gi", "and not negative"),
])
def test_bad_memory_values_are_refused_with_a_hint(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as caught:
        check_quantity(text, MEMORY)
    assert message in str(caught.value)


def test_the_bounds_themselves_are_accepted() -> None:
    assert check_quantity("1m", CPU) == Decimal("0.001")
    assert check_quantity("1024", CPU) == 1024
    assert check_quantity("1Mi", MEMORY) == 2**20
    assert check_quantity("16Ti", MEMORY) == 16 * 2**40


def create(person: Person, resources: dict[str, Any], runtime: str = "kubernetes") -> Any:
    return person.client().post("/api/v1/deployments/", {"name": "digits", "runtime": runtime, "resources": resources,
                                                         "models": [{"model": "digits"}]}, format="json")


@pytest.mark.parametrize(("resources", "field", "message"), [
    ({"cpu": "9" * 400}, "resources.cpu", "Ensure this field has no more than 32 characters."),
    ({"memory": "1e999Gi"}, "resources.memory", "'1e999Gi' is not a Kubernetes quantity"),
    ({"cpu": "1e999"}, "resources.cpu", "at most 1024 cores"),
    ({"cpu": "-2"}, "resources.cpu", "and not negative"),
    ({"memory": "4GB"}, "resources.memory", '(did you mean "4G"?)'),
    ({"memory": "500m"}, "resources.memory", "m means thousandths"),
    ({"cpu": None}, "resources.cpu", "This field may not be null."),
    ({"cpu": ["2"]}, "resources.cpu", "Not a valid string."),
    ({"memory": {"value": "4Gi"}}, "resources.memory", "Not a valid string."),
    ({"gpu": int("9" * 400)}, "resources.gpu", "Ensure this value is less than or equal to 16."),
    ({"gpu": "2"}, "resources.gpu", "A valid integer is required."),  # a string is not a number (the schema's types)
    ({"gpu": -1}, "resources.gpu", "Ensure this value is greater than or equal to 0."),
])
def test_the_api_answers_400_naming_the_field(alice: Person, digits: ModelVersion, resources: dict[str, Any],
                                              field: str, message: str) -> None:
    response = create(alice, resources)
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert list(fields) == [field]
    assert message in fields[field][0]
    assert not Deployment.objects.exists()


def test_a_json_number_too_big_for_a_float_is_refused(alice: Person, digits: ModelVersion) -> None:
    body = '{"name": "digits", "runtime": "kubernetes", "resources": {"cpu": 1e400}, "models": [{"model": "digits"}]}'
    response = alice.client().post("/api/v1/deployments/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["resources.cpu"] == ["Not a valid string."]


def test_the_local_runtime_validates_the_same_fields(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, {"memory": "lots"}, runtime="local")
    assert response.status_code == 400
    assert "'lots' is not a Kubernetes quantity" in response.json()["error"]["fields"]["resources.memory"][0]


def test_good_values_are_kept_as_written_and_empty_ones_mean_the_default(alice: Person,
                                                                          digits: ModelVersion) -> None:
    response = create(alice, {"cpu": "500m", "memory": ""})
    assert response.status_code == 201, response.json()
    assert response.json()["resources"] == {"cpu": "500m", "gpu": 0}
    spec = Deployment.objects.get().revision.spec  # type: ignore[union-attr]
    target = manifests.Target(team="acme", name="digits", revision=1, spec=spec, repository_key="p/r1/")
    container = manifests.deployment(target, "ns", KubernetesConfig(default_memory="3Gi"))["spec"]["template"][
        "spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "3Gi"}


def test_a_patch_with_a_bad_quantity_changes_nothing(alice: Person, digits: ModelVersion) -> None:
    assert create(alice, {"memory": "4Gi"}).status_code == 201
    response = alice.client().patch("/api/v1/deployments/digits/", {"resources": {"memory": "4 gigs"}}, format="json")
    assert response.status_code == 400
    assert "'4 gigs' is not a Kubernetes quantity" in response.json()["error"]["fields"]["resources.memory"][0]
    assert Deployment.objects.get().revision.number == 1  # type: ignore[union-attr]


def test_the_web_form_shows_the_message_beside_the_field(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(runtime="kubernetes", cpu="1e999", memory="4GB"))
    assert response.status_code == 200
    form = response.context["form"]
    assert "at most 1024 cores" in form.errors["cpu"][0]
    assert '(did you mean "4G"?)' in form.errors["memory"][0]
    assert not Deployment.objects.exists()


def test_the_web_form_stores_good_values(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, form_data(runtime="kubernetes", cpu="2", memory="8Gi"))
    assert response.status_code == 302
    resources = Deployment.objects.get().revision.spec.to_json()["resources"]  # type: ignore[union-attr]
    assert resources["cpu"] == "2" and resources["memory"] == "8Gi"
    edit = signed_in(alice).get("/deployments/digits-prod/edit/")
    assert edit.context["form"].initial["memory"] == "8Gi"


def test_the_manifests_refuse_a_stored_bad_quantity() -> None:
    """Revisions written before the API checked quantities are refused when rendered, not sent to the cluster."""
    target = manifests.Target(team="acme", name="digits", revision=1, repository_key="p/r1/",
                              spec=RevisionSpec.from_json({"resources": {"cpu": "9" * 40, "memory": "1e999"},
                                                           "models": []}))
    errors = manifests.check(target, KubernetesConfig())
    assert "not a Kubernetes quantity" in errors["resources.cpu"][0]
    assert "at most 16Ti" in errors["resources.memory"][0]
