"""Where a deployment's files live on this machine (DEPLOYMENTS_DIR/<id>/) and the rendering of a revision's model
repository there, readable by the sandbox's uid."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.utils import timezone

from deployments import local_env, pyenvs
from deployments.models import Deployment, Revision
from deployments.render import render_repository
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.artifacts import artifact_path
from models_registry.validation import archive_limits


def deployment_dir(deployment: Deployment) -> Path:
    return Path(settings.DEPLOYMENTS_DIR) / str(deployment.pk)


def repository_dir(revision: Revision) -> Path:
    return deployment_dir(revision.deployment) / f"r{revision.number}" / "repository"


def render(revision: Revision) -> Path:
    """Render the revision's repository (idempotent: an existing complete render is reused)."""
    out = repository_dir(revision)
    if (out.parent / "rendered").exists():
        return out
    render_spec(revision.spec, out)
    (out.parent / "rendered").write_text(timezone.now().isoformat())
    Revision.objects.filter(pk=revision.pk).update(repository=str(out))
    return out


def render_spec(spec: RevisionSpec, out: Path) -> None:
    """Render `spec`'s repository into `out`, readable by the sandbox's uid (RenderError: it cannot be served)."""
    render_repository(spec.repository(lambda entry: artifact_path(entry.sha256)), "local", out,
                      local_frameworks=local_env.local_frameworks(), archive_limits=archive_limits())
    pyenvs.readable_by_all(out)
