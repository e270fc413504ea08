from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from accounts import actions
from accounts.models import TOKEN_SCOPES, Membership, Team, max_token_lifetime_days
from infra.names import name_error


class Command(BaseCommand):
    help = "Print a new API token for USER acting in TEAM (use --create to create the user and team first)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True)
        parser.add_argument("--team", required=True)
        parser.add_argument("--create", action="store_true", help="create the user, team and membership if missing")
        parser.add_argument("--admin", action="store_true", help="with --create: make the user a team admin")
        parser.add_argument("--name", default="", help="a label for the token, e.g. 'ci'")
        parser.add_argument("--expires-days", type=int, default=None,
                            help="days until it expires "
                                 "(default: API_TOKEN_MAX_LIFETIME_DAYS, or never when that is 0)")
        parser.add_argument("--scope", action="append", default=[], choices=sorted(TOKEN_SCOPES), dest="scopes",
                            help="what the token may do beyond the normal API (repeatable): "
                                 + "; ".join(f"{name}: {meaning}" for name, meaning in TOKEN_SCOPES.items()))

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        username, team_name = options["user"], options["team"]
        if options["create"]:
            error = name_error(team_name)
            if error:
                raise CommandError(f"team: {error}")
            user, _ = User.objects.get_or_create(username=username)
            team, made_team = Team.objects.get_or_create(name=team_name)
            if made_team:
                # A new team sees nothing of the others: a CI token made in 'ml' while the people use the UI in
                # 'default' deploys where they cannot see it. Said on stderr; stdout stays the token alone.
                self.stderr.write(f"Created team {team_name!r}: what this token creates is seen by the members of "
                                  f"{team_name!r} only, not by the other teams' (the first admin's is 'default').")
            role = Membership.Role.ADMIN if options["admin"] else Membership.Role.MEMBER
            Membership.objects.get_or_create(user=user, team=team, defaults={"role": role})
        else:
            existing_user = User.objects.filter(username=username).first()
            if existing_user is None:
                raise CommandError(f"No user {username!r} (add --create to create it).")
            existing_team = Team.objects.filter(name=team_name).first()
            if existing_team is None:
                raise CommandError(f"No team {team_name!r} (add --create to create it).")
            user, team = existing_user, existing_team
            if not Membership.objects.filter(user=user, team=team).exists():
                raise CommandError(f"{username!r} is not a member of {team_name!r} (add --create to add them).")
        expires, limit = options["expires_days"], max_token_lifetime_days()
        if expires is not None and not 1 <= expires <= limit:
            raise CommandError(f"--expires-days must be between 1 and {limit} days (API_TOKEN_MAX_LIFETIME_DAYS)")
        _, raw = actions.issue_token(user, team, name=options["name"],
                                     expires_in=timedelta(days=expires) if expires else None,
                                     scopes=options["scopes"], by=None, via="command")
        self.stderr.write(f"A token for {username!r} acting in team {team_name!r}.")
        self.stdout.write(raw)
