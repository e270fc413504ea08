"""Admission: what every request to a deployment passes before it is forwarded, over HTTP and gRPC alike (issue 32).

After the caller and its route are known (each protocol reads its own credentials and names the deployment its own
way), the steps are the same everywhere and live here once: the rate limit per user and team, the revision that
answers (`choose`: a pinned one, a canary's draw, or the serving one), the model's 404 (gateway/not_found.py), the
shared pool the revision is in, the cold start of an idle-unloaded one, and the model's contract for checking the
answer. Each step raises or returns a `Refusal` in the HTTP gateway's words; each protocol adapts it to its own error
shape (an HTTP error body, a gRPC status, an error message in a ModelStreamInfer stream).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import contract as contracts
from gateway import not_found, pool_names
from gateway.access import Caller, Choice, Route, TtlCache, choose
from gateway.cold_start import ColdStarts
from gateway.protocol import GENERATE_KINDS, Refusal
from gateway.ratelimit import RateLimiter, retry_after_header

TOO_MANY = "Too many requests from you in this team; slow down."


@dataclass(frozen=True)
class Admission:
    """Where an admitted request goes, or why it was refused. `choice` is set once a revision was chosen, refused
    or not, so that a refusal after it (the model's 404) still names the revision that would have answered."""

    choice: Choice | None
    pooled: pool_names.Pooled | None = None
    refused: Refusal | None = None

    def taken(self) -> tuple[Choice, pool_names.Pooled | None]:
        """The revision and pool of an admitted request; a refusal is raised, for each protocol's own error shape."""
        if self.refused is not None:
            raise self.refused
        if self.choice is None:  # admit() never returns this: a choice or a refusal
            raise Refusal(500, "No revision was chosen for this request.")
        return self.choice, self.pooled


def rate_limit(limiter: RateLimiter, caller: Caller) -> None:
    # Per user and team, whichever token, session or protocol they come with: minting tokens does not multiply it.
    wait = limiter.check((caller.user_id, caller.team_id))
    if wait:
        raise Refusal(429, TOO_MANY, {"Retry-After": retry_after_header(wait)})


def admit(limiter: RateLimiter, caller: Caller, route: Route, model: str, pinned: str | None,
          grpc: bool = False) -> Admission:
    """Rate limit, revision and model for one request; a refusal is returned, never raised, with the choice made."""
    try:
        rate_limit(limiter, caller)
    except Refusal as exc:
        return Admission(None, refused=exc)
    choice = choose(route, pinned, grpc=grpc)
    try:
        # A dedicated deployment's Triton and a shared one's pool would each answer another way (not_found.py).
        not_found.check_model(model, route.models_of(choice.revision), route.name, route.team)
    except Refusal as exc:
        return Admission(choice, refused=exc)
    return Admission(choice, route.pooled_for(choice.revision))


async def cold_start(cold_starts: ColdStarts, routes: TtlCache[tuple[int, str], Route | None], route: Route,
                     pooled: pool_names.Pooled, caller: Caller) -> None:
    """A request to an idle-unloaded revision of a shared pool (issue 24) is held while the revision loads."""
    if not pooled.loaded:
        await cold_starts.hold(route, pooled, caller.team_id, routes)


def contract(route: Route, choice: Choice, model: str, kind: str) -> contracts.Contract | None:
    """The model's signature an inference's answer is checked against (gateway/contract.py), for the generate
    endpoints the one its errors are reworded with; none for the rest. A streaming (decoupled) model is refused on
    /infer (HTTP's and gRPC's unary ModelInfer) here, in words, where Triton would answer with its own."""
    if kind == "infer":
        found = route.contract(choice.revision, model)
        if found is not None and found.decoupled:
            raise Refusal(400, decoupled_refusal(model))
        return found
    return route.contract(choice.revision, model) if kind in GENERATE_KINDS else None


def decoupled_refusal(model: str) -> str:
    return (f"Model '{model}' streams its answer (a decoupled model), so it has no single answer for /infer: use "
            f"POST .../v2/models/{model}/generate_stream (Server-Sent Events, one per piece) or gRPC's "
            "ModelStreamInfer.")
