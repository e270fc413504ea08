"""Try it starts from the example request the version was uploaded with (issue 31), where a JSON request can carry
its data; else from zeros as before."""

from __future__ import annotations

import base64
import json

from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.people import Person, signed_in

PAGE = "/deployments/digits-prod/"


def test_try_it_is_prefilled_with_the_versions_example_request(alice: Person, deployment: Deployment,
                                                                digits: ModelVersion) -> None:
    ModelVersion.objects.filter(pk=digits.pk).update(example_request={
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 1.5, 2.5, 3.5]}]})
    [served] = signed_in(alice).get(PAGE).context["served"]
    assert json.loads(served["example"])["inputs"][0]["data"] == [0.5, 1.5, 2.5, 3.5]


def test_an_example_whose_bytes_are_binary_leaves_try_it_at_zeros() -> None:
    png = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1],
                       "data": [{"b64": base64.b64encode(b"\x89PNG\r\n").decode()}]},
                      {"name": "label", "datatype": "BYTES", "shape": [1, 1],
                       "data": [{"b64": base64.b64encode(b"seven").decode()}]}]}
    assert ModelVersion(example_request=png).example_data() == {"label": ["seven"]}
