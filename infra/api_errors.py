"""One JSON shape for every API error: {"error": {"code", "message", "fields"}}."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.utils import inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class Conflict(Exception):
    """A change that clashes with the current state (a name taken, a version in use): HTTP 409 in the API."""


class Invalid(Exception):
    """A request that the current state makes meaningless (a canary of the settings in effect already): HTTP 400
    in the API, its message under `field`; the pages put it beside their form."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ConflictError(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class ErrorSerializer(serializers.Serializer[Any]):
    """The body of every API error: the one error component of the OpenAPI schema (infra/api_schema.py)."""

    error = inline_serializer("ErrorDetail", {  # inline: "fields" is a name a Serializer class cannot declare
        "code": serializers.CharField(help_text="A stable machine-readable code, e.g. 'invalid', 'not_found'."),
        "message": serializers.CharField(help_text="What went wrong and what to do about it."),
        "fields": serializers.DictField(child=serializers.ListField(child=serializers.CharField()),
                                        help_text="Messages per request field (empty when no field is at fault)."),
    })


def not_found(what: str, name: str, team: object | None, hint: str = "") -> Http404:
    """A 404 that says what was missing and in which team (`team`: the request's, with a `name`): names are per
    team, and a token acts for the one team it was made in (the README's CI token for team 'ml' sees nothing of
    team 'default'). Naming the caller's own team tells nothing about another's."""
    return Http404(not_found_message(what, name, getattr(team, "name", None), hint))


def not_found_message(what: str, name: str, team_name: str | None, hint: str = "") -> str:
    """not_found's words, for the gateway too (its 404s are `{"error": message}`, not an Http404)."""
    where = (f"in team {team_name!r}, the team this request acts for" if team_name
             else "here: this request acts for no team (join one, or use a token made in one)")
    message = f"There is no {what} named {name!r} {where}."
    return f"{message} {hint}" if hint else message


def error_body(code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def error_response(status_code: int, code: str, message: str, fields: dict[str, list[str]] | None = None,
                   headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse(error_body(code, message, fields), status=status_code)
    for key, value in (headers or {}).items():
        response[key] = value
    return response


def request_object(request: Request) -> dict[str, Any]:
    """The request body as a mapping (a JSON object, or multipart/form fields); a 400 for any other JSON value."""
    data = request.data
    if not isinstance(data, dict):
        raise exceptions.ValidationError("The request body must be a JSON object.")
    return data


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error detail into {"models[0].max_batch_size": ["..."]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int) or str(key).isdigit():  # a list's errors keyed by index
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            out.update(_flatten(value, name))
    elif isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            out[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                if item:
                    out.update(_flatten(item, f"{prefix}[{index}]"))
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, Http404):
        # The lookup helpers' message names what was not found and in which team (`not_found`); a bare Http404
        # keeps DRF's "Not found.".
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, Conflict):
        exc = ConflictError(str(exc))
    elif isinstance(exc, Invalid):
        exc = exceptions.ValidationError({exc.field: [exc.message]})
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        general = fields.pop("non_field_errors", [])
        parts = general + [f"{name}: {' '.join(msgs)}" for name, msgs in fields.items()]
        message = "; ".join(parts) or "Invalid input."
        response.data = error_body("invalid", message, fields)
    else:
        detail = getattr(exc, "detail", str(exc))
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        response.data = error_body(str(code), str(detail))
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Bearer realm="modelport"'
    return response


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: a path under /api/ that no URL matches (a version number that is not a number, a name with a
    slash) gets the API's JSON error, like every other API 404; pages get the page."""
    if request.path.startswith("/api/"):
        return error_response(status.HTTP_404_NOT_FOUND, "not_found",
                              f"There is no API endpoint at {request.path}: see /api/v1/docs/.")
    return defaults.page_not_found(request, exception)
