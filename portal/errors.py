"""What a user sees when the server fails: a JSON error on the API, a plain page in the web UI, never a traceback.

While the database is unreachable (PostgreSQL restarting, a network cut) every request that needs it answers 503
with Retry-After instead of 500: the client did nothing wrong and should simply try again. Django opens a fresh
connection on a later request (CONN_HEALTH_CHECKS), so the portal recovers by itself when the database is back.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from infra.api_errors import error_response

log = logging.getLogger(__name__)

# OperationalError: the server refused or dropped the connection; InterfaceError: a connection that was dropped
# earlier is used again. Neither says anything about the request.
DATABASE_DOWN = (OperationalError, InterfaceError)
RETRY_AFTER_SECONDS = 5


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(("/api/", "/healthz", "/metrics")) or not request.accepts("text/html")


def database_unavailable(request: HttpRequest) -> HttpResponse:
    if wants_json(request):
        response: HttpResponse = error_response(
            503, "database_unavailable",
            "The portal's database is unreachable at the moment; nothing was changed. Retry in a few seconds.")
    else:
        # No request in the context: the context processors would query the database (request.user).
        response = HttpResponse(render_to_string("503.html"), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it inside the `except` of an unhandled exception (when DEBUG is off)."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_DOWN):
        return database_unavailable(request)
    if wants_json(request):
        return error_response(500, "server_error", "The server failed to answer this request; the error was logged.")
    return HttpResponse(render_to_string("500.html"), status=500)


class DatabaseOutageMiddleware:
    """A view that hits an unreachable database answers 503, with DEBUG on or off, and logs one line instead of a
    traceback per request for the length of the outage. (Errors outside views reach server_error above.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DATABASE_DOWN):
            return None
        log.warning("database unavailable: %s %s: %s", request.method, request.path, str(exception).strip())
        return database_unavailable(request)
