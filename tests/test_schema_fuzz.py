"""Property-based fuzzing of the REST API against its own OpenAPI schema (issue 12): schemathesis generates requests
from /api/v1/schema/ (examples, the coverage phase's boundary and negative cases, random fuzzing, and stateful
sequences that follow the schema's links) and holds every answer to all of its checks: no 5xx, every status and
content type documented, every body valid against its schema, schema-invalid requests refused and schema-valid ones
accepted, auth not ignored, deleted things gone. A check of our own adds: no answer to alice mentions anything of
charlie's team.

The app runs in-process through its WSGI entry point (portal.wsgi), so that it shares the test's database
transaction: everything Django and DRF do is exercised, the ASGI layers in front of them (the gateway, the tus
PATCH path, the body cap) are not, and have their own hostile-input tests (gateway/tests/, tests/test_nasty_inputs.py,
models_registry/tests/test_tus*.py). The tus endpoints speak their own protocol and are not in the schema.
Deployments are created but never started: the reconciler's on_commit never fires inside the test transaction.

Bounded for CI (about a minute on two cores) and reproducible: FUZZ_EXAMPLES sets the random examples per
operation (default 20) and the stateful phase's scenarios, FUZZ_SEED the seed (default 12); the coverage phase's
cases do not depend on either. To go deeper: make fuzz FUZZ_EXAMPLES=500 FUZZ_SEED=$RANDOM
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, seed, settings
from schemathesis import Config

from tests.schema_world import FUZZ_TOKEN, World

# Every test here is a fuzz test: `make test-fast` leaves the file out rather than collecting it (schemathesis
# builds each operation's cases at collection, seconds of CPU for tests that are then deselected).
pytestmark = [pytest.mark.django_db, pytest.mark.fuzz]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
SEED = int(os.environ.get("FUZZ_SEED", "12"))

# Requests that the schema cannot tell from valid ones: they name other objects (an upload, the models to deploy,
# the steps of a pipeline) or carry an Idempotency-Key a previous example used for another body. A schema-valid
# request there may be refused with 400 or 422; everything else must be accepted.
STATEFUL_VALIDITY = [
    ("POST", "/api/v1/models/{name}/versions/", ["400", "422"]),
    ("POST", "/api/v1/deployments/", ["400", "422"]),
    ("PATCH", "/api/v1/deployments/{name}/", ["400"]),
    ("POST", "/api/v1/models/", ["422"]),
    ("POST", "/api/v1/tokens/", ["422"]),
    # A tune needs a local deployment serving a model, and its fields agree with each other (the concurrency range,
    # the sample and its request): the schema cannot say either.
    ("POST", "/api/v1/deployments/{name}/tune", ["400"]),
    # The recommended settings must still fit the deployment (planned again).
    ("POST", "/api/v1/deployments/{name}/tunes/{tune_id}/apply", ["400"]),
    # ?version is a version of ?model: alone it is a 400 naming what to add (the schema cannot tie the two).
    ("GET", "/api/v1/pools/", ["400"]),
]
POSITIVE_STATUSES = ["2xx", "401", "403", "404", "409"]


def _config() -> Config:
    return Config.from_dict({
        "seed": SEED,
        # The credentials are the configured ones: generated session cookies would only be ignored beside them.
        # The credentials are alice's token (AliceToken below); generated session cookies would only be ignored.
        "generation": {"max-examples": EXAMPLES, "database": "none", "with-security-parameters": False},
        "checks": {"positive_data_acceptance": {"expected-statuses": POSITIVE_STATUSES}},
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": True, "max-steps": 10}},
        "operations": [
            {"include-method": method, "include-path": path,
             "checks": {"positive_data_acceptance": {"expected-statuses": [*POSITIVE_STATUSES, *extra]}}}
            for method, path, extra in STATEFUL_VALIDITY
        ],
    })


def _load() -> Any:
    from django.conf import settings as django_settings
    from hypothesis.configuration import set_hypothesis_home_dir

    from portal.wsgi import application

    # Hypothesis keeps caches on disk: in this test run's var/ (removed after the run), not in the checkout.
    set_hypothesis_home_dir(django_settings.VAR_DIR / "hypothesis")

    return schemathesis.openapi.from_wsgi("/api/v1/schema/", application, config=_config())


schema = _load()


@schemathesis.deserializer("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/vnd.yaml")
def manifests_or_an_error(ctx: Any, response: Any) -> Any:
    """The manifests are a multi-document YAML stream, a string in the schema; an error asked for as YAML is one
    document, the error object."""
    documents = list(yaml.safe_load_all(response.content))
    return documents[0] if len(documents) == 1 else response.content.decode()


@schema.auth()
class AliceToken:
    """alice's token on every request: schemathesis's auth checks know it as the run's credentials, take it away
    and expect 401."""

    def get(self, case: Any, context: Any) -> str:
        return FUZZ_TOKEN

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@contextlib.contextmanager
def one_connection() -> Iterator[None]:
    """Django closes the database connection at the end of each request, which would end the test's transaction;
    its test client keeps it open the same way."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def no_other_teams_objects(world: World) -> Any:
    """A check for schemathesis: an answer to alice that mentions anything of charlie's fails the run."""

    def no_other_teams_objects(ctx: Any, response: Any, case: Any) -> None:
        leaked = world.leaks(response.text)
        if leaked:
            raise AssertionError(f"{case.method} {case.formatted_path} answered {response.status_code} with another "
                                 f"team's {leaked}: {response.text[:500]}")

    return no_other_teams_objects


FUZZ_SETTINGS = settings(
    # The world is built once per operation; the examples of one operation share it, as requests share a database.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
    deadline=None,
)


# A name no request body takes (infra/api_schema.py ExactJSONTypes).
UNKNOWN_FIELD = "zz_no_such_field"


def an_unknown_field_is_refused(case: Any, response: Any) -> None:
    """A body the API accepted (a JSON object or a multipart form), sent again with one field more that no request
    takes, is refused with 400 naming that field: unknown fields are refused, not dropped (issue 30). The schema
    says so (additionalProperties: false), and schemathesis's negative cases test it too where its generator adds a
    property; this check makes sure for every body the run got accepted."""
    if case.method not in ("POST", "PUT", "PATCH") or not isinstance(case.body, dict) or response.status_code >= 300:
        return
    from requests.structures import CaseInsensitiveDict

    # Without its Idempotency-Key, which would answer the different body with 422 before the view reads it.
    headers = CaseInsensitiveDict({key: value for key, value in (case.headers or {}).items()
                                   if key.lower() != "idempotency-key"})
    headers["Authorization"] = f"Bearer {FUZZ_TOKEN}"
    probe = case.derive(headers=headers)
    probe.body[UNKNOWN_FIELD] = "1"
    answer = probe.call()
    assert answer.status_code == 400, (f"{case.method} {case.formatted_path} accepted an unknown field: "
                                       f"{answer.status_code} {answer.text[:500]}")
    fields = answer.json()["error"]["fields"]
    assert UNKNOWN_FIELD in fields, (case.method, case.formatted_path, fields)


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_answers_as_its_schema_says(case: Any, world: World) -> None:
    with one_connection():
        response = case.call_and_validate(additional_checks=[no_other_teams_objects(world)])
        an_unknown_field_is_refused(case, response)


def test_sequences_that_follow_the_schemas_links_answer_as_it_says(world: World) -> None:
    """The stateful phase: create something, then read, change, stop, delete it through the links the schema
    declares (infra/api_schema.py LINKS) and the ones schemathesis infers; every answer checked as above."""
    from django.db import transaction
    from schemathesis.generation.stateful import run_state_machine_as_test

    leak_check = no_other_teams_objects(world)

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        # Each scenario starts from the same world: a savepoint of the test's transaction, rolled back after it.
        def setup(self) -> None:
            self.savepoint = transaction.savepoint()

        def teardown(self) -> None:
            transaction.savepoint_rollback(self.savepoint)

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            super().validate_response(response, case, additional_checks=[leak_check], **kwargs)

    with one_connection():
        run_state_machine_as_test(seed(SEED)(Machine), settings=settings(
            # Generation only, as schemathesis runs its stateful phase: a scenario replayed to shrink it would meet
            # ids and timestamps of its own first run.
            max_examples=EXAMPLES, stateful_step_count=10, deadline=None, database=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck)))
