"""What the deploy and edit pages' tests send (a fixture module: nothing here is collected): the pages' URLs for
alice's "digits" and "digits-prod", a valid form and what a browser posts for forms as rendered."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment

NEW = "/deployments/new/?model=digits&version=1"


def form_data(**changes: Any) -> dict[str, Any]:
    data = {
        "name": "digits-prod",
        "runtime": "local",
        "replicas": "1",
        "gpu": "0",
        "gpu_type": "",
        "m0-version": "1",
        "m0-max_batch_size": "16",
        "m0-dynamic_batching": "on",
        "m0-max_queue_delay_microseconds": "2000",
        "m0-preferred_batch_size": "4, 8",
        "m0-instance_count": "2",
        "m0-instance_kind": "cpu",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}

EDIT = "/deployments/digits-prod/edit/"


def errors_of(response: Any) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    assert response.status_code == 200
    assert not Deployment.objects.exists()
    return response.context["form"].errors, response.context["model_forms"][0].errors


def as_post(form: Any, model_forms: list[Any]) -> dict[str, Any]:
    """What a browser sends for the forms as they were rendered."""
    data: dict[str, Any] = {}
    for f in [form, *model_forms]:
        for bound in f:
            value = bound.value()
            if bound.field.disabled or value is None or value is False:
                continue
            data[bound.html_name] = "on" if value is True else value
    return data
