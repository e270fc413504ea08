"""What this portal can serve, in words for the upload page, the dashboard and the deploy form: which formats the
local runtime serves, and whether a Kubernetes cluster is configured. Read from the rules the deploy path applies
(deployments.spec.local_format_error, the Kubernetes runtime's own problem list), so the pages cannot promise what a
deployment would then refuse."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.local_env import local_frameworks
from deployments.models import Deployment
from deployments.runtimes.registry import runtime_named
from deployments.spec import local_format_error
from modelport.core import formats
from models_registry.models import Format

SHORT_NAMES = {Format(fmt.name): fmt.plural for fmt in formats.REGISTRY.values()}


@dataclass(frozen=True)
class Serving:
    local: tuple[str, ...]  # format values the local runtime serves
    not_local: tuple[str, ...]
    kubernetes_problem: str | None  # why no deployment can use the Kubernetes runtime here; None: it can

    @property
    def kubernetes_ready(self) -> bool:
        return self.kubernetes_problem is None

    def note(self) -> str:
        """One sentence: what this portal serves where."""
        local = _join([SHORT_NAMES[Format(f)] for f in self.local])
        rest = _join([SHORT_NAMES[Format(f)] for f in self.not_local])
        sentence = f"This portal's local runtime serves {local}."
        if rest:
            where = ("need the Kubernetes runtime" if self.kubernetes_ready
                     else "need a Kubernetes cluster, which no operator has configured here")
            sentence += f" {rest[0].upper()}{rest[1:]} {where}."
        return sentence


def serving() -> Serving:
    installed = local_frameworks()
    formats = [f.value for f in Format]
    local = tuple(f for f in formats if local_format_error(f, local_frameworks=installed) is None)
    problems = runtime_named(Deployment.Runtime.KUBERNETES).configuration_problems()
    return Serving(local=local, not_local=tuple(f for f in formats if f not in local and f != Format.ENSEMBLE),
                   kubernetes_problem=problems[0] if problems else None)


def _join(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]
