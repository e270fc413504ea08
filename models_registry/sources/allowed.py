"""What a team may import from (issue 35): its TeamSources row, or the settings' defaults without one."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from django.conf import settings

from models_registry.models import TeamSources


@dataclass(frozen=True)
class Allowed:
    mlflow_models: tuple[str, ...]  # glob patterns of registered model names
    huggingface_repos: tuple[str, ...]  # glob patterns of "org/name"
    huggingface_token: bool  # the operator's HF_TOKEN is sent for this team
    s3_buckets: tuple[str, ...]  # "bucket" or "bucket/prefix"
    https_hosts: tuple[str, ...]  # exact host names, lower case


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def allowed_for(team_id: int) -> Allowed:
    row = TeamSources.objects.filter(team_id=team_id).first()
    if row is None:
        return Allowed(mlflow_models=_lines(settings.IMPORT_MLFLOW_MODELS),
                       huggingface_repos=_lines(settings.IMPORT_HUGGINGFACE_REPOS),
                       huggingface_token=False, s3_buckets=(), https_hosts=())
    return Allowed(mlflow_models=_lines(row.mlflow_models), huggingface_repos=_lines(row.huggingface_repos),
                   huggingface_token=row.huggingface_token, s3_buckets=_lines(row.s3_buckets),
                   https_hosts=tuple(host.lower() for host in _lines(row.https_hosts)))


def matches(patterns: tuple[str, ...], name: str) -> bool:
    """Whether `name` matches one of the glob patterns (case-sensitive: MLflow and the hub are)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def bucket_allowed(buckets: tuple[str, ...], bucket: str, key: str) -> bool:
    """Whether s3://bucket/key is under one of the allowed "bucket" or "bucket/prefix" entries."""
    for entry in buckets:
        name, _, prefix = entry.partition("/")
        if name == bucket and key.startswith(prefix):
            return True
    return False
