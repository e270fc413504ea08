"""DRF's JSON parser and JSONField with the nesting bound of modelport/core/json_input.py (see there for why)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from modelport.core.json_input import MAX_DEPTH, TooDeep, check_depth


class BoundedJSONParser(JSONParser):
    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
            check_depth(data)
        except (RecursionError, TooDeep):
            raise ParseError(f"JSON parse error - the body is nested deeper than {MAX_DEPTH} levels.") from None
        return data


class BoundedJSONField(serializers.JSONField):
    """A JSON value, given as JSON or as a JSON string in a form field, at most MAX_DEPTH levels deep."""

    default_error_messages = {"too_deep": f"Nested deeper than {MAX_DEPTH} levels."}

    def to_internal_value(self, data: Any) -> Any:
        try:
            value = super().to_internal_value(data)
            check_depth(value)
        except (RecursionError, TooDeep):
            self.fail("too_deep")
        return value
