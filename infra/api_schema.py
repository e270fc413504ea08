"""The OpenAPI schema says what the API does: CI users generate clients from it and tests/test_schema_fuzz.py holds
the API to it (schemathesis's conformance checks).

What every operation can answer is added here once, so that no view can forget it: 401 and 403 (every call needs a
team member's credentials), 404 where the path names something, 400, 413 and 415 where a JSON body is read, 400
where a query parameter is checked. Each view declares its success statuses and what is particular to it (409, 422,
an admin-only 403). Path parameters carry the constraints the URLs and the naming rule enforce, and creations link
to the operations that use what they created (OpenAPI links: clients follow them, schemathesis's stateful phase
walks them)."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import uritemplate
from django.http import QueryDict
from drf_spectacular import openapi
from drf_spectacular.plumbing import force_instance
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.fields import empty
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from infra.api_errors import ErrorSerializer
from infra.names import NAME_RE, NAME_RULE, RESERVED_NAMES, name_error

# The naming rule (infra/names.py) as a JSON Schema pattern: anchored, since JSON Schema patterns search.
NAME_SCHEMA: dict[str, Any] = {
    "type": "string", "pattern": f"^{NAME_RE.pattern}$", "minLength": 1, "maxLength": 63,
    "description": f"A name: {NAME_RULE}. Not {' or '.join(repr(n) for n in sorted(RESERVED_NAMES))}.",
}

# What the URL patterns (portal/urls.py) and the views accept in each path parameter.
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "name": {**NAME_SCHEMA, "example": "digits"},
    "number": {"type": "integer", "minimum": 1, "example": 1, "description": "A version number (1, 2, ...)."},
    "token_id": {"type": "integer", "minimum": 1, "example": 1, "description": "The token's id, as listed."},
}


# The Idempotency-Key header (accounts/idempotency.py checks it): its schema here, below every app's API.
MAX_KEY_LENGTH = 255
# Visible ASCII, as HTTP header values are on the wire: anything else (a NUL, which PostgreSQL cannot store) is a 400.
KEY_PATTERN = r"^[!-~]*$"


def error(description: str) -> OpenApiResponse:
    """An error response of one operation, with the one error body (infra/api_errors.py)."""
    return OpenApiResponse(ErrorSerializer, description=description)


@extend_schema_field(NAME_SCHEMA)
class NameField(serializers.CharField):
    """A name in a request body, checked by the one naming rule (infra/names.py), whose message is the same for
    every bad name, the empty one included (rather than DRF's own "may not be blank" or "too long")."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, **kwargs)

    def run_validation(self, data: Any = empty) -> Any:
        if data == "":
            raise serializers.ValidationError(name_error(data))
        value = super().run_validation(data)
        problem = name_error(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", {"type": "string", "maxLength": MAX_KEY_LENGTH, "pattern": KEY_PATTERN},
    OpenApiParameter.HEADER, required=False,
    description="A retry with the same key and the same request within 24 hours gets the "
                "first response again (with 'Idempotent-Replayed: true') instead of doing the work twice.",
)
IDEMPOTENCY_ERRORS = {
    409: error("A request with this Idempotency-Key is still running: retry shortly (Retry-After); or the name "
               "is taken."),
    422: error("This Idempotency-Key was used for a different request: use a new key."),
}

_BODY_METHODS = ("POST", "PUT", "PATCH")

# The JSON parsers of the settings (DEFAULT_PARSER_CLASSES), for views whose bodies are JSON only: the schema says
# so, and a form-encoded body could not carry their nested fields anyway.
_SETTINGS_PARSERS: list[type[BaseParser]] = list(api_settings.DEFAULT_PARSER_CLASSES)  # type: ignore[arg-type]
JSON_PARSERS: list[type[BaseParser]] = [parser for parser in _SETTINGS_PARSERS if issubclass(parser, JSONParser)]


class AutoSchema(openapi.AutoSchema):
    def _resolve_path_parameters(self, variables: list[str]) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super()._resolve_path_parameters(variables)
        for parameter in parameters:
            known = PATH_PARAMETERS.get(parameter["name"])
            if known is not None:
                schema = dict(known)
                description = schema.pop("description")
                parameter["schema"] = schema
                parameter["description"] = parameter.get("description") or description
        return parameters

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        serializer = force_instance(serializer)
        if direction == "response":
            # DRF writes every field into a response except one with required=False and no default whose
            # attribute is missing: the others are always there, which the generated clients should know.
            # A model instance has every attribute.
            every = isinstance(serializer, serializers.ModelSerializer)
            present = [name for name, field in serializer.fields.items()
                       if name in schema.get("properties", {})
                       and (every or field.required or field.read_only or field.default is not empty)]
            if present:
                schema["required"] = sorted(set(schema.get("required", [])) | set(present))
        return schema

    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        super()._insert_field_validators(field, schema)
        if getattr(field, "allow_empty", True) is False:  # DRF refuses [] and {} there
            if schema.get("type") == "array":
                schema["minItems"] = max(1, schema.get("minItems", 0))
            elif schema.get("type") == "object":
                schema["minProperties"] = max(1, schema.get("minProperties", 0))

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        for code, description in self._errors_of_every_call().items():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(error(description), str(code), direction=direction)
        return dict(sorted(responses.items()))

    def _errors_of_every_call(self) -> dict[int, str]:
        errors = {
            401: "No credentials, or an invalid, expired or revoked token.",
            403: "The user is in no team, or a browser session sent no CSRF token with a write.",
            503: "The portal's database is unreachable: nothing was changed; retry after Retry-After seconds.",
        }
        if uritemplate.variables(self.path):
            errors[404] = "Nothing of that name in your team (another team's objects do not exist for you)."
        # A NUL in the path or query is refused before any view (infra/null_bytes.py).
        invalid = ["a NUL character in the path or query"]
        reads_body = self.method in _BODY_METHODS and self._get_request_body() is not None
        if reads_body:
            invalid.insert(0, "the body ('fields' says which field and why)")
            errors[413] = "The body is over MAX_REQUEST_BODY_BYTES."
            errors[415] = "The body is not JSON (Content-Type: application/json)."
        # ("format" picks a renderer: DRF answers an unknown one with 404.)
        if any(p.get("in") == "query" and p.get("name") != "format" for p in self._get_parameters()):
            invalid.insert(0, "a query parameter ('fields' says which and why)")
        errors[400] = "Not valid: " + "; or ".join(invalid) + "."
        return errors


# (operation that creates, status, {linked operation: {path parameter: runtime expression}}): what a client does
# next with what it created. The names are the operationIds drf-spectacular derives from the paths.
_BY_NAME = {"name": "$response.body#/name"}
LINKS: list[tuple[str, str, dict[str, dict[str, str]]]] = [
    ("models_create", "201", {
        op: _BY_NAME for op in ("models_retrieve", "models_partial_update", "models_destroy", "models_versions_list",
                                "models_versions_create")}),
    ("models_versions_create", "201", {
        op: {"name": "$response.body#/model", "number": "$response.body#/number"}
        for op in ("models_versions_retrieve", "models_versions_destroy")}),
    ("deployments_create", "201", {
        op: _BY_NAME for op in ("deployments_retrieve", "deployments_partial_update", "deployments_destroy",
                                "deployments_stop_create", "deployments_start_create", "deployments_events_list",
                                "deployments_logs_retrieve", "deployments_manifests_retrieve",
                                "deployments_metrics_retrieve")}),
    ("tokens_create", "201", {"tokens_destroy": {"token_id": "$response.body#/id"}}),
]


def add_links(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """A drf-spectacular postprocessing hook: OpenAPI links from each creation to what uses the created object."""
    operations = {op["operationId"]: op for item in result.get("paths", {}).values() for op in item.values()
                  if isinstance(op, dict) and "operationId" in op}
    for source, status, targets in LINKS:
        response = operations[source]["responses"][status]
        response["links"] = {
            target: {"operationId": target, "parameters": parameters}
            for target, parameters in targets.items() if target in operations
        }
    return result


class ExactJSONTypes:
    """The mixin of every request body's serializer: the body is what the schema says, exactly.

    A field the serializer does not declare is refused (400, naming it by its path, "models[0].batchng"), at every
    level of nested serializers, rather than dropped as DRF does: a misspelt setting ("replicaz": 2) that did
    nothing while the request succeeded is a setting a CI job believes it has. Kubernetes' strict field validation
    and OpenAI's API refuse them the same way. Form data (multipart) is checked too: its fields and files.

    A JSON value of another type than the schema's is refused (400, naming the field) instead of coerced as DRF
    does (0 for a string, "5" or 5.0 for an integer, "yes" for a boolean), so that what the schema calls invalid is
    invalid. Form data is all text: DRF parses it as before.

    A string field holds printable characters only (no NUL, control character, line break or invisible separator:
    str.isprintable()), but those of `free_text_fields` (a description): names end up in logs, pages, Triton
    configurations and Kubernetes objects, where a newline or an escape could forge a line or a field.

    Nested serializers are checked from the top, so they need not carry the mixin. The schema says the same once for
    every request body (`refuse_unknown_properties`). `refused_fields` names fields refused for a reason of their
    own ({name: message}), said instead of "unknown"."""

    refused_fields: ClassVar[dict[str, str]] = {}
    free_text_fields: ClassVar[frozenset[str]] = frozenset()

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            errors = _unknown_fields(self, data)
            if not isinstance(data, QueryDict):
                for name, problem in _type_errors(self.fields, data).items():  # type: ignore[attr-defined]
                    errors.setdefault(name, problem)
                # PostgreSQL stores no NUL character, in text or in JSON: DRF's string fields refuse it, and so
                # must the JSON values (a signature, a warmup) that no string field sees.
                errors.update({name: [NUL_MESSAGE] for name, value in data.items()
                               if name not in errors and _holds_nul(value)})
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)  # type: ignore[misc]


class NoBodySerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """The body of an action that takes none (stop, start, promote, rollback, cancel): every field is unknown."""


def takes_no_body(view: Callable[..., Response]) -> Callable[..., Response]:
    """For an action whose schema has no request body (below @api_view): a body with fields is a 400 naming them,
    as for every other body ({"force": true} to a stop would otherwise be dropped and the stop done as asked);
    none, an empty one, {} or null is the action as usual."""

    @functools.wraps(view)
    def checked(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            data = request.data
        except exceptions.UnsupportedMediaType:
            raise serializers.ValidationError("This request takes no body: send none.") from None
        if isinstance(data, Mapping):
            if data:
                NoBodySerializer(data=data).is_valid(raise_exception=True)
        elif data is not None:
            raise serializers.ValidationError("This request takes no body: send none.")
        return view(request, *args, **kwargs)

    return checked


MAX_UNKNOWN_NAMED = 20  # a body of a million unknown keys is answered with the first few, not a million messages


def _unknown_fields(serializer: Any, data: Mapping[str, Any]) -> dict[Any, Any]:
    """{name: [message]} for each key of `data` that `serializer` does not take, or whose text is not printable, and
    nested errors of the same kinds for its nested serializers (a list of them: keyed by index)."""
    fields = serializer.fields
    writable = sorted(name for name, field in fields.items() if not field.read_only)
    refused = getattr(serializer, "refused_fields", {})
    free_text: frozenset[str] = getattr(serializer, "free_text_fields", frozenset())
    errors: dict[Any, Any] = {}
    for key in data:
        if len(errors) >= MAX_UNKNOWN_NAMED:
            break
        name = str(key)
        if name in refused:
            errors[name] = [refused[name]]
        elif name not in fields or fields[name].read_only:
            errors[name] = [_unknown_message(name, writable, name in fields)]
    for name, field in fields.items():
        value = data.get(name)
        if field.read_only or name in errors or value is None:
            continue
        # (A name's own rule says what a name may hold: NameField's message, the same for every bad name.)
        if (isinstance(field, serializers.CharField) and not isinstance(field, NameField) and isinstance(value, str)
                and name not in free_text):
            bad = next((char for char in value if not char.isprintable()), None)
            if bad is not None:
                errors[name] = [UNPRINTABLE_MESSAGE.format(char=ascii(bad))]
                continue
        if isinstance(field, serializers.ListSerializer) and isinstance(value, list):
            nested = {index: _unknown_fields(field.child, item) for index, item in enumerate(value)
                      if isinstance(item, Mapping)}
            nested = {index: problem for index, problem in nested.items() if problem}
            if nested:
                errors[name] = nested
        elif isinstance(field, serializers.Serializer) and isinstance(value, Mapping):
            problem = _unknown_fields(field, value)
            if problem:
                errors[name] = problem
    return errors


UNPRINTABLE_MESSAGE = ("The character {char} is not allowed here: only printable characters (no NUL, control "
                       "character, line break or invisible separator).")


def _unknown_message(name: str, writable: list[str], read_only: bool) -> str:
    if read_only:
        return f"'{name}' is set by the portal, not by a request: leave it out."
    close = difflib.get_close_matches(name, writable, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    if not writable:
        return f"Unknown field '{name}': this request takes no body."
    return f"Unknown field '{name}'.{hint} The fields here are: {', '.join(writable)}."


def _walk_objects(schema: Any, components: Mapping[str, Any], seen: set[str]) -> Iterator[dict[str, Any]]:
    """Every object schema in `schema` and below, through $refs (each component once) and combinators."""
    if isinstance(schema, list):
        for item in schema:
            yield from _walk_objects(item, components, seen)
        return
    if not isinstance(schema, dict):
        return
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            yield from _walk_objects(components.get(name), components, seen)
        return
    if "properties" in schema:
        yield schema
    for key in ("properties", "patternProperties"):
        for value in (schema.get(key) or {}).values():
            yield from _walk_objects(value, components, seen)
    for key in ("items", "additionalProperties", "not"):
        yield from _walk_objects(schema.get(key), components, seen)
    for key in ("allOf", "anyOf", "oneOf"):
        yield from _walk_objects(schema.get(key), components, seen)


def request_body_objects(result: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every object schema with properties that a request body of `result` (an OpenAPI document) can hold."""
    components = result.get("components", {}).get("schemas", {})
    seen: set[str] = set()
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict):
                for content in operation.get("requestBody", {}).get("content", {}).values():
                    yield from _walk_objects(content.get("schema"), components, seen)


def refuse_unknown_properties(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """A drf-spectacular postprocessing hook: every object of every request body says `additionalProperties:
    false`, as ExactJSONTypes enforces (a field of no serializer's is refused). Request components are the
    request's own (COMPONENT_SPLIT_REQUEST), so no response schema is changed."""
    for schema in request_body_objects(result):
        schema.setdefault("additionalProperties", False)
    return result


NUL_MESSAGE = "Null characters are not allowed."  # DRF's own words for a string field


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


def _type_errors(fields: Mapping[str, serializers.Field[Any, Any, Any, Any]],
                 data: Mapping[str, Any]) -> dict[str, Any]:
    errors: dict[str, Any] = {}
    for name, field in fields.items():
        if not field.read_only and name in data:
            problem = _type_error(field, data[name])
            if problem:
                errors[name] = problem
    return errors


def _type_error(field: Any, value: Any) -> Any:
    """What is wrong with the JSON type of `value` for `field` (a message, or nested errors), or None."""
    if value is None:
        return None  # allow_null is DRF's to check
    if isinstance(field, serializers.ListSerializer):
        if not isinstance(value, list):
            return None  # DRF says "expected a list"
        nested = {index: _type_error(field.child, item) for index, item in enumerate(value)}
        return {index: problem for index, problem in nested.items() if problem} or None
    if isinstance(field, serializers.Serializer):
        return (_type_errors(field.fields, value) or None) if isinstance(value, Mapping) else None
    if isinstance(field, serializers.ListField):
        if not isinstance(value, list):
            return None
        nested = {index: _type_error(field.child, item) for index, item in enumerate(value)}
        return {index: problem for index, problem in nested.items() if problem} or None
    if isinstance(field, serializers.DictField):
        if not isinstance(value, Mapping):
            return None
        nested = {key: _type_error(field.child, item) for key, item in value.items()}
        return {key: problem for key, problem in nested.items() if problem} or None
    # DRF's own messages, as for a value of the right type that it cannot read.
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else [field.error_messages["invalid"]]
    if isinstance(field, serializers.IntegerField):
        return None if isinstance(value, int) and not isinstance(value, bool) else [field.error_messages["invalid"]]
    if isinstance(field, serializers.FloatField):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else [field.error_messages["invalid"]]
    if isinstance(field, serializers.ChoiceField):
        return None if isinstance(value, str) else [field.error_messages["invalid_choice"].format(input=value)]
    if isinstance(field, (serializers.CharField, serializers.UUIDField)):
        return None if isinstance(value, str) else [field.error_messages["invalid"]]
    return None
