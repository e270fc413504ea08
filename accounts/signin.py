"""Throttled sign-in for the portal's and the admin's login pages.

An attempt from a browser without this account's device cookie counts against three keys, in fixed windows of
SIGN_IN_LOCKOUT_SECONDS: the client's address (SIGN_IN_MAX_FAILURES_PER_ADDRESS, whatever the usernames), the
account at that address (SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS) and the account from all such browsers
(SIGN_IN_MAX_FAILURES_PER_ACCOUNT, higher: it bounds a guesser spread over many addresses). A guesser at one address
therefore locks out that address and that account *at* that address, never the person everywhere: the real user
signs in from their own address. A browser that has signed in to an account before carries a signed device cookie
for it (OWASP's "device cookies"); its attempts count against that cookie alone, so that even a distributed attack
that spends the account's budget does not lock the user out of a browser they use, from any address.

A successful sign-in clears the pair's count and takes its own attempt back from the address's and the account's,
so that an office behind one address is not locked out by its colleagues' sign-ins. The count is taken *before* the
password is checked, so parallel guesses cannot all slip under the limit. The counters live in Redis when REDIS_URL
(or a Redis broker) is configured, so that every web process sees the same numbers; otherwise each process counts
on its own.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core import signing
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers

logger = logging.getLogger(__name__)

KEY_PREFIX = "modelport:signin:"
MAX_USERNAME_LENGTH = 150  # Django's username field; longer input still counts, by its first 150 characters
SIGNED_IN_ATTRIBUTE = "_modelport_signed_in"


class Counters(Protocol):
    def hit(self, key: str, window: int) -> tuple[int, int]:
        """Count one attempt under `key`; the count in the current window and the seconds left in it."""

    def forget(self, key: str) -> None:
        """Clear `key`'s count."""

    def take_back(self, key: str) -> None:
        """Undo one hit of `key`."""


class MemoryCounters:
    """Per-process counters: the fallback without Redis (one web process, or tests)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[int, float]] = {}  # key -> (count, window end on the monotonic clock)

    def hit(self, key: str, window: int) -> tuple[int, int]:
        now = time.monotonic()
        with self.lock:
            count, ends = self.entries.get(key, (0, 0.0))
            if ends <= now:
                count, ends = 0, now + window
                self._make_room(now)
            self.entries[key] = (count + 1, ends)
            return count + 1, max(1, math.ceil(ends - now))

    def forget(self, key: str) -> None:
        with self.lock:
            self.entries.pop(key, None)

    def take_back(self, key: str) -> None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                self.entries[key] = (max(0, entry[0] - 1), entry[1])

    def _make_room(self, now: float) -> None:
        # Usernames are attacker-chosen: bound the table. When it is full, expired windows go, then the oldest tenth,
        # so that the scan happens once per max_keys/10 new keys rather than on every one.
        if len(self.entries) < self.max_keys:
            return
        self.entries = {k: v for k, v in self.entries.items() if v[1] > now}
        if len(self.entries) >= self.max_keys:
            oldest = list(self.entries)[: max(1, self.max_keys // 10)]
            for key in oldest:
                del self.entries[key]


class RedisCounters:
    """Counters shared by every web process. A Redis that cannot be reached fails open (logged), so that an
    outage of the counters does not lock everybody out of the portal."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    def hit(self, key: str, window: int) -> tuple[int, int]:
        import redis

        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(key, 0, ex=window, nx=True)
            pipe.incr(key)
            pipe.ttl(key)
            _, count, ttl = pipe.execute()
        except redis.RedisError as exc:
            logger.warning("sign-in throttling is off while Redis cannot be reached: %s", exc)
            return 0, 0
        return int(count), max(1, int(ttl))

    def forget(self, key: str) -> None:
        import redis

        try:
            self.client.delete(key)
        except redis.RedisError as exc:
            logger.warning("could not clear a sign-in counter in Redis: %s", exc)

    def take_back(self, key: str) -> None:
        import redis

        try:
            # Only while the window lasts: DECR on an expired key would start a count of -1 with no expiry.
            self.client.eval("if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('DECR', KEYS[1]) end "
                             "return 0", 1, key)
        except redis.RedisError as exc:
            logger.warning("could not update a sign-in counter in Redis: %s", exc)


_counters: Counters | None = None
_counters_url: str | None = None
_counters_lock = threading.Lock()


def counters() -> Counters:
    """The process's counters for the configured REDIS_URL (made again when the setting changes, as in tests)."""
    global _counters, _counters_url
    url = settings.REDIS_URL
    with _counters_lock:
        if _counters is None or _counters_url != url:
            _counters = RedisCounters(url) if url else MemoryCounters()
            _counters_url = url
        return _counters


def reset_counters() -> None:
    """Forget the process's counters object (tests; a changed REDIS_URL is picked up without this)."""
    global _counters, _counters_url
    with _counters_lock:
        _counters, _counters_url = None, None


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or with NUM_PROXIES trusted proxies in front the entry of
    X-Forwarded-For that the outermost of them added. IPv6 clients are counted per /64 (what one host gets), IPv4
    clients of a dual-stack socket by their IPv4 address."""
    address = request.META.get("REMOTE_ADDR", "") or ""
    proxies: int = settings.NUM_PROXIES
    if proxies:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            address = forwarded[-min(proxies, len(forwarded))]
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # without a link-local zone ("fe80::1%eth0")
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 client of a dual-stack socket arrives as ::ffff:a.b.c.d: counted by its /64 (::/64), every IPv4
        # client would be one address, and one guesser would lock them all out. As portal/web_server.address_key.
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _key(kind: str, value: str) -> str:
    # Hashed: usernames and forwarded addresses are whatever the client sent.
    return KEY_PREFIX + kind + ":" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def account_name(username: str) -> str:
    """The account a submitted username counts against: case-folded, trimmed, its first 150 characters."""
    return username.strip().casefold()[:MAX_USERNAME_LENGTH]


@dataclass(frozen=True)
class Attempt:
    retry_after: int  # seconds; 0 when the attempt may go ahead
    reason: str  # why it was refused: "address", "pair", "account" or "device"; "" when it may go ahead
    forget: tuple[str, ...] = ()  # the keys a successful sign-in clears
    take_back: tuple[str, ...] = ()  # the keys a successful sign-in returns its own attempt to


def begin_attempt(username: str, address: str, device: str | None = None) -> Attempt:
    """Count one sign-in attempt; says whether it may go ahead. `device`: the id in a device cookie the browser
    holds for this very account (device_for), None without one."""
    window: int = settings.SIGN_IN_LOCKOUT_SECONDS
    per_pair: int = settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS
    store = counters()
    account = account_name(username)
    if device is not None:
        # A browser that signed in to this account before: only its own failures can stop it, so that neither a
        # guesser at the same address nor one spread over many addresses locks the user out of it.
        device_key = _key("device", device)
        count, ttl = store.hit(device_key, window)
        if count > per_pair:
            return Attempt(ttl, "device")
        return Attempt(0, "", forget=(device_key,))
    address_key = _key("address", address)
    # The address first, then the pair: an attempt refused by one is not counted by the next, so that a blocked
    # guesser cannot go on spending accounts' budgets (or filling the counters with made-up names), and one address
    # adds at most `per_pair` attempts per window to any account's count.
    count, ttl = store.hit(address_key, window)
    if count > settings.SIGN_IN_MAX_FAILURES_PER_ADDRESS:
        return Attempt(ttl, "address")
    pair_key = _key("pair", f"{account}\n{address}")
    count, ttl = store.hit(pair_key, window)
    if count > per_pair:
        return Attempt(ttl, "pair")
    account_key = _key("account", account)
    count, ttl = store.hit(account_key, window)
    if count > settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT:
        return Attempt(ttl, "account")
    return Attempt(0, "", forget=(pair_key,), take_back=(address_key, account_key))


def signed_in(attempt: Attempt) -> None:
    """The attempt succeeded: its pair (or device) starts afresh, its address and account get the attempt back."""
    store = counters()
    for key in attempt.forget:
        store.forget(key)
    for key in attempt.take_back:
        store.take_back(key)


# --- Device cookies ---------------------------------------------------------------------------------------------

DEVICE_COOKIE = "modelport_device"
DEVICE_SALT = "accounts.signin.device"
DEVICE_COOKIE_MAX_AGE = 365 * 24 * 3600  # a browser used once a year stays recognised


def device_for(request: HttpRequest, username: str) -> str | None:
    """The device id of the request's device cookie when it was issued for this account, else None. Signed with
    SECRET_KEY: a client cannot make one up, nor use the one of its own account for another."""
    value = request.COOKIES.get(DEVICE_COOKIE)
    if not value:
        return None
    try:
        payload = signing.loads(value, salt=DEVICE_SALT, max_age=DEVICE_COOKIE_MAX_AGE)
    except signing.BadSignature:
        return None
    if not isinstance(payload, dict) or payload.get("account") != account_name(username):
        return None
    device = payload.get("device")
    return device if isinstance(device, str) else None


def set_device_cookie(response: HttpResponseBase, username: str) -> None:
    """After a sign-in: this browser is recognised for this account (one account per browser, the last)."""
    value = signing.dumps({"account": account_name(username), "device": secrets.token_hex(16)}, salt=DEVICE_SALT)
    response.set_cookie(DEVICE_COOKIE, value, max_age=DEVICE_COOKIE_MAX_AGE, path="/", httponly=True,
                        samesite="Strict", secure=settings.SESSION_COOKIE_SECURE)


def mark_signed_in(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """The user_logged_in receiver: tells the throttled view that its attempt succeeded. A redirect alone would
    not say so (the login views also redirect a user who is signed in already)."""
    if request is not None:
        setattr(request, SIGNED_IN_ATTRIBUTE, True)


REFUSALS = {
    "address": "Too many failed sign-ins from your network address. Try again in {wait}.",
    "pair": "Too many failed sign-ins for this account from your network address. Try again in {wait}, or ask an "
            "operator to reset your password if you have forgotten it.",
    "account": "Too many failed sign-ins for this account from browsers it has not signed in with. Sign in from a "
               "browser you have signed in with before, or try again in {wait}.",
    "device": "Too many failed sign-ins for this account from this browser. Try again in {wait}, or ask an operator "
              "to reset your password if you have forgotten it.",
}


def refusal_message(attempt: Attempt) -> str:
    minutes = max(1, math.ceil(attempt.retry_after / 60))
    return REFUSALS[attempt.reason].format(wait=f"{minutes} minute{'s' if minutes != 1 else ''}")


def throttled(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Wrap a login view: its POSTs are counted, and refused with 429 and Retry-After past the limits.

    CsrfViewMiddleware refuses a post without its CSRF token before any view runs, so a page on another site that
    makes its visitors' browsers post sign-ins counts nothing against accounts or those visitors' addresses."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        username = request.POST.get("username", "")
        attempt = begin_attempt(username, client_address(request), device_for(request, username))
        if attempt.retry_after:
            return _refuse(request, attempt)
        response = view(request, *args, **kwargs)
        if getattr(request, SIGNED_IN_ATTRIBUTE, False):
            signed_in(attempt)
            set_device_cookie(response, username)
        return response

    return wrapper


def _refuse(request: HttpRequest, attempt: Attempt) -> HttpResponse:
    # The sign-in form again, empty, with the reason: the password was not checked.
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")[:MAX_USERNAME_LENGTH]})
    response = render(request, "registration/login.html", {
        "form": form,
        "throttled": refusal_message(attempt),
        "form_action": request.path,
        "next": request.POST.get("next", ""),
    }, status=429)
    response["Retry-After"] = str(attempt.retry_after)
    add_never_cache_headers(response)
    return response
