"""Showing a new API token once, after the redirect that follows its creation, without storing it anywhere.

The page that creates a token redirects (so that a reload does not create another), and the next page shows the
token. In between, the token is split in two halves that are useless alone: the session (a database row) keeps the
token XORed with a random pad of the same length, and a short-lived cookie limited to the tokens page keeps the pad.
Showing the token removes both; a display never shown expires with its cookie, and what the session still holds then
reveals nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse

SESSION_KEY = "web_new_token"
COOKIE_NAME = "modelport_new_token"
DISPLAY_SECONDS = 300


@dataclass(frozen=True)
class NewToken:
    id: int
    prefix: str
    raw: str  # empty when the display expired before it was shown


def _xor(data: bytes, pad: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(data, pad, strict=True))


def keep_for_display(request: HttpRequest, response: HttpResponse, token_id: int, prefix: str, raw: str,
                     path: str) -> None:
    """Keep `raw` for the next GET of `path`, split between the session and a cookie on `response`."""
    data = raw.encode()
    pad = secrets.token_bytes(len(data))
    request.session[SESSION_KEY] = {"id": token_id, "prefix": prefix, "sealed": _xor(data, pad).hex()}
    response.set_cookie(COOKIE_NAME, pad.hex(), max_age=DISPLAY_SECONDS, path=path, httponly=True, samesite="Strict",
                        secure=settings.SESSION_COOKIE_SECURE)


def take_for_display(request: HttpRequest) -> NewToken | None:
    """The token kept for display, removed from the session (call forget_pad on the response as well)."""
    kept = request.session.pop(SESSION_KEY, None)
    if not isinstance(kept, dict) or "sealed" not in kept:
        return None  # nothing, or the old format that held the token itself: dropped unseen
    try:
        sealed, pad = bytes.fromhex(kept["sealed"]), bytes.fromhex(request.COOKIES.get(COOKIE_NAME, ""))
        raw = _xor(sealed, pad).decode() if len(pad) == len(sealed) else ""
    except (ValueError, TypeError):  # a cookie edited by hand
        raw = ""
    return NewToken(id=int(kept["id"]), prefix=str(kept["prefix"]), raw=raw)


def forget_pad(request: HttpRequest, response: HttpResponse, path: str) -> None:
    if COOKIE_NAME in request.COOKIES:
        response.delete_cookie(COOKIE_NAME, path=path, samesite="Strict")
