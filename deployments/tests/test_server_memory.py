"""Issue 31 (3): every dedicated local deployment counted 4 GiB (SANDBOX_DEFAULT_MEMORY) against its team's memory
ceiling and the machine's, however small: the sixth tiny ONNX deployment was refused on a 24 GiB machine where each
used some 110 MiB. A dedicated local deployment that gives no memory is now limited from what its models were
measured to take (deployments/server_memory.py); the figure and how the limit was reached are shown; a memory given
is kept; the ceiling's refusal says which deployment's memory to lower, and how."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from deployments import server_memory
from deployments.models import Deployment
from deployments.revision_spec import MemoryBasis, MemoryShare, RevisionSpec
from models_registry.models import ModelVersion, record_memory
from tests.support.people import Person

Gi = 2**30
Mi = 2**20


def create(person: Person, name: str, **body: Any) -> Any:
    payload = {"name": name, "models": [{"model": "digits"}], **body}
    return person.client().post("/api/v1/deployments/", payload, format="json")


def spec_of(person: Person, name: str) -> RevisionSpec:
    deployment = Deployment.objects.get(team=person.team, name=name)
    assert deployment.revision is not None
    spec: RevisionSpec = deployment.revision.spec
    return spec


@pytest.fixture
def default_machine(settings: Any) -> Any:
    """The machine the issue was found on: 23.5 GiB, 2 GiB kept for the portal; the default derivation settings."""
    settings.MACHINE_MEMORY_BYTES = 47 * Gi // 2
    settings.LOCAL_MEMORY_RESERVE = "2Gi"
    settings.TEAM_MAX_MEMORY = settings.DEPLOYMENT_MAX_MEMORY = ""
    settings.DEPLOYMENT_MEMORY_OVERCOMMIT = 1.0
    settings.SANDBOX_SERVER_MEMORY = "256Mi"
    settings.POOL_MODEL_MEMORY_MIN = "128Mi"
    settings.POOL_MODEL_MEMORY_HEADROOM = 1.5
    settings.SANDBOX_DEFAULT_MEMORY = "4Gi"
    return settings


def test_a_tiny_onnx_deployment_without_memory_gets_a_small_limit_and_shows_how_it_was_reached(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    response = create(alice, "small")
    assert response.status_code == 201, response.json()
    # Never measured: estimated from its file (a few hundred bytes), at least POOL_MODEL_MEMORY_MIN, beside Triton's.
    assert spec_of(alice, "small").memory_limit("4Gi") == "384Mi"
    memory = alice.client().get("/api/v1/deployments/small/").json()["memory"]
    assert memory["limit"] == "384Mi" and memory["source"] == "derived"
    assert "Triton's own 256 MiB" in memory["basis"]
    assert "not measured when planned: estimated from its" in memory["basis"]
    assert response.json()["resources"] == {"gpu": 0}  # nothing was given: the request's own fields stay as asked


def test_a_team_now_fits_many_small_deployments_where_it_fitted_five(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    for index in range(12):  # five fitted at 4Gi each on the 21.5 GiB this machine admits
        response = create(alice, f"small-{index}")
        assert response.status_code == 201, (index, response.json())
    held = sum(Deployment.objects.get(name=f"small-{i}").revision.spec.derived_memory() == "384Mi"  # type: ignore
               for i in range(12))
    assert held == 12


def test_a_measured_version_is_limited_from_its_figure_with_headroom_per_instance(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    assert record_memory(digits.pk, 200 * Mi, "its trial call at inspection")
    body = {"models": [{"model": "digits", "instance_group": {"count": 2}}]}
    assert create(alice, "measured", **body).status_code == 201
    spec = spec_of(alice, "measured")
    # 256Mi + 2 x 1.5 x 200Mi = 856Mi, rounded up to 64Mi steps.
    assert spec.memory_limit("4Gi") == "896Mi"
    basis = alice.client().get("/api/v1/deployments/measured/").json()["memory"]["basis"]
    assert "2 × 300 MiB for 'digits' (measured 200 MiB at its trial call at inspection" in basis
    # A trial server of a tune with more instances gets more: the counts are read from the spec itself.
    more = RevisionSpec.from_json({**spec.to_json(), "models": [
        {**spec.models[0].to_json(), "instance_group": {"count": 4, "kind": "cpu", "gpus": []}}]})
    assert more.memory_limit("4Gi") == "1472Mi"  # 256Mi + 4 x 300Mi, rounded up


def test_a_memory_given_is_kept_as_given(alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    assert create(alice, "given", resources={"memory": "3Gi"}).status_code == 201
    spec = spec_of(alice, "given")
    assert spec.memory_basis is None and spec.memory_limit("4Gi") == "3Gi"
    assert alice.client().get("/api/v1/deployments/given/").json()["memory"] == {
        "limit": "3Gi", "source": "given", "basis": "", "derived_now": None}


def test_a_python_version_never_measured_is_estimated_from_its_archive(alice: Person, default_machine: Any) -> None:
    from tests.sandbox_helpers import VECTOR, model_source, python_version

    # No trial call here (as for a python model with requirements): never measured, and it used to get 4Gi.
    version = python_version(alice, "legit", {"model.py": model_source("legit_model")}, VECTOR)
    assert not version.measured_memory_bytes
    response = alice.client().post("/api/v1/deployments/", {"name": "code", "models": [{"model": "legit"}]},
                                   format="json")
    assert response.status_code == 201, response.json()
    assert spec_of(alice, "code").memory_limit("1Gi") == "384Mi"  # 256Mi + POOL_MODEL_MEMORY_MIN
    memory = response.json()["memory"]
    assert memory["source"] == "derived" and memory["limit"] == "384Mi"
    assert f"128 MiB for 'legit' (not measured when planned: estimated from its {version.size / 2**10:.0f} KiB " \
           "python archive, with headroom)" in memory["basis"], memory["basis"]
    assert memory["derived_now"] is None and "measured since" not in memory["basis"]


def test_a_torchscript_or_savedmodel_version_never_measured_gets_the_default_and_says_why(default_machine: Any) -> None:
    from deployments.revision_spec import ModelEntry
    from modelport.core.signature import parse_signature
    from tests.sandbox_helpers import VECTOR

    for fmt in ("torchscript", "savedmodel"):
        entry = ModelEntry(name="cnn", version=1, format=fmt, signature=parse_signature(VECTOR), max_batch_size=8)
        spec = RevisionSpec(runtime="local", models=(entry,))
        basis = server_memory.basis_for(spec, [])
        assert basis is not None and basis.fallback == "4Gi"
        assert basis.fallback_reason == f"version 1 of 'cnn' ({fmt}) has not been measured on this machine yet"
        assert "SANDBOX_DEFAULT_MEMORY" in server_memory.words(replace(spec, memory_basis=basis))


def test_a_version_measured_after_planning_is_told_with_what_a_new_revision_would_take(
        alice: Person, default_machine: Any) -> None:
    from tests.sandbox_helpers import VECTOR, model_source, python_version
    from tests.support.people import signed_in

    version = python_version(alice, "legit", {"model.py": model_source("legit_model")}, VECTOR)
    assert create(alice, "code", models=[{"model": "legit"}]).status_code == 201
    # The server measures its model as it serves: the revision keeps the default it was planned with.
    assert record_memory(version.pk, 100 * Mi, "its use in a dedicated deployment")
    memory = alice.client().get("/api/v1/deployments/code/").json()["memory"]
    assert memory["limit"] == "384Mi" and memory["source"] == "derived"  # estimated from its archive when planned
    # 256Mi + 1.5 x 100Mi = 406Mi, rounded up to 448Mi: the rule planning uses.
    assert memory["derived_now"] == "448Mi"
    assert memory["basis"] == (
        f"Triton's own 256 MiB + 128 MiB for 'legit' (not measured when planned: estimated from its "
        f"{version.size / 2**10:.0f} KiB python archive, with headroom), rounded up; measured since: a new revision "
        "would take 448Mi (resources.memory in the API, modelport deploy code --memory 448Mi)"), memory["basis"]
    assert [d["memory"]["derived_now"] for d in alice.client().get("/api/v1/deployments/").json()] == ["448Mi"]
    page = signed_in(alice).get("/deployments/code/").content.decode()
    assert "measured since: a new revision would take 448Mi" in page and "modelport deploy code --memory 448Mi" in page
    # What the suggestion says to do takes it, and then nothing more is suggested.
    taken = alice.client().patch("/api/v1/deployments/code/", {"resources": {"memory": "448Mi"}}, format="json")
    assert taken.status_code == 200, taken.json()
    assert taken.json()["memory"] == {"limit": "448Mi", "source": "given", "basis": "", "derived_now": None}


def test_a_full_team_is_told_which_deployment_to_lower_and_how(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    default_machine.TEAM_MAX_MEMORY = "1Gi"
    assert create(alice, "a", resources={"memory": "512Mi"}).status_code == 201
    assert create(alice, "b").status_code == 201  # 384Mi: 896Mi of 1Gi
    refused = create(alice, "c")
    assert refused.status_code == 400
    [message] = refused.json()["error"]["fields"]["resources.memory"]
    assert "384Mi more would make 1.2Gi" in message and "TEAM_MAX_MEMORY" in message
    assert ("give this deployment at most 128Mi (resources.memory in the API, modelport deploy NAME --memory 128Mi)"
            in message), message
    assert "the largest: a 512Mi, b 384Mi" in message
    # Edited, the deployment's own name is in the command.
    grow = alice.client().patch("/api/v1/deployments/b/", {"resources": {"memory": "1Gi"}}, format="json")
    [message] = grow.json()["error"]["fields"]["resources.memory"]
    assert "modelport deploy b --memory 512Mi" in message and "the largest: a 512Mi" in message


def test_a_derived_limit_over_the_deployment_ceiling_says_it_was_derived(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    default_machine.DEPLOYMENT_MAX_MEMORY = "256Mi"
    [message] = create(alice, "over").json()["error"]["fields"]["resources.memory"]
    assert message.startswith("The memory limit of 384Mi derived from what its models were measured to take is more "
                              "than a deployment of team acme may ask for per server (at most 256Mi, "
                              "DEPLOYMENT_MAX_MEMORY): ask for less (resources.memory in the API, modelport deploy "
                              "NAME --memory 256Mi)"), message


def test_deploying_the_same_settings_after_a_measurement_makes_no_new_revision(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    assert create(alice, "same").status_code == 201
    before = Deployment.objects.get(name="same").revision_id
    record_memory(digits.pk, 300 * Mi, "its use in a dedicated deployment on this machine")
    again = alice.client().patch("/api/v1/deployments/same/", {"models": [{"model": "digits"}]}, format="json")
    assert again.status_code == 200, again.json()
    assert Deployment.objects.get(name="same").revision_id == before
    # Its estimate was measured since: what a new revision would take is said (256Mi + 1.5 x 300Mi, rounded up).
    memory = again.json()["memory"]
    assert memory["limit"] == "384Mi" and memory["derived_now"] == "768Mi"
    assert "not measured when planned: estimated from its" in memory["basis"]
    assert memory["basis"].endswith("; measured since: a new revision would take 768Mi (resources.memory in the API, "
                                    "modelport deploy same --memory 768Mi)"), memory["basis"]
    # A change asked for plans again, with the figure measured since.
    changed = alice.client().patch("/api/v1/deployments/same/", {"models": [
        {"model": "digits", "instance_group": {"count": 2}}]}, format="json")
    assert changed.status_code == 200
    assert spec_of(alice, "same").memory_limit("4Gi") == "1216Mi"  # 256Mi + 2 x 450Mi, rounded up
    assert changed.json()["memory"]["derived_now"] is None  # planned from the figure: nothing measured since


def test_a_version_keeps_the_most_it_was_seen_to_take(alice: Person, digits: ModelVersion) -> None:
    assert record_memory(digits.pk, 100 * Mi, "its trial call at inspection")
    assert not record_memory(digits.pk, 80 * Mi, "its use in a pool on this machine")  # a lower reading
    assert record_memory(digits.pk, 150 * Mi, "its use in a pool on this machine")
    assert not record_memory(digits.pk, 0, "nothing found")
    version = alice.client().get(f"/api/v1/models/digits/versions/{digits.number}/").json()
    assert version["measured_memory_bytes"] == 150 * Mi
    assert version["measured_memory_by"] == "its use in a pool on this machine"


def test_a_shared_or_kubernetes_deployment_derives_nothing(alice: Person, digits: ModelVersion,
                                                            default_machine: Any) -> None:
    assert create(alice, "pooled", placement={"mode": "shared"}).status_code == 201
    assert spec_of(alice, "pooled").memory_basis is None
    assert alice.client().get("/api/v1/deployments/pooled/").json()["memory"] is None
    spec = RevisionSpec(runtime="kubernetes", models=spec_of(alice, "pooled").models)
    assert server_memory.basis_for(spec, [digits]) is None


def test_a_spec_keeps_its_memory_basis_and_an_older_one_has_none() -> None:
    basis = MemoryBasis(server_bytes=256 * Mi, models=(MemoryShare("m", 128 * Mi, "estimated"),))
    spec = RevisionSpec(runtime="local", models=(), memory_basis=basis)
    assert RevisionSpec.from_json(spec.to_json()) == spec
    assert spec.derived_memory() == "384Mi"
    older = spec.to_json()
    del older["memory_basis"]
    assert RevisionSpec.from_json(older).memory_limit("4Gi") == "4Gi"  # as it was planned: the default
    fallback = RevisionSpec(runtime="local", models=(), memory_basis=MemoryBasis(256 * Mi, fallback=""))
    assert RevisionSpec.from_json(fallback.to_json()).memory_limit("4Gi") == ""  # SANDBOX_DEFAULT_MEMORY was none


def test_the_pages_show_the_measured_figure_and_the_limit_derived_from_it(
        alice: Person, digits: ModelVersion, default_machine: Any) -> None:
    from tests.support.people import signed_in

    record_memory(digits.pk, 100 * Mi, "its trial call at inspection")
    assert create(alice, "shown").status_code == 201
    browser = signed_in(alice)
    page = browser.get("/deployments/shown/").content.decode()
    # 256Mi + max(1.5 x 100Mi, 128Mi) = 406Mi, rounded up to 448Mi.
    assert ("Memory limit 448Mi, derived from what its models were measured to take: Triton&#x27;s own 256 MiB + "
            "150 MiB for &#x27;digits&#x27; (measured 100 MiB at its trial call at inspection, with headroom), "
            "rounded up") in page
    assert "measured since" not in page  # measured when planned, and not since
    assert alice.client().get("/api/v1/deployments/shown/").json()["memory"]["derived_now"] is None
    versions = browser.get("/models/digits/versions/").content.decode()
    assert "Measured memory: 100.0\xa0MB per instance, at its trial call at inspection." in versions
