from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import Membership, Team


class Command(BaseCommand):
    help = "Create the first admin with a generated password, printed once, if no superuser exists yet."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin exists already; sign in with your own credentials.")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username="admin", email="", password=password)
        team, _ = Team.objects.get_or_create(name="default")
        Membership.objects.get_or_create(user=user, team=team, defaults={"role": Membership.Role.ADMIN})
        self.stdout.write(
            "\n".join(
                [
                    "",
                    "  First admin created. This password is shown once; change it after signing in.",
                    "    user:     admin",
                    f"    password: {password}",
                    "",
                ]
            )
        )
