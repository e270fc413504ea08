"""Issue 30: a guesser must not lock a person out of the portal. Under the shipped limits (portal/settings.py, left
as they are here: 5 per account at one address, 30 per address, 50 per account from browsers that never signed in
to it, 15 minutes), failed sign-ins lock out the guesser's address and the account *at that address*; the person
signs in from their own address, and from a browser of theirs even while a guesser spread over many addresses has
spent the account's budget."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from accounts import signin
from tests.support.people import Person

ATTACKER = "203.0.113.66"
VICTIM = "198.51.100.20"


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    signin.reset_counters()  # the in-process table of an earlier test counts nothing here


@pytest.fixture
def staff_alice(alice: Person) -> Person:
    alice.user.is_staff = True
    alice.user.is_superuser = True
    alice.user.save()
    return alice


def post(username: str, password: str, address: str, path: str = "/login/", client: Client | None = None,
         **extra: str) -> Any:
    return (client or Client()).post(path, {"username": username, "password": password}, REMOTE_ADDR=address,
                                     **extra)


def test_the_shipped_limits_are_the_documented_ones(settings: Any) -> None:
    assert settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS == 5
    assert settings.SIGN_IN_MAX_FAILURES_PER_ADDRESS == 30
    assert settings.SIGN_IN_MAX_FAILURES_PER_ACCOUNT == 50
    assert settings.SIGN_IN_LOCKOUT_SECONDS == 900


def test_a_guesser_at_one_address_does_not_lock_the_user_out_from_theirs(staff_alice: Person) -> None:
    for _ in range(5):
        assert post("alice", "wrong", ATTACKER).status_code == 200
    # The guesser goes on while the person signs in, on both sign-in pages, from their own address.
    for path in ("/login/", "/admin/login/"):
        assert post("alice", "wrong", ATTACKER, path=path).status_code == 429
        client = Client()
        assert post("alice", "password", VICTIM, path=path, client=client).status_code == 302
        assert client.session["_auth_user_id"] == str(staff_alice.user.pk)
    # The guesser's address is locked out of the account, even with the right password, and told until when.
    for path in ("/login/", "/admin/login/"):
        client = Client()
        refused = post("alice", "password", ATTACKER, path=path, client=client)
        assert refused.status_code == 429
        assert "_auth_user_id" not in client.session
        assert 840 <= int(refused["Retry-After"]) <= 900
        page = refused.content.decode()
        assert "Too many failed sign-ins for this account from your network address" in page
        assert "Try again in 15 minutes" in page


def test_a_locked_pair_leaves_the_address_to_other_accounts(alice: Person, bob: Person) -> None:
    """The pair rule: five failures for alice at X lock (alice, X); bob at X, alice elsewhere, are untouched."""
    for _ in range(5):
        post("alice", "wrong", ATTACKER)
    assert post("alice", "password", ATTACKER).status_code == 429
    assert post("bob", "password", ATTACKER).status_code == 302
    assert post("alice", "password", VICTIM).status_code == 302
    # The address rule: 30 attempts from one address, whatever the usernames, lock the address for everyone.
    for n in range(30 - 6):  # the address has counted 6 (a sign-in takes its attempt back)
        post(f"guess{n}", "wrong", ATTACKER)
    refused = post("bob", "password", ATTACKER)
    assert refused.status_code == 429
    assert "from your network address. Try again in" in refused.content.decode()
    assert post("bob", "password", VICTIM).status_code == 302


def test_a_distributed_guesser_is_bounded_and_the_users_own_browser_still_signs_in(alice: Person) -> None:
    # Alice has signed in from her laptop before: it holds a device cookie for her account.
    laptop = Client()
    assert post("alice", "password", "192.0.2.200", client=laptop).status_code == 302
    assert signin.DEVICE_COOKIE in laptop.cookies
    laptop.post("/logout/")
    assert "_auth_user_id" not in laptop.session

    # 40 addresses, 5 guesses each: only 50 passwords are checked in the window, whatever the number of addresses.
    checked = 0
    for n in range(40):
        for _ in range(5):
            response = post("alice", "wrong", f"10.{n}.0.1")
            assert response.status_code in (200, 429)
            checked += response.status_code == 200
    assert checked == 50

    # A browser that never signed in to alice, at a fresh address, waits out the window (the documented price);
    refused = post("alice", "password", "192.0.2.201")
    assert refused.status_code == 429
    assert "Sign in from a browser you have signed in with before" in refused.content.decode()
    # her laptop signs in, from yet another address, and from the guessers' own addresses too.
    for address in ("192.0.2.202", "10.0.0.1"):
        assert post("alice", "password", address, client=laptop).status_code == 302
        laptop.post("/logout/")


def test_a_device_cookie_of_another_account_or_made_up_buys_nothing(alice: Person, bob: Person) -> None:
    """The guesser signs in to their own account (bob) for a cookie, or forges one: neither counts as alice's."""
    mallory = Client()
    assert post("bob", "password", ATTACKER, client=mallory).status_code == 302
    mallory.post("/logout/")
    forged = Client()
    forged.cookies[signin.DEVICE_COOKIE] = '{"account": "alice", "device": "x"}'
    for client in (mallory, forged):
        statuses = [post("alice", "wrong", ATTACKER, client=client).status_code for _ in range(6)]
        assert statuses == [200] * 5 + [429]
        signin.reset_counters()


def test_a_forwarded_for_header_cannot_pick_the_victims_address(alice: Person, settings: Any) -> None:
    """Without a trusted proxy the header is ignored; behind one, only the entry that proxy added counts."""
    for _ in range(10):
        post("alice", "wrong", ATTACKER, HTTP_X_FORWARDED_FOR=VICTIM)
    assert post("alice", "password", VICTIM).status_code == 302
    assert post("alice", "password", ATTACKER, HTTP_X_FORWARDED_FOR=VICTIM).status_code == 429

    signin.reset_counters()
    settings.NUM_PROXIES = 1
    proxy = "10.0.0.2"
    for _ in range(10):  # the guesser writes the victim's address first; the proxy appends the guesser's
        post("alice", "wrong", proxy, HTTP_X_FORWARDED_FOR=f"{VICTIM}, {ATTACKER}")
    assert post("alice", "password", proxy, HTTP_X_FORWARDED_FOR=VICTIM).status_code == 302
    assert post("alice", "password", proxy, HTTP_X_FORWARDED_FOR=f"{VICTIM}, {ATTACKER}").status_code == 429


def test_ipv4_clients_of_a_dual_stack_socket_are_told_apart(alice: Person) -> None:
    """On a socket bound to :: an IPv4 client's address is ::ffff:a.b.c.d; counted by its IPv6 /64, every IPv4
    client shared one address (::/64), and one guesser locked them all out of alice and, past 30, of the portal."""
    for n in range(31):
        post("alice" if n < 6 else f"guess{n}", "wrong", f"::ffff:{ATTACKER}")
    assert post("alice", "password", f"::ffff:{ATTACKER}").status_code == 429
    assert post("alice", "password", f"::ffff:{VICTIM}").status_code == 302
    assert post("alice", "password", "fe80::1%eth0").status_code == 302  # a link-local zone is no 500
