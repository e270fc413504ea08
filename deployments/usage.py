"""Which deployments serve a model version (the registry asks before deleting one, through its version_users signal:
it sits below this app)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.dispatch import receiver

from models_registry.models import ModelVersion
from models_registry.signals import version_users


@receiver(version_users)
def deployments_using_version(sender: Any = None, *, version: ModelVersion, **kwargs: Any) -> list[str]:
    from deployments.models import Deployment

    # A canary's too: it serves, and promoting it makes it the serving revision.
    using = Deployment.objects.filter(Q(revision__versions=version) | Q(serving_revision__versions=version)
                                      | Q(canary_revision__versions=version))
    return sorted(set(using.values_list("name", flat=True)))
