"""Which deployments serve a model version (the registry asks before deleting one)."""

from __future__ import annotations

from django.db.models import Q

from models_registry.models import ModelVersion


def deployments_using_version(version: ModelVersion) -> list[str]:
    from deployments.models import Deployment

    # A canary's too: it serves, and promoting it makes it the serving revision.
    using = Deployment.objects.filter(Q(revision__versions=version) | Q(serving_revision__versions=version)
                                      | Q(canary_revision__versions=version))
    return sorted(set(using.values_list("name", flat=True)))
