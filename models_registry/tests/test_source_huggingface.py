"""Hugging Face imports (issue 35): the fetcher against a local hub-compatible endpoint (tests/support/hf_hub_server.py,
a thread speaking what huggingface_hub 2.4.0 calls), with a FetchContext whose progress reserves a small quota."""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from models_registry.models import TeamSources
from models_registry.sources import fetcher_for
from models_registry.sources.base import FetchContext, SourceForbidden, SourceRefused, TransientFetchError
from models_registry.sources.huggingface import fetcher
from tests.support.hf_hub_server import (
    ONNX_COMMIT,
    PYTHON_COMMIT,
    PYTHON_SIGNATURE,
    HubRepo,
    HubServer,
    running_hub,
    standard_repos,
    tiny_onnx,
)
from tests.support.people import Person

OPERATOR_TOKEN = "hf_operator_token"


@pytest.fixture
def hf_hub() -> Iterator[HubServer]:
    """The local hub with the standard repos, HF_ENDPOINT and HF_TOKEN pointing at it (the token the gated repo
    takes). Tests add repos to `hf_hub.repos`."""
    with running_hub(standard_repos(gated_token=OPERATOR_TOKEN)) as hub, \
            override_settings(HF_ENDPOINT=hub.url, HF_TOKEN=OPERATOR_TOKEN, IMPORT_HUGGINGFACE_REPOS="acme/*"):
        yield hub


@dataclass
class Quota:
    """What the worker's progress does, reduced to its contract: the first total reserves the quota (refused when
    larger), later calls record bytes, never past the total."""

    limit: int
    calls: list[tuple[int, int | None]] = field(default_factory=list)

    def __call__(self, done: int, total: int | None) -> None:
        self.calls.append((done, total))
        if total is not None and total > self.limit:
            raise SourceRefused(f"The import needs {total} bytes; the team has {self.limit} left.")
        assert total is None or done <= total


def context(person: Person, workdir: Path, *, limit: int = 10 * 1024 * 1024) -> tuple[FetchContext, Quota]:
    quota = Quota(limit)
    ctx = FetchContext(team_id=person.team.id, team_name=person.team.name, workdir=workdir, max_bytes=limit,
                       progress=quota, deadline=time.monotonic() + 60)
    return ctx, quota


def validated(person: Person, **source: Any) -> dict[str, Any]:
    """The source's fields as the import backbone passes them (without "kind"), validated."""
    return fetcher.validate(source, person.team.id)


def test_the_kind_is_registered() -> None:
    assert fetcher_for("huggingface") is fetcher


# --- validate ---------------------------------------------------------------------------------------------------

@override_settings(IMPORT_HUGGINGFACE_REPOS="acme/*")
def test_validate_gives_the_canonical_source_with_main_by_default(alice: Person) -> None:
    assert validated(alice, repo="acme/tiny-onnx") == {"repo": "acme/tiny-onnx", "revision": "main"}
    assert validated(alice, repo="acme/tiny-onnx", revision="v1", files=["./onnx/model.onnx", "onnx/model.onnx"]) \
        == {"repo": "acme/tiny-onnx", "revision": "v1", "files": ["onnx/model.onnx"]}


@override_settings(IMPORT_HUGGINGFACE_REPOS="acme/*")
@pytest.mark.parametrize("source, words", [
    ({"repo": "tiny-onnx"}, "<org>/<name>"),
    ({"repo": "acme/../etc"}, "<org>/<name>"),
    ({"repo": "acme/..etc"}, "repository id"),
    ({"repo": "acme/a b"}, "repository id"),
    ({"repo": 3}, "<org>/<name>"),
    ({"repo": "acme/tiny", "revision": "../main"}, "source.revision"),
    ({"repo": "acme/tiny", "revision": "a b"}, "source.revision"),
    ({"repo": "acme/tiny", "files": ["../../etc/passwd"]}, "archive rules"),
    ({"repo": "acme/tiny", "files": ["/etc/passwd"]}, "archive rules"),
    ({"repo": "acme/tiny", "files": []}, "non-empty list"),
    ({"repo": "acme/tiny", "files": [f"f{i}.json" for i in range(201)]}, "at most 200"),
    ({"repo": "acme/tiny", "token": "hf_mine"}, "leave out ['token']"),
])
def test_validate_refuses_a_malformed_source_saying_what_to_fix(alice: Person, source: dict[str, Any],
                                                                  words: str) -> None:
    with pytest.raises(SourceRefused) as caught:
        validated(alice, **source)
    assert not isinstance(caught.value, SourceForbidden)
    assert words in str(caught.value)


@override_settings(IMPORT_HUGGINGFACE_REPOS="acme/*")
def test_validate_forbids_a_repo_outside_the_teams_patterns(alice: Person) -> None:
    with pytest.raises(SourceForbidden, match="Team sources.*IMPORT_HUGGINGFACE_REPOS"):
        validated(alice, repo="globex/secret")
    TeamSources.objects.create(team=alice.team, huggingface_repos="globex/*")
    assert validated(alice, repo="globex/secret")["repo"] == "globex/secret"
    with pytest.raises(SourceForbidden):
        validated(alice, repo="acme/tiny-onnx")  # the row replaces the default


def test_identity_names_repo_commit_and_files_and_a_branch_or_tag_has_none() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert fetcher.identity({"repo": "acme/x", "revision": commit, "files": ["b", "a"]}) \
        == f"huggingface:acme/x@{commit}:a,b"
    # A branch or a tag names another commit after a push: a moving reference, never the same import twice.
    for revision in ("main", "v1", "refs/pr/1", commit[:12]):
        assert fetcher.identity({"repo": "acme/x", "revision": revision}) is None


# --- fetch: what becomes a version ------------------------------------------------------------------------------

def test_it_imports_an_onnx_export_at_the_commit_its_tag_names(alice: Person, hf_hub: HubServer,
                                                                tmp_path: Path) -> None:
    ctx, quota = context(alice, tmp_path)
    fetched = fetcher.fetch(validated(alice, repo="acme/tiny-onnx", revision="v1"), ctx)
    onnx_bytes = tiny_onnx()
    assert fetched.path.read_bytes() == onnx_bytes
    assert fetched.path.is_relative_to(tmp_path)
    assert (fetched.filename, fetched.declared_format) == ("model.onnx", "onnx")
    assert fetched.record == {"repo": "acme/tiny-onnx", "revision": "v1", "commit": ONNX_COMMIT,
                              "files": {"model.onnx": hashlib.sha256(onnx_bytes).hexdigest()}}
    assert quota.calls[0] == (0, len(onnx_bytes))
    assert quota.calls[-1] == (len(onnx_bytes), len(onnx_bytes))
    # The bytes are fetched at the commit, never at the tag (which could move between the listing and the file).
    assert "GET /api/models/acme/tiny-onnx/revision/v1?blobs=true" in hf_hub.paths()
    assert f"GET /acme/tiny-onnx/resolve/{ONNX_COMMIT}/model.onnx" in hf_hub.paths()
    assert not any("README" in path for path in hf_hub.paths())
    # Asked uncompressed: a gzip body would be inflated in memory before the size check sees it.
    assert {item.headers.get("accept-encoding") for item in hf_hub.received if "/api/" not in item.path} \
        == {"identity"}


def test_it_imports_model_py_with_safetensors_as_a_python_model_tar(alice: Person, hf_hub: HubServer,
                                                                     tmp_path: Path) -> None:
    ctx, quota = context(alice, tmp_path)
    fetched = fetcher.fetch(validated(alice, repo="acme/tiny-python"), ctx)
    assert (fetched.filename, fetched.declared_format) == ("model.tar", "python")
    with tarfile.open(fetched.path) as tar:
        names = sorted(tar.getnames())
    # The model's code, weights and configs at the top, as the python format lays them out; no pickled weights.
    assert names == ["config.json", "model.py", "model.safetensors", "signature.json"]
    assert fetched.signature is not None
    assert [t.name for t in fetched.signature.inputs] == [t["name"] for t in PYTHON_SIGNATURE["inputs"]]
    assert fetched.record["commit"] == PYTHON_COMMIT
    assert sorted(fetched.record["files"]) == names
    repo = hf_hub.repos["acme/tiny-python"]
    assert quota.calls[0] == (0, sum(len(repo.files[name]) for name in names))


def test_it_reads_the_tree_listing_from_a_mirror_whose_model_info_has_no_sizes(alice: Person, hf_hub: HubServer,
                                                                               tmp_path: Path) -> None:
    hf_hub.repos["acme/mirrored"] = HubRepo(commit="d" * 40, files={"model.onnx": tiny_onnx(), "README.md": b"#"},
                                            lfs=frozenset({"model.onnx"}), metadata_in_info=False)
    ctx, quota = context(alice, tmp_path)
    fetched = fetcher.fetch(validated(alice, repo="acme/mirrored"), ctx)
    assert fetched.path.read_bytes() == tiny_onnx()
    assert quota.calls[0] == (0, len(tiny_onnx()))
    assert any(path.startswith(f"GET /api/models/acme/mirrored/tree/{'d' * 40}") for path in hf_hub.paths())


def test_it_imports_the_files_named(alice: Person, hf_hub: HubServer, tmp_path: Path) -> None:
    hf_hub.repos["acme/two-exports"] = HubRepo(commit="5" * 40, files={
        "onnx/model_fp16.onnx": tiny_onnx(), "onnx/model_quantized.onnx": tiny_onnx()})
    ctx, _ = context(alice, tmp_path)
    with pytest.raises(SourceRefused, match="name the one"):
        fetcher.fetch(validated(alice, repo="acme/two-exports"), ctx)
    fetched = fetcher.fetch(validated(alice, repo="acme/two-exports", files=["onnx/model_quantized.onnx"]),
                            context(alice, tmp_path / "2")[0])
    assert fetched.filename == "model_quantized.onnx"
    assert fetched.record["files"] == {"onnx/model_quantized.onnx": hashlib.sha256(tiny_onnx()).hexdigest()}


def test_a_python_model_takes_only_the_files_named_at_a_pinned_commit(alice: Person, hf_hub: HubServer,
                                                                        tmp_path: Path) -> None:
    fetched = fetcher.fetch(validated(alice, repo="acme/tiny-python", revision=PYTHON_COMMIT,
                                      files=["model.py", "model.safetensors", "signature.json"]),
                            context(alice, tmp_path)[0])
    with tarfile.open(fetched.path) as tar:
        assert sorted(tar.getnames()) == ["model.py", "model.safetensors", "signature.json"]
    assert fetched.record["revision"] == fetched.record["commit"] == PYTHON_COMMIT


def test_it_refuses_safetensors_without_a_model_py_naming_what_is_needed(alice: Person, hf_hub: HubServer,
                                                                         tmp_path: Path) -> None:
    ctx, quota = context(alice, tmp_path)
    with pytest.raises(SourceRefused, match="safetensors weights but no model.py.*TritonPythonModel"):
        fetcher.fetch(validated(alice, repo="acme/weights-only"), ctx)
    assert quota.calls == []
    assert not any("/resolve/" in path for path in hf_hub.paths())


def test_it_refuses_a_missing_revision_file_or_repo(alice: Person, hf_hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(SourceRefused, match="404"):
        fetcher.fetch(validated(alice, repo="acme/tiny-onnx", revision="v9"), context(alice, tmp_path / "a")[0])
    with pytest.raises(SourceRefused, match="has no 'weights.onnx'"):
        fetcher.fetch(validated(alice, repo="acme/tiny-onnx", files=["weights.onnx"]),
                      context(alice, tmp_path / "b")[0])
    with pytest.raises(SourceRefused, match="private or gated"):
        fetcher.fetch(validated(alice, repo="acme/nothing-here"), context(alice, tmp_path / "c")[0])


def test_a_hub_answering_5xx_or_unreachable_is_transient(alice: Person, hf_hub: HubServer, tmp_path: Path) -> None:
    hf_hub.repos["acme/down"] = HubRepo(commit="6" * 40, files={}, status=503)
    with pytest.raises(TransientFetchError, match="503"):
        fetcher.fetch(validated(alice, repo="acme/down"), context(alice, tmp_path / "a")[0])
    with override_settings(HF_ENDPOINT="http://127.0.0.1:9"), pytest.raises(TransientFetchError,
                                                                           match="could not be reached"):
        fetcher.fetch(validated(alice, repo="acme/tiny-onnx"), context(alice, tmp_path / "b")[0])


# --- fetch: the token -------------------------------------------------------------------------------------------

def test_the_token_is_not_sent_for_a_team_the_operator_has_not_allowed(alice: Person, hf_hub: HubServer,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Not from the worker's environment either: huggingface_hub would read HF_TOKEN unless told token=False.
    monkeypatch.setenv("HF_TOKEN", OPERATOR_TOKEN)
    with pytest.raises(SourceRefused, match="needs a token the operator has not allowed for team 'acme'"):
        fetcher.fetch(validated(alice, repo="acme/gated-onnx"), context(alice, tmp_path / "a")[0])
    fetcher.fetch(validated(alice, repo="acme/tiny-onnx"), context(alice, tmp_path / "b")[0])
    assert hf_hub.received
    assert set(hf_hub.authorizations()) == {""}


def test_the_token_is_sent_where_allowed_and_only_to_the_hub(alice: Person, hf_hub: HubServer,
                                                               tmp_path: Path) -> None:
    TeamSources.objects.create(team=alice.team, huggingface_repos="acme/*", huggingface_token=True)
    fetched = fetcher.fetch(validated(alice, repo="acme/gated-onnx"), context(alice, tmp_path)[0])
    assert fetched.path.read_bytes() == tiny_onnx()
    sent = {f"{item.method} {item.path.split('/')[1]}": item.headers.get("authorization", "")
            for item in hf_hub.received}
    assert sent["GET api"] == f"Bearer {OPERATOR_TOKEN}"
    assert sent["GET acme"] == f"Bearer {OPERATOR_TOKEN}"
    assert sent["GET cdn"] == ""  # the redirect to the CDN's host goes without it
    assert OPERATOR_TOKEN not in json.dumps(fetched.record)


def test_a_wrong_operator_token_is_refused_saying_so(alice: Person, hf_hub: HubServer, tmp_path: Path) -> None:
    TeamSources.objects.create(team=alice.team, huggingface_repos="acme/*", huggingface_token=True)
    with override_settings(HF_TOKEN="hf_wrong"), pytest.raises(SourceRefused, match="with the operator's token"):
        fetcher.fetch(validated(alice, repo="acme/gated-onnx"), context(alice, tmp_path)[0])


# --- fetch: a hostile hub ---------------------------------------------------------------------------------------

def test_a_listing_that_climbs_out_is_refused_before_any_download(alice: Person, hf_hub: HubServer,
                                                                   tmp_path: Path) -> None:
    hf_hub.repos["acme/climb"] = HubRepo(commit="7" * 40, files={"model.onnx": tiny_onnx()},
                                         names_listed=("../../etc/passwd",))
    ctx, quota = context(alice, tmp_path)
    with pytest.raises(SourceRefused, match="archive rules"):
        fetcher.fetch(validated(alice, repo="acme/climb"), ctx)
    assert quota.calls == []
    assert not any("/resolve/" in path for path in hf_hub.paths())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lfs", [True, False])
def test_a_file_larger_than_listed_is_cut_and_refused(alice: Person, hf_hub: HubServer, tmp_path: Path,
                                                      lfs: bool) -> None:
    big = tiny_onnx() + b"\0" * (3 * 1024 * 1024)
    hf_hub.repos["acme/liar"] = HubRepo(commit="8" * 40, files={"model.onnx": big}, lies={"model.onnx": 100},
                                        lfs=frozenset({"model.onnx"}) if lfs else frozenset())
    ctx, quota = context(alice, tmp_path)
    with pytest.raises(SourceRefused, match="larger than the 100 bytes the hub listed"):
        fetcher.fetch(validated(alice, repo="acme/liar"), ctx)
    assert quota.calls[0] == (0, 100)
    written = [path.stat().st_size for path in tmp_path.rglob("*") if path.is_file()]
    assert max(written, default=0) <= 100


class Tampered(dict[str, bytes]):
    """Files listed (`.get`, as the listing reads them) with one content and served (`[]`) with another of the
    same size: a mirror whose listing and bytes disagree."""

    def __getitem__(self, key: str) -> bytes:
        original = super().__getitem__(key)
        return bytes([original[0] ^ 1]) + original[1:]


@pytest.mark.parametrize("lfs, words", [(True, "etag of model.onnx .* is not the sha256"), (False, "git blob id")])
def test_a_file_whose_bytes_are_not_the_listed_ones_is_refused(alice: Person, hf_hub: HubServer, tmp_path: Path,
                                                               lfs: bool, words: str) -> None:
    hf_hub.repos["acme/swapped"] = HubRepo(commit="9" * 40, files=Tampered({"model.onnx": tiny_onnx()}),
                                           lfs=frozenset({"model.onnx"}) if lfs else frozenset())
    with pytest.raises(SourceRefused, match=words):
        fetcher.fetch(validated(alice, repo="acme/swapped"), context(alice, tmp_path)[0])


def test_an_lfs_file_whose_cdn_bytes_differ_from_the_listed_sha256_is_refused(alice: Person, hf_hub: HubServer,
                                                                              tmp_path: Path) -> None:
    # The hub's headers agree with its listing; only the bytes from the CDN differ.
    hf_hub.repos["acme/cdn-swap"] = HubRepo(commit="b" * 40, files={"model.onnx": tiny_onnx()},
                                            lfs=frozenset({"model.onnx"}))
    hf_hub.cdn_override = {hashlib.sha256(tiny_onnx()).hexdigest(): b"\1" + tiny_onnx()[1:]}
    with pytest.raises(SourceRefused, match="does not have the sha256 the hub listed"):
        fetcher.fetch(validated(alice, repo="acme/cdn-swap"), context(alice, tmp_path)[0])


def test_a_repo_larger_than_the_quota_is_refused_before_any_download(alice: Person, hf_hub: HubServer,
                                                                     tmp_path: Path) -> None:
    ctx, quota = context(alice, tmp_path, limit=50)
    with pytest.raises(SourceRefused, match="the team has 50 left"):
        fetcher.fetch(validated(alice, repo="acme/tiny-python"), ctx)
    assert len(quota.calls) == 1
    assert not any("/resolve/" in path or "/cdn/" in path for path in hf_hub.paths())


def test_progress_is_reported_at_least_every_mib(alice: Person, hf_hub: HubServer, tmp_path: Path) -> None:
    big = tiny_onnx() + b"\0" * (5 * 1024 * 1024 + 17)
    hf_hub.repos["acme/big"] = HubRepo(commit="a" * 40, files={"model.onnx": big}, lfs=frozenset({"model.onnx"}))
    ctx, quota = context(alice, tmp_path)
    fetcher.fetch(validated(alice, repo="acme/big"), ctx)
    done = [d for d, _ in quota.calls]
    assert done[0] == 0 and done[-1] == len(big)
    assert all(later - earlier <= 1024 * 1024 for earlier, later in zip(done, done[1:], strict=False))


def test_a_repo_the_operator_narrowed_since_the_api_accepted_it_is_forbidden(alice: Person, hf_hub: HubServer,
                                                                              tmp_path: Path) -> None:
    source = validated(alice, repo="acme/tiny-onnx")
    TeamSources.objects.create(team=alice.team, huggingface_repos="acme/other-*")
    with pytest.raises(SourceForbidden):
        fetcher.fetch(source, context(alice, tmp_path)[0])
    assert hf_hub.received == []
