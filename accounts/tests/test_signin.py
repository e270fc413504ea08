"""Sign-in throttling, per address, per account at an address, per account from browsers that never signed in to
it, and per recognised browser, on the portal's and the admin's sign-in pages (the shipped limits:
test_signin_lockout.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, RequestFactory

from accounts import signin
from tests.support.people import Person

LIMIT_PER_PAIR = 3  # an account at one address, or from one recognised browser
LIMIT_PER_ADDRESS = 6
LIMIT_PER_ACCOUNT = 8  # an account from browsers that never signed in to it, all addresses together


@pytest.fixture(autouse=True)
def _small_limits(settings: Any) -> None:
    settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS = LIMIT_PER_PAIR
    settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT = LIMIT_PER_ACCOUNT
    settings.SIGN_IN_MAX_FAILURES_PER_ADDRESS = LIMIT_PER_ADDRESS
    settings.SIGN_IN_LOCKOUT_SECONDS = 600


def sign_in(username: str, password: str, address: str = "198.51.100.7", path: str = "/login/",
            client: Client | None = None, **extra: str) -> Any:
    return (client or Client()).post(path, {"username": username, "password": password}, REMOTE_ADDR=address, **extra)


def test_an_account_is_refused_with_429_and_retry_after_past_its_failures(alice: Person) -> None:
    for n in range(LIMIT_PER_ACCOUNT):
        # From a different address each time: only the account's count can stop it.
        assert sign_in("alice", "wrong", address=f"203.0.113.{n}").status_code == 200
    refused = sign_in("alice", "wrong", address="203.0.113.99")
    assert refused.status_code == 429
    assert 540 <= int(refused["Retry-After"]) <= 600
    page = refused.content.decode()
    assert "Too many failed sign-ins for this account from browsers it has not signed in with" in page
    assert "or try again in 10 minutes" in page
    assert 'id="login-form"' in page  # the form again, with the reason
    assert "no-cache" in refused["Cache-Control"]


def test_an_account_is_refused_at_an_address_past_its_failures_there(alice: Person) -> None:
    for _ in range(LIMIT_PER_PAIR):
        assert sign_in("alice", "wrong", address="203.0.113.1").status_code == 200
    refused = sign_in("alice", "wrong", address="203.0.113.1")
    assert refused.status_code == 429
    assert "Too many failed sign-ins for this account from your network address" in refused.content.decode()
    assert sign_in("alice", "password", address="203.0.113.2").status_code == 302


def test_the_right_password_is_refused_too_while_an_account_is_locked(alice: Person) -> None:
    for _ in range(LIMIT_PER_PAIR):
        sign_in("alice", "wrong", address="192.0.2.1")
    client = Client()
    assert sign_in("alice", "password", address="192.0.2.1", client=client).status_code == 429
    assert "_auth_user_id" not in client.session
    for n in range(LIMIT_PER_ACCOUNT):
        sign_in("alice", "wrong", address=f"203.0.113.{n}")
    assert sign_in("alice", "password", address="192.0.2.2", client=client).status_code == 429
    assert "_auth_user_id" not in client.session


def test_the_account_key_ignores_case_and_surrounding_spaces(alice: Person) -> None:
    for name in ["alice", "ALICE", " Alice "]:
        sign_in(name, "wrong", address="203.0.113.1")
    assert sign_in("alice", "wrong", address="203.0.113.1").status_code == 429


def test_an_address_is_refused_past_its_failures_across_accounts(alice: Person) -> None:
    for n in range(LIMIT_PER_ADDRESS):
        # A different (made-up) account each time: only the address's count can stop it.
        assert sign_in(f"guess{n}", "wrong").status_code == 200
    refused = sign_in("alice", "password")
    assert refused.status_code == 429
    assert "from your network address" in refused.content.decode()
    assert int(refused["Retry-After"]) > 0
    assert sign_in("alice", "password", address="198.51.100.8").status_code == 302  # other addresses are fine


def test_a_blocked_address_stops_counting_against_the_accounts_it_tries(alice: Person) -> None:
    for n in range(LIMIT_PER_ADDRESS):
        sign_in(f"guess{n}", "wrong")
    for _ in range(LIMIT_PER_ACCOUNT + 2):
        assert sign_in("alice", "wrong").status_code == 429  # refused for the address, alice's counts untouched
    assert sign_in("alice", "password", address="198.51.100.9").status_code == 302


def test_a_successful_sign_in_clears_the_accounts_failures(alice: Person) -> None:
    for _ in range(LIMIT_PER_PAIR - 1):
        sign_in("alice", "wrong", address="192.0.2.10")
    assert sign_in("alice", "password", address="192.0.2.10").status_code == 302
    for _ in range(LIMIT_PER_PAIR):
        assert sign_in("alice", "wrong", address="192.0.2.10").status_code == 200


def test_colleagues_signing_in_from_one_address_do_not_lock_it(alice: Person) -> None:
    for _ in range(LIMIT_PER_ADDRESS + 3):
        assert sign_in("alice", "password", address="192.0.2.20").status_code == 302


def test_signing_in_to_your_own_account_does_not_reset_a_guessed_one(alice: Person, bob: Person) -> None:
    for n in range(LIMIT_PER_ACCOUNT - 1):
        sign_in("alice", "wrong", address=f"203.0.113.{n}")
    assert sign_in("bob", "password", address="203.0.113.30").status_code == 302
    sign_in("alice", "wrong", address="203.0.113.31")
    assert sign_in("alice", "wrong", address="203.0.113.32").status_code == 429


def test_a_signed_in_user_posting_the_form_again_does_not_reset_anyones_count(alice: Person, bob: Person) -> None:
    """The login page redirects a signed-in user without checking anything: that redirect is no sign-in."""
    for n in range(LIMIT_PER_ACCOUNT - 1):
        sign_in("alice", "wrong", address=f"203.0.113.{n}")
    bobs = Client()
    bobs.force_login(bob.user)
    assert sign_in("alice", "whatever", client=bobs).status_code == 302
    sign_in("alice", "wrong", address="203.0.113.40")
    assert sign_in("alice", "wrong", address="203.0.113.41").status_code == 429


def test_cross_site_posts_without_a_csrf_token_are_not_counted(alice: Person) -> None:
    forged = Client(enforce_csrf_checks=True)
    for _ in range(LIMIT_PER_ACCOUNT + LIMIT_PER_ADDRESS):
        assert sign_in("alice", "wrong", client=forged).status_code == 403
    assert sign_in("alice", "password").status_code == 302


def test_the_admin_sign_in_is_throttled_too(alice: Person) -> None:
    alice.user.is_staff = True
    alice.user.save()
    for _ in range(LIMIT_PER_PAIR):
        assert sign_in("alice", "wrong", address="203.0.113.60", path="/admin/login/").status_code == 200
    refused = sign_in("alice", "password", address="203.0.113.60", path="/admin/login/")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0
    assert 'action="/admin/login/"' in refused.content.decode()
    # One count for both pages: failures on one lock the other.
    assert sign_in("alice", "password", address="203.0.113.60").status_code == 429


def test_the_admin_sign_in_still_works(alice: Person) -> None:
    alice.user.is_staff = True
    alice.user.is_superuser = True
    alice.user.save()
    client = Client()
    response = sign_in("alice", "password", path="/admin/login/", client=client)
    assert response.status_code == 302
    assert client.get("/admin/").status_code == 200


def test_forwarded_for_counts_only_behind_the_configured_proxies(alice: Person, settings: Any) -> None:
    # Without trusted proxies a client's X-Forwarded-For is ignored: it cannot pick a fresh address per guess.
    for n in range(LIMIT_PER_ADDRESS):
        sign_in(f"guess{n}", "wrong", address="10.0.0.5", HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
    assert sign_in("guess-x", "wrong", address="10.0.0.5", HTTP_X_FORWARDED_FOR="192.0.2.77").status_code == 429

    # Behind one proxy, the address is the one that proxy added (the last entry), whatever the client put first.
    settings.NUM_PROXIES = 1
    for n in range(LIMIT_PER_ADDRESS):
        sign_in(f"other{n}", "wrong", address="10.0.0.5", HTTP_X_FORWARDED_FOR=f"6.6.6.{n}, 198.51.100.50")
    refused = sign_in("other-x", "wrong", address="10.0.0.5", HTTP_X_FORWARDED_FOR="7.7.7.7, 198.51.100.50")
    assert refused.status_code == 429
    assert sign_in("alice", "password", address="10.0.0.5", HTTP_X_FORWARDED_FOR="198.51.100.51").status_code == 302


def test_ipv6_clients_are_counted_per_64_network(alice: Person) -> None:
    for n in range(LIMIT_PER_ADDRESS):
        sign_in(f"guess{n}", "wrong", address=f"2001:db8:1:2::{n + 1:x}")
    assert sign_in("guess-x", "wrong", address="2001:db8:1:2:ffff::1").status_code == 429
    assert sign_in("alice", "password", address="2001:db8:1:3::1").status_code == 302


def test_hostile_usernames_are_counted_without_errors(alice: Person) -> None:
    for n, name in enumerate(["x" * 100_000, "\x00", "", "ä" * 200]):
        assert sign_in(name, "wrong", address=f"203.0.113.{n}").status_code == 200
    not_utf8 = Client().post("/login/", b"username=%ff%fe%00&password=x",
                             content_type="application/x-www-form-urlencoded",
                             REMOTE_ADDR="203.0.113.8")
    assert not_utf8.status_code == 200
    assert sign_in("x" * 150, "wrong", address="203.0.113.9").status_code == 200  # the first 150 characters
    # Counted: the 100,000 x's and the 150 x's are one account (its first 150 characters), each other name its own.
    store = signin.counters()
    assert store.hit(signin._key("account", "x" * 150), 60)[0] == 3
    assert store.hit(signin._key("account", "ä" * 150), 60)[0] == 2
    assert store.hit(signin._key("address", "203.0.113.8"), 60)[0] == 2


def test_a_sign_in_leaves_a_signed_device_cookie_for_that_account_only(alice: Person, bob: Person) -> None:
    client = Client()
    assert sign_in("alice", "password", client=client).status_code == 302
    cookie = client.cookies[signin.DEVICE_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert int(cookie["max-age"]) == signin.DEVICE_COOKIE_MAX_AGE
    request = RequestFactory().post("/login/")
    request.COOKIES[signin.DEVICE_COOKIE] = cookie.value
    assert signin.device_for(request, " ALICE ") is not None  # the account key: case-folded, trimmed
    assert signin.device_for(request, "bob") is None
    request.COOKIES[signin.DEVICE_COOKIE] = cookie.value[:-2] + ("AA" if not cookie.value.endswith("AA") else "BB")
    assert signin.device_for(request, "alice") is None
    failed = Client()
    assert sign_in("alice", "wrong", client=failed).status_code == 200
    assert signin.DEVICE_COOKIE not in failed.cookies  # only a sign-in earns one


def test_a_recognised_browser_is_refused_past_its_own_failures(alice: Person) -> None:
    laptop = Client()
    sign_in("alice", "password", client=laptop)
    laptop.post("/logout/")
    for _ in range(LIMIT_PER_PAIR):
        assert sign_in("alice", "wrong", client=laptop).status_code == 200
    refused = sign_in("alice", "password", client=laptop)
    assert refused.status_code == 429
    assert "from this browser" in refused.content.decode()
    # Counted on its own: the address and the account at it are untouched.
    assert sign_in("alice", "password", address="198.51.100.7").status_code == 302


def test_the_in_process_counters_stay_bounded() -> None:
    counters = signin.MemoryCounters(max_keys=100)
    for n in range(1000):
        counters.hit(f"k{n}", 60)
    assert len(counters.entries) <= 100
    assert counters.hit("k999", 60)[0] == 2  # recent keys are kept


# --- Shared through Redis ------------------------------------------------------------------------------------


@pytest.fixture
def redis_url(settings: Any) -> Iterator[str]:
    """The real Redis of this machine (CI starts one), database 6 unless MODELPORT_TEST_REDIS_URL says otherwise.
    Only the keys of this test are removed afterwards."""
    import redis

    url = os.environ.get("MODELPORT_TEST_REDIS_URL", "redis://127.0.0.1:6379/6")
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {url}: {exc}")
    before = set(client.keys(f"{signin.KEY_PREFIX}*"))
    settings.REDIS_URL = url
    yield url
    created = set(client.keys(f"{signin.KEY_PREFIX}*")) - before
    if created:
        client.delete(*created)


def test_two_processes_share_their_counts_through_redis(redis_url: str) -> None:
    first, second = signin.RedisCounters(redis_url), signin.RedisCounters(redis_url)
    key = signin.KEY_PREFIX + "test:" + uuid.uuid4().hex
    assert first.hit(key, 60)[0] == 1
    assert second.hit(key, 60)[0] == 2
    count, ttl = first.hit(key, 60)
    assert count == 3 and 0 < ttl <= 60
    second.take_back(key)
    assert first.hit(key, 60)[0] == 3
    first.forget(key)
    second.take_back(key)  # an expired or cleared window stays cleared, never negative
    assert second.hit(key, 60)[0] == 1


def test_the_sign_in_pages_count_in_redis(alice: Person, redis_url: str) -> None:
    address = f"192.0.2.{uuid.uuid4().int % 250}"
    for _ in range(LIMIT_PER_PAIR):
        sign_in("alice", "wrong", address=address)
    signin.reset_counters()  # as another web process would start: nothing in its memory
    assert isinstance(signin.counters(), signin.RedisCounters)
    refused = sign_in("alice", "password", address=address)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0


def test_an_unreachable_redis_lets_people_sign_in(alice: Person, settings: Any) -> None:
    """Fails open, and says so in the log: a counter outage must not lock everybody out."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    assert sign_in("alice", "password").status_code == 302
