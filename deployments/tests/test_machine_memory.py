"""Issue 30 (5, partial): memory ceilings were per team only, so two teams each within theirs held 43.5 GiB of memory
limits together on a 23.5 GiB machine. The local runtime now admits a deployment only while every team's running
and starting deployments' memory limits add up to at most the machine's memory less LOCAL_MEMORY_RESERVE, times
DEPLOYMENT_MEMORY_OVERCOMMIT; the refusal says what is free and what to lower."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from accounts.models import TeamQuota
from deployments import ceilings
from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = pytest.mark.usefixtures("tiny_models_limited_to_4gi")

Gi = 2**30
Mi = 2**20


def create(person: Person, name: str, **body: Any) -> Any:
    payload = {"name": name, "models": [{"model": "digits"}], **body}
    return person.client().post("/api/v1/deployments/", payload, format="json")


@pytest.fixture
def machine(settings: Any) -> Any:
    """The machine the issue was found on: 23.5 GiB, 2 GiB of it kept for the portal: 21.5 GiB usable."""
    settings.MACHINE_MEMORY_BYTES = 47 * Gi // 2
    settings.LOCAL_MEMORY_RESERVE = "2Gi"
    settings.TEAM_MAX_MEMORY = settings.DEPLOYMENT_MAX_MEMORY = ""  # each team's ceiling: the usable memory
    settings.DEPLOYMENT_MEMORY_OVERCOMMIT = 1.0  # the default, which the suite's conftest turns off
    return settings


def test_the_admission_refuses_what_does_not_fit_and_says_what_is_free() -> None:
    limit = ceilings.Limit(Decimal(20 * Gi), "the machine")
    assert ceilings.machine_refusal(Decimal(4 * Gi), Decimal(16 * Gi), limit, 1) == ""  # exactly full is admitted
    refused = ceilings.machine_refusal(Decimal(5 * Gi), Decimal(16 * Gi), limit, 1)
    assert refused.startswith("5Gi more would make 21Gi of memory limits on this machine (every team's running and "
                              "starting deployments hold 16Gi), more than it admits (at most 20Gi, the machine); "
                              "4Gi is free: lower resources.memory to at most 4Gi (modelport deploy NAME --memory "
                              "4Gi), stop or shrink another deployment")
    assert "DEPLOYMENT_MEMORY_OVERCOMMIT" in refused
    # Spread over servers, the figure to lower is per server; over a full machine, nothing is free.
    assert "to at most 1Gi per server for its 4 servers" in ceilings.machine_refusal(
        Decimal(8 * Gi), Decimal(16 * Gi), limit, 4)
    assert "0Mi is free" in ceilings.machine_refusal(Decimal(Gi), Decimal(24 * Gi), limit, 1)
    # Nothing asked, or no admission at all.
    assert ceilings.machine_refusal(Decimal(0), Decimal(30 * Gi), limit, 1) == ""
    assert ceilings.machine_refusal(Decimal(30 * Gi), Decimal(0), ceilings.Limit(None, "none"), 1) == ""


def test_the_machines_limit_is_its_usable_memory_times_the_overcommit(machine: Any) -> None:
    usable = Decimal(47 * Gi // 2 - 2 * Gi)
    assert ceilings.machine_memory("local").value == usable
    machine.DEPLOYMENT_MEMORY_OVERCOMMIT = 1.5
    limit = ceilings.machine_memory("local")
    assert limit.value == usable * Decimal("1.5")
    assert limit.source == "this machine's memory less LOCAL_MEMORY_RESERVE, times DEPLOYMENT_MEMORY_OVERCOMMIT = 1.5"
    machine.DEPLOYMENT_MEMORY_OVERCOMMIT = 0.0
    assert ceilings.machine_memory("local").value is None
    machine.DEPLOYMENT_MEMORY_OVERCOMMIT = 1.0
    assert ceilings.machine_memory("kubernetes").value is None  # the cluster admits its pods itself


def test_two_teams_deployments_together_cannot_exceed_the_machine(
        alice: Person, charlie: Person, digits: ModelVersion, machine: Any) -> None:
    make_ready_version(charlie, "digits")
    assert create(alice, "big", resources={"memory": "16Gi"}).status_code == 201
    # Within charlie's own ceiling (21.5Gi), but not beside alice's 16Gi.
    response = create(charlie, "big", resources={"memory": "16Gi"})
    assert response.status_code == 400, response.json()
    [message] = response.json()["error"]["fields"]["resources.memory"]
    assert ("16Gi more would make 32Gi of memory limits on this machine (every team's running and starting "
            "deployments hold 16Gi), more than it admits (at most 21.5Gi, this machine's memory less "
            "LOCAL_MEMORY_RESERVE, times DEPLOYMENT_MEMORY_OVERCOMMIT = 1)") in message
    assert "5.5Gi is free: lower resources.memory to at most 5.5Gi" in message
    assert not Deployment.objects.filter(team=charlie.team).exists()
    assert create(charlie, "big", resources={"memory": "5Gi"}).status_code == 201
    # And alice may not grow hers into what charlie now holds; shrinking is always admitted.
    grow = alice.client().patch("/api/v1/deployments/big/", {"resources": {"memory": "17Gi"}}, format="json")
    assert grow.status_code == 400 and "of memory limits on this machine" in \
        grow.json()["error"]["fields"]["resources.memory"][0]
    shrink = alice.client().patch("/api/v1/deployments/big/", {"resources": {"memory": "8Gi"}}, format="json")
    assert shrink.status_code == 200, shrink.json()
    total = ceilings.machine_usage("local").memory
    assert total <= ceilings.machine_memory("local").value  # type: ignore[operator]


def test_a_stopped_deployment_frees_the_machine_and_starting_it_is_admitted_again(
        alice: Person, charlie: Person, digits: ModelVersion, machine: Any) -> None:
    make_ready_version(charlie, "digits")
    assert create(alice, "big", resources={"memory": "16Gi"}).status_code == 201
    assert alice.client().post("/api/v1/deployments/big/stop").status_code == 202
    assert create(charlie, "big", resources={"memory": "16Gi"}).status_code == 201
    start = alice.client().post("/api/v1/deployments/big/start")
    assert start.status_code == 409
    assert "5.5Gi is free" in start.json()["error"]["message"]
    assert Deployment.objects.get(team=alice.team).desired_state == Deployment.Desired.STOPPED


def test_the_operators_overcommit_factor_admits_more(
        alice: Person, charlie: Person, digits: ModelVersion, machine: Any) -> None:
    machine.DEPLOYMENT_MEMORY_OVERCOMMIT = 1.5  # 21.5Gi x 1.5: 32.25Gi
    make_ready_version(charlie, "digits")
    assert create(alice, "big", resources={"memory": "16Gi"}).status_code == 201
    assert create(charlie, "big", resources={"memory": "16Gi"}).status_code == 201
    refused = create(charlie, "more", resources={"memory": "1Gi"})  # within charlie's 21.5Gi
    assert refused.status_code == 400
    [message] = refused.json()["error"]["fields"]["resources.memory"]
    assert "DEPLOYMENT_MEMORY_OVERCOMMIT = 1.5" in message and "256Mi is free" in message
    assert create(charlie, "more", resources={"memory": "256Mi"}).status_code == 201


def test_the_machine_admission_composes_with_the_teams_ceiling(
        alice: Person, charlie: Person, digits: ModelVersion, machine: Any) -> None:
    """The team's ceiling still holds within the machine, the machine's beyond a team's larger quota."""
    make_ready_version(charlie, "digits")
    machine.TEAM_MAX_MEMORY = "8Gi"
    assert create(alice, "one", resources={"memory": "6Gi"}).status_code == 201
    within_machine = create(alice, "two", resources={"memory": "6Gi"})  # 12Gi of the machine's 21.5Gi
    [message] = within_machine.json()["error"]["fields"]["resources.memory"]
    assert "TEAM_MAX_MEMORY" in message and "on this machine" not in message
    # An operator gave charlie a quota larger than the machine: the machine still admits only what it has.
    TeamQuota.objects.create(team=charlie.team, deployment_memory="64Gi", total_memory="64Gi")
    over_machine = create(charlie, "big", resources={"memory": "20Gi"})
    [message] = over_machine.json()["error"]["fields"]["resources.memory"]
    assert "more than it admits (at most 21.5Gi" in message and "15.5Gi is free" in message
    assert create(charlie, "big", resources={"memory": "15Gi"}).status_code == 201


def test_the_default_memory_counts_across_teams(
        alice: Person, charlie: Person, digits: ModelVersion, machine: Any) -> None:
    make_ready_version(charlie, "digits")
    for name in ("a", "b", "c", "d", "e"):  # the derived 4Gi each: 20Gi of 21.5Gi
        team_of = alice if name in "abc" else charlie
        assert create(team_of, name).status_code == 201, name
    sixth = create(charlie, "f")
    assert sixth.status_code == 400
    assert "1.5Gi is free" in sixth.json()["error"]["fields"]["resources.memory"][0]
