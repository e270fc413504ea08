"""REST API for the acting user: who am I, and my API tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import acting_user, current_membership, current_team
from accounts.idempotency import idempotent
from accounts.models import ApiToken, Membership
from audit.log import record as audit


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    team = serializers.CharField(source="team.name", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "team", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class TokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, allow_blank=True, required=False, default="")
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False, allow_null=True)


@extend_schema(responses=inline_serializer("Me", {
    "username": serializers.CharField(), "team": serializers.CharField(), "role": serializers.CharField(),
    "teams": serializers.ListField(child=serializers.DictField()),
}))
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


@extend_schema(request=TokenCreateSerializer, responses=TokenSerializer(many=True))
@api_view(["GET", "POST"])
@idempotent
def tokens_list(request: Request) -> Response:
    user = acting_user(request)
    if request.method == "POST":
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        days = serializer.validated_data.get("expires_in_days")
        with transaction.atomic():
            token, raw = ApiToken.issue(user, current_team(request), name=serializer.validated_data["name"],  # type: ignore[arg-type]
                                        expires_in=timedelta(days=days) if days else None)
            audit(user, token.team, "token.create", token.prefix, name=token.name)
        # The raw token is in this response only: it is stored hashed.
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)
    tokens = ApiToken.objects.filter(user=user).select_related("team")
    return Response(TokenSerializer(tokens, many=True).data)


@extend_schema(request=None, responses={204: None})
@api_view(["DELETE"])
def token_detail(request: Request, token_id: int) -> Response:
    user = acting_user(request)
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise Http404
    with transaction.atomic():
        token.revoke()
        audit(user, token.team, "token.revoke", token.prefix, name=token.name)
    return Response(status=status.HTTP_204_NO_CONTENT)
