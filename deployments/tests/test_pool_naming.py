"""A revision's model names in a pool (deployments/pool_names.py): made, recognised and taken off in one place."""

from __future__ import annotations

from deployments import pool_names


def test_a_revisions_names_are_unique_to_deployment_and_revision_and_come_off_again() -> None:
    assert pool_names.name_prefix(12, 3) == "d12-r3-"
    assert pool_names.loaded_name(12, 3, "digits") == "d12-r3-digits"
    assert pool_names.revision_key(12, 3) == "d12-r3"
    assert pool_names.own_name("d12-r3-digits", "d12-r3-") == "digits"
    assert pool_names.own_name("d12-r4-digits", "d12-r3-") == "d12-r4-digits"  # another revision's: left alone
    assert pool_names.without_names("model 'd12-r3-digits' failed: d12-r3-pipe", "d12-r3-") == (
        "model 'digits' failed: pipe")


def test_any_revision_of_a_deployment_and_no_other_deployment_is_recognised() -> None:
    pattern = pool_names.any_revision(7)
    assert pattern.match(b"d7-r1-digits") and pattern.match(b"d7-r12-digits")
    assert not pattern.match(b"d70-r1-digits") and not pattern.match(b"d17-r1-digits")
    files = pool_names.files_of(7, 2)
    assert files.match("d7-r2-digits-") and not files.match("d7-r22-digits-") and not files.match("d77-r2-x-")
    assert pool_names.files_of(7).match("d7-r22-") and not pool_names.files_of(7).match("d70-r1-")


def test_a_log_line_names_the_deployments_whose_names_it_holds_never_a_longer_name() -> None:
    assert pool_names.deployments_named("I1202 model_lifecycle.cc] loaded 'd4-r1-digits' and d9-r2") == {4, 9}
    assert pool_names.deployments_named("xd4-r1-digits d4-r1234567890") == set()
    mine = pool_names.names_in("d4-r1-")
    assert mine.search("loading 'd4-r1-digits'") and not mine.search("loading 'xd4-r1-digits'")


def test_a_pool_names_revision_prefix_is_found_only_at_its_start() -> None:
    assert pool_names.prefix_of(pool_names.loaded_name(12, 3, "digits")) == "d12-r3-"
    assert pool_names.prefix_of("d12-r3-d9-r1-digits") == "d12-r3-"  # a model's own name that looks like one
    assert pool_names.prefix_of("digits") is None
    assert pool_names.prefix_of("xd12-r3-digits") is None
    assert pool_names.prefix_of("d12-r3digits") is None
