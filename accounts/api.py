"""REST API for the acting user: who am I, and my API tokens.

Token management is for people: a browser session manages its user's tokens in every team, an API token only when
it was created with the "tokens" scope, and then only its user's tokens in its own team."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes, permission_classes
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts import actions
from accounts.context import acting_user, current_membership, current_team
from accounts.idempotency import REPLAY_ATTRIBUTE, idempotent
from accounts.models import TOKEN_SCOPES, ApiToken, Membership, TokenLifetimeError, max_token_lifetime_days
from accounts.permissions import CanManageTokens
from infra.api_errors import error_body
from infra.api_schema import IDEMPOTENCY_KEY, JSON_PARSERS, ExactJSONTypes, error

SCOPES_FIELD_HELP = "What the token may do beyond the normal API: " + "; ".join(
    f"'{name}': {meaning}" for name, meaning in TOKEN_SCOPES.items()
)


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    team = serializers.CharField(source="team.name", read_only=True)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=sorted(TOKEN_SCOPES)), read_only=True,
                                   help_text=SCOPES_FIELD_HELP)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "team", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The token itself: in this response only (Modelport "
                                                            "keeps its hash). Send it as 'Authorization: Bearer …'.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


def _expires_in_days_field() -> serializers.IntegerField:
    limit = max_token_lifetime_days()
    return serializers.IntegerField(
        min_value=1, max_value=limit, required=False, allow_null=True,
        help_text=f"Days until the token expires, at most {limit} (API_TOKEN_MAX_LIFETIME_DAYS). Empty: the "
                  "maximum, or never when no maximum is configured. A token created by a token never outlives it.",
    )


class TokenCreateSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, allow_blank=True, required=False, default="",
                                 help_text="A label, e.g. 'ci'.")
    expires_in_days = _expires_in_days_field()
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=sorted(TOKEN_SCOPES)), required=False,
                                   default=list, max_length=len(TOKEN_SCOPES), help_text=SCOPES_FIELD_HELP)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The maximum is a setting: read it per request (and per schema generation), not once at import.
        self.fields["expires_in_days"] = _expires_in_days_field()


class TeamRoleSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MeSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    team = serializers.CharField(help_text="The team this request acts in (a token's team).")
    role = serializers.ChoiceField(choices=Membership.Role.choices, help_text="Your role in that team.")
    teams = TeamRoleSerializer(many=True, help_text="All your teams.")


@extend_schema(summary="Who am I", responses={200: MeSerializer})
@api_view(["GET"])
def me(request: Request) -> Response:
    user = acting_user(request)
    membership = current_membership(request)
    teams = Membership.objects.filter(user=user).select_related("team").order_by("team__name")
    return Response({
        "username": user.get_username(),
        "team": membership.team.name if membership else None,
        "role": membership.role if membership else None,
        "teams": [{"name": m.team.name, "role": m.role} for m in teams],
    })


def _manageable_tokens(request: Request) -> QuerySet[ApiToken]:
    """The tokens this request may see and revoke: its user's, and with a token only those of the token's team."""
    tokens = ApiToken.objects.filter(user=acting_user(request)).select_related("team")
    if isinstance(request.auth, ApiToken):
        tokens = tokens.filter(team_id=request.auth.team_id)
    return tokens


NOT_ALLOWED = error("A token without the 'tokens' scope, or a user in no team.")


@extend_schema(methods=["GET"], summary="List your API tokens",
               responses={200: TokenSerializer(many=True), 403: NOT_ALLOWED})
@extend_schema(
    methods=["POST"], summary="Create an API token", request=TokenCreateSerializer,
    parameters=[IDEMPOTENCY_KEY],
    responses={
        201: NewTokenSerializer,
        400: error("Invalid input, e.g. a lifetime over the maximum, or an Idempotency-Key over 255 characters."),
        403: NOT_ALLOWED,
        409: error("The Idempotency-Key already created a token (its value is not shown again: revoke it and "
                   "create another), or its first request is still running."),
        422: error("The Idempotency-Key was used for a different request."),
    },
)
@api_view(["GET", "POST"])
@parser_classes(JSON_PARSERS)
@permission_classes([CanManageTokens])
@idempotent
def tokens_list(request: Request) -> Response:
    if request.method == "GET":
        return Response(TokenSerializer(_manageable_tokens(request), many=True).data)
    user = acting_user(request)
    team = current_team(request)
    assert team is not None  # CanManageTokens: a member of a team
    serializer = TokenCreateSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    creator = request.auth if isinstance(request.auth, ApiToken) else None
    days = data.get("expires_in_days")
    try:
        token, raw = actions.issue_token(user, team, name=data["name"],
                                         expires_in=timedelta(days=days) if days else None, scopes=data["scopes"],
                                         created_by=creator, by=user,
                                         via=f"token {creator.prefix}" if creator else "session")
    except TokenLifetimeError as exc:
        raise ValidationError({"expires_in_days": [str(exc)]}) from None
    except actions.CreatorRevoked:
        # Revoked between this request's authentication and now: answered as if it had been revoked before.
        raise AuthenticationFailed("The API token is invalid, expired or revoked.") from None
    # The raw token is in this response only: it is stored hashed, and neither caches nor the idempotency record
    # keep it. A retry with the same Idempotency-Key learns which token exists, not its value.
    response = Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)
    response["Cache-Control"] = "no-store"
    setattr(response, REPLAY_ATTRIBUTE, (status.HTTP_409_CONFLICT, error_body(
        "token_already_created",
        f"This Idempotency-Key already created token mp_{token.prefix}_… (id {token.pk}) in team {team.name}. Its "
        "value was shown only in that first response and is not stored: if the response was lost, revoke the token "
        f"(DELETE /api/v1/tokens/{token.pk}/) and create another with a new key.",
    )))
    return response


@extend_schema(summary="Revoke an API token", request=None, responses={
    204: OpenApiResponse(description="Revoked (or revoked already), with every token it created, transitively."),
    403: NOT_ALLOWED,
    404: error("No such token among yours (with a token: among yours in its team)."),
})
@api_view(["DELETE"])
@permission_classes([CanManageTokens])
def token_detail(request: Request, token_id: int) -> Response:
    user = acting_user(request)
    token = _manageable_tokens(request).filter(pk=token_id).first()
    if token is None:
        raise Http404(f"There is no token {token_id} among the tokens you can manage: GET /api/v1/tokens/ lists "
                      "them.")
    via = f"token {request.auth.prefix}" if isinstance(request.auth, ApiToken) else "session"
    actions.revoke_token(token, by=user, via=via)
    return Response(status=status.HTTP_204_NO_CONTENT)
