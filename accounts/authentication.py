from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.tokens import authenticate_token, parse_bearer


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer mp_…`. request.auth is the ApiToken, whose team the request acts in."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        raw = parse_bearer(header)
        if raw is None:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>' with a Modelport API token.")
        token = authenticate_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("The API token is invalid, expired or revoked.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="modelport"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents the bearer token in the OpenAPI schema."""

    target_class = "accounts.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A Modelport API token: mp_…"}
