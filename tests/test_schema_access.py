"""alice reaching for charlie's objects through every operation of the OpenAPI schema that names one (the schema
tests' world, tests/schema_world.py). In the fast suite: it needs the schema's operations, not the fuzzer's cases."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis

from tests.schema_world import CHARLIE_DEPLOYMENT, CHARLIE_MODEL, FUZZ_TOKEN, World

pytestmark = pytest.mark.django_db


def _operations() -> list[Any]:
    from portal.wsgi import application

    return list(schemathesis.openapi.from_wsgi("/api/v1/schema/", application).get_all_operations())


# Read at import, outside any test: a request through the WSGI entry point closes the database connection after it,
# which would end a test's transaction.
OPERATIONS = _operations()


def test_alice_reaching_for_charlies_objects_by_name_gets_404_and_changes_nothing(world: World) -> None:
    """Every operation of the schema that names an object, called by alice with the names and ids of charlie's:
    404, a message that gives nothing away, and charlie's objects as they were."""
    from accounts.models import ApiToken
    from deployments.models import Deployment
    from models_registry.models import Model
    from tuning.models import TuneRun

    charlie_token = ApiToken.objects.get(user=world.charlie.user)
    hidden = Deployment.objects.get(name=CHARLIE_DEPLOYMENT)
    charlies_tune = TuneRun.objects.create(deployment=hidden, team=hidden.team, p99_target_ms=20, budget_seconds=60,
                                           model_version=hidden.revision.versions.get(), request_body={})
    values = {"number": 1, "token_id": charlie_token.pk, "tune_id": charlies_tune.pk}
    bodies: dict[str, Any] = {"PATCH": {"description": "mine now"}, "POST": {}}
    client = world.alice.client()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {FUZZ_TOKEN}")
    calls = 0
    for result in OPERATIONS:
        operation = result.ok()
        if "{" not in operation.path:
            continue
        names = [CHARLIE_DEPLOYMENT] if "/deployments/" in operation.path else [CHARLIE_MODEL]
        for name in names:
            method, path = operation.method.upper(), operation.path.format(**values, name=name)
            body = json.dumps(bodies[method]) if method in bodies else ""
            response = client.generic(method, path, body, content_type="application/json")
            calls += 1
            assert response.status_code == 404, (method, path, response.content)
            # The 404 may quote the name alice sent (her own input); nothing else of charlie's may be in it.
            assert not world.leaks(response.content.decode().replace(name, "")), (method, path, response.content)
    assert calls >= 15
    assert Model.objects.get(team=world.charlie.team, name=CHARLIE_MODEL).description == ""
    assert Model.objects.get(name=CHARLIE_MODEL).versions.count() == 1
    charlies = Deployment.objects.get(name=CHARLIE_DEPLOYMENT)
    assert charlies.desired_state == Deployment.Desired.RUNNING and charlies.revision.number == 1
    charlies_tune.refresh_from_db()
    assert charlies_tune.status == "queued" and not charlies_tune.cancel_requested
    charlie_token.refresh_from_db()
    assert charlie_token.revoked_at is None
