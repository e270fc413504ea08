"""Refuse a NUL character in a request's path or query string, before any view puts it in a database query.

PostgreSQL cannot hold NUL in text: psycopg2 raises ValueError for a query parameter containing one, which Django
answers with 500. No name, id or filter value of the portal contains one, so such a request is a client's mistake
(a fuzzer's `/api/v1/models/a%00b/` or `?action=%00`): 400, in the API's JSON shape under /api/.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from infra.api_errors import error_response

MESSAGE = "The request path or query string contains a NUL character (%00), which no name or value here can hold."


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or b"\x00" in unquote_to_bytes(request.META.get("QUERY_STRING", "")):
            if request.path.startswith("/api/"):
                return error_response(400, "invalid", MESSAGE)
            return HttpResponseBadRequest(MESSAGE, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
