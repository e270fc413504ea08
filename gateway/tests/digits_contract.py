"""What the digits model declares and what Triton answers to a wrong shape, shared by the gateway's contract tests (a
fixture module: nothing here is collected)."""

from __future__ import annotations

import json
from typing import Any

from modelport.core.signature import Signature, Tensor
from tests.support.people import Person

SIGNATURE = Signature(inputs=(Tensor("input", "FP32", (-1, 64)),),
                      outputs=(Tensor("probabilities", "FP32", (-1, 10)), Tensor("label", "INT64", (-1,))))


SHAPE_ERROR = ("[request id: <id_unknown>] unexpected shape for input 'input' for model 'digits'. Expected [-1,64], "
               "got [2,63]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
               "to be prepended to each input shape. If you want to specify the full shape including the batch dim "
               "in your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
               "more info on max_batch_size.")


def digits_deployment(person: Person, upstream_url: str) -> None:
    """digits-prod serving the digits classifier at `upstream_url` (rows only)."""
    from deployments.models import Deployment, Revision

    deployment = Deployment.objects.create(team=person.team, name="digits-prod", upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    entry = {"name": "digits", "version": 1, "format": "onnx", "max_batch_size": 8,
             "signature": SIGNATURE.to_json()}
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": [entry]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)


def digits_request(**extra: Any) -> bytes:
    """A JSON request of one row of zeros for the digits classifier."""
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}],
                       **extra}).encode()
