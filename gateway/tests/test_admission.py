"""Admission, the steps every request passes over HTTP and gRPC alike (gateway/admission.py), as plain functions."""

from __future__ import annotations

import pytest

from gateway import admission
from gateway.access import Caller, Route
from gateway.contract import Contract
from gateway.pool_names import Pooled
from gateway.protocol import Refusal
from gateway.ratelimit import RateLimiter

CALLER = Caller(user_id=1, team_id=2, token_id=3, team_name="acme")
DIGITS = Contract(model="digits", max_batch_size=0, inputs=(), outputs=())


def _route(pooled: tuple[Pooled, ...] = ()) -> Route:
    return Route(deployment_id=1, name="d", upstream_url="http://a", status="ready", grpc_target="a:1", revision=4,
                 contracts={4: {"digits": DIGITS}}, team="acme", pooled=pooled)


def test_an_admitted_request_goes_to_the_serving_revision_with_no_pool() -> None:
    admitted = admission.admit(RateLimiter(0, 1), CALLER, _route(), "digits", None)
    assert admitted.refused is None
    choice, pooled = admitted.taken()
    assert (choice.upstream, choice.revision, pooled) == ("http://a", 4, None)


def test_grpc_requests_go_to_the_grpc_target() -> None:
    choice, _ = admission.admit(RateLimiter(0, 1), CALLER, _route(), "digits", None, grpc=True).taken()
    assert choice.upstream == "a:1"


def test_an_unknown_model_is_refused_with_the_revision_that_would_have_answered() -> None:
    admitted = admission.admit(RateLimiter(0, 1), CALLER, _route(), "other", None)
    assert admitted.choice is not None and admitted.choice.revision == 4  # the HTTP 404 still names it
    assert admitted.refused is not None and admitted.refused.status == 404
    assert "'digits'" in admitted.refused.message
    with pytest.raises(Refusal) as raised:
        admitted.taken()
    assert raised.value is admitted.refused


def test_a_caller_over_the_rate_limit_is_refused_before_a_revision_is_chosen() -> None:
    limiter = RateLimiter(0.001, 1)
    assert admission.admit(limiter, CALLER, _route(), "digits", None).refused is None
    admitted = admission.admit(limiter, CALLER, _route(), "digits", None)
    assert admitted.choice is None
    assert admitted.refused is not None and admitted.refused.status == 429
    assert admitted.refused.message == "Too many requests from you in this team; slow down."
    assert int(admitted.refused.headers["Retry-After"]) >= 1
    # Per user and team: another team of the same user has its own bucket.
    other = Caller(user_id=1, team_id=9, token_id=3)
    assert admission.admit(limiter, other, _route(), "", None).refused is None


def test_a_pooled_revision_comes_with_its_pool() -> None:
    pooled = Pooled(revision=4, prefix="t2-d-r4-", load_id=7, loaded=True)
    _, found = admission.admit(RateLimiter(0, 1), CALLER, _route(pooled=(pooled,)), "digits", None).taken()
    assert found is pooled


def test_the_contract_is_the_models_for_an_inference_only() -> None:
    route = _route()
    choice, _ = admission.admit(RateLimiter(0, 1), CALLER, route, "digits", None).taken()
    assert admission.contract(route, choice, "digits", "infer") is DIGITS
    assert admission.contract(route, choice, "digits", "metadata") is None
