"""python manage.py render_manifests NAME [--team TEAM]: print a deployment's Kubernetes manifests (YAML)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments.models import Deployment
from deployments.runtimes.kubernetes.manifests import ManifestError
from deployments.runtimes.kubernetes.runtime import export_manifests


class Command(BaseCommand):
    help = "Print the Kubernetes manifests (multi-document YAML) of a deployment's current revision."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the deployment's name")
        parser.add_argument("--team", help="the team that owns it (needed when several teams use the name)")

    def handle(self, *args: Any, **options: Any) -> None:
        name, team = options["name"], options["team"]
        deployments = (Deployment.objects.select_related("team", "revision").filter(name=name)
                       .exclude(desired_state=Deployment.Desired.DELETED).order_by("team__name"))
        if team:
            deployments = deployments.filter(team__name=team)
        found = list(deployments)
        if not found:
            raise CommandError(f"No deployment named {name!r}" + (f" in team {team!r}." if team else "."))
        if len(found) > 1:
            teams = ", ".join(d.team.name for d in found)
            raise CommandError(f"Several teams have a deployment named {name!r} ({teams}): choose one with --team.")
        deployment = found[0]
        if deployment.runtime != Deployment.Runtime.KUBERNETES:
            raise CommandError(f"{deployment} runs on the {deployment.runtime} runtime: only deployments with runtime "
                               "'kubernetes' have Kubernetes manifests.")
        if deployment.revision is None:
            raise CommandError(f"{deployment} has no revision yet.")
        try:
            self.stdout.write(export_manifests(deployment), ending="")
        except ManifestError as exc:
            raise CommandError(f"{deployment} revision {deployment.revision.number} cannot run on Kubernetes as "
                               f"configured: {exc}") from None
