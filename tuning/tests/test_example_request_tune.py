"""A generated tune request starts from the version's example request (issue 31), as Try it does."""

from __future__ import annotations

from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.people import Person
from tuning.models import TuneRun


def test_the_generated_request_is_the_versions_example_request(alice: Person, digits: ModelVersion,
                                                               deployment: Deployment) -> None:
    ModelVersion.objects.filter(pk=digits.pk).update(example_request={
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 1.5, 2.5, 3.5]}]})
    response = alice.client().post("/api/v1/deployments/digits-prod/tune", {"p99_ms": 20, "budget_seconds": 60},
                                   format="json")
    assert response.status_code == 202, response.json()
    assert TuneRun.objects.get().request_body["inputs"][0]["data"] == [0.5, 1.5, 2.5, 3.5]
