"""Hugging Face imports (issue 35): `{"kind": "huggingface", "repo": "<org>/<name>", "revision": "<commit, tag or
branch>", "files": [...]}` from HF_ENDPOINT (the hub, or the operator's mirror).

What the hub is asked, through huggingface_hub with `endpoint=settings.HF_ENDPOINT` passed on every call (never the
HF_ENDPOINT the library read from the environment when it was imported):
- `HfApi.model_info(repo, revision, files_metadata=True)` (GET /api/models/{repo}/revision/{rev}?blobs=True): the
  commit the revision names now (recorded, and every file is then fetched at that commit, since a tag or a branch
  can move between two requests), and every file with its size, git blob id and, for LFS files, its sha256; from a
  mirror whose model_info leaves those out, the tree listing of that commit (HfApi.list_repo_tree, GET
  /api/models/{repo}/tree/{commit}?recursive=True) instead;
- each chosen file at /{repo}/resolve/{commit}/{file} (hf_hub_url), following the hub's redirect to its CDN.

Why the bytes are not fetched with hf_hub_download: it writes into a cache of symlinks and lock files, checks the
size only once the whole body is on disk (a hub or mirror that sends more than it listed would fill the disk
first), reports progress only to a tqdm bar, and reads the token from the environment or ~/.cache/huggingface
unless told not to on every call. Here each body is streamed through the hub's own HTTP session, headers
(build_hf_headers: its user agent, the token only when allowed) and URLs, cut the moment it passes the size the
listing gave, reported to `ctx.progress` after every MiB, and checked against the listing's sha256 (LFS) or git
blob id (other files): a mismatch is refused.

The token: settings.HF_TOKEN is sent only when the operator allowed it for the team (Team sources); otherwise
every call passes token=False, which huggingface_hub honours before looking at HF_TOKEN, HF_TOKEN_PATH or a
token saved by `hf auth login`. httpx drops the Authorization header on the redirect to another host.

What becomes a version (the same inspection and sandbox as an upload follow):
- an ONNX export: the one .onnx (model.onnx or onnx/model.onnx when there are several; `files` chooses otherwise);
- safetensors weights with a model.py (a Triton python-backend model that loads them with `safetensors`): a python
  model .tar holding model.py at its top with the repo's files under it, as the python format lays them out;
- safetensors without a model.py: refused, naming what Modelport needs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import httpx2
from django.conf import settings
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.hf_api import RepoFile as HubRepoFile
from huggingface_hub.utils import build_hf_headers, get_session, validate_repo_id

from modelport.core.signature import Signature, SignatureError, parse_signature
from models_registry.sources import allowed
from models_registry.sources.base import (
    CHUNK,
    PIN_TIMEOUT_SECONDS,
    FetchContext,
    Fetched,
    SourceForbidden,
    SourceRefused,
    TransientFetchError,
    pack_tree,
    target_path,
)

KIND = "huggingface"
_T = TypeVar("_T")
MAX_FILES = 200  # in `files`, and in what a python model takes from a repo
_MAX_LISTED = 20_000  # files in one repo's listing; more is not a model repository
_NAME_MAX = 500
_REVISION = re.compile(r"^[A-Za-z0-9._/\-]{1,200}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SIGNATURE_MAX_BYTES = 1024 * 1024
# What a python model takes from a repo when `files` is not given: its code, safetensors weights, configs and
# tokenizer files. Other weight formats (pickled .bin/.pt, .h5, .msgpack, .gguf) are never needed by a model.py
# that loads safetensors, and are often as large as the weights themselves.
_PYTHON_SUFFIXES = (".py", ".safetensors", ".json", ".txt", ".model", ".jinja")
_SIGNATURE_FILE = "signature.json"


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int
    sha256: str  # "" for a file not in LFS
    blob_id: str  # git's sha1 of the blob, "" when the listing has none


def _refuse_fields(source: dict[str, Any]) -> None:
    unknown = sorted(str(key) for key in source if key not in ("kind", "repo", "revision", "files"))
    if unknown:
        raise SourceRefused(f"A huggingface source has kind, repo, revision and files; leave out {unknown[:5]}.")


def parse_repo(repo: object) -> str:
    """An "org/name" repository id by the hub's rules (huggingface_hub.utils.validate_repo_id), with its org."""
    if not isinstance(repo, str) or repo.count("/") != 1:
        raise SourceRefused(f"source.repo must be a Hugging Face repository as <org>/<name>, e.g. "
                            f"onnx-community/mobilenet; got {str(repo)[:200]!r}.")
    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise SourceRefused(f"source.repo is not a Hugging Face repository id: {str(exc)[:300]}") from None
    return repo


def parse_revision(revision: object) -> str:
    """A commit sha, a tag or a branch (refs/pr/1 included): git's ref name rules, kept to plain characters."""
    if revision is None:
        return "main"
    if (not isinstance(revision, str) or not _REVISION.match(revision) or ".." in revision or "//" in revision
            or revision.startswith(("/", ".", "-")) or revision.endswith(("/", ".", ".lock"))):
        raise SourceRefused(f"source.revision must be a commit sha, a tag or a branch of the repository (letters, "
                            f"digits, '.', '_', '-', '/'; no '..'), e.g. main or v1.0; got {str(revision)[:200]!r}.")
    return revision


def parse_files(files: object) -> list[str] | None:
    """The relative names asked for, in the archive rules' form; None: let the fetcher choose."""
    if files is None:
        return None
    if not isinstance(files, list) or not files or not all(isinstance(name, str) for name in files):
        raise SourceRefused("source.files must be a non-empty list of file names in the repository, e.g. "
                            "[\"model.onnx\"], or be left out to import the repository's model.")
    if len(files) > MAX_FILES:
        raise SourceRefused(f"source.files names {len(files)} files; at most {MAX_FILES}.")
    names: list[str] = []
    probe = Path("/nonexistent-root")
    for name in files:
        if len(name) > _NAME_MAX:
            raise SourceRefused(f"source.files has a name longer than {_NAME_MAX} characters: {name[:80]!r}...")
        canonical = target_path(probe, name).relative_to(probe).as_posix()
        if canonical not in names:
            names.append(canonical)
    return names


class HuggingFaceFetcher:
    kind = KIND

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        _refuse_fields(source)
        repo = parse_repo(source.get("repo"))
        revision = parse_revision(source.get("revision"))
        files = parse_files(source.get("files"))
        if not allowed.matches(allowed.allowed_for(team_id).huggingface_repos, repo):
            raise SourceForbidden(f"Your team may not import from the Hugging Face repository {repo!r}: an operator "
                                  "allows repositories by pattern in the team's Team sources (or "
                                  "IMPORT_HUGGINGFACE_REPOS).")
        # Without "kind": the import backbone (models_registry/imports.py) passes the other fields and adds it back.
        canonical: dict[str, Any] = {"repo": repo, "revision": revision}
        if files is not None:
            canonical["files"] = files
        return canonical

    def identity(self, source: dict[str, Any]) -> str | None:
        # Only a full commit sha names fixed files: a branch moves with each push, and a tag can be moved too.
        if not _COMMIT.match(str(source["revision"])):
            return None
        files = ",".join(sorted(source.get("files") or []))
        return f"huggingface:{source['repo']}@{source['revision']}:{files}"

    def pinned(self, source: dict[str, Any], team_id: int) -> dict[str, Any] | None:
        if _COMMIT.match(str(source["revision"])):
            return None
        hub = _Hub(source["repo"], token_allowed=allowed.allowed_for(team_id).huggingface_token, team="")
        return {**source, "revision": hub.commit_of(source["revision"], PIN_TIMEOUT_SECONDS)}

    def pinned_from(self, source: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
        commit = str(record.get("commit", ""))
        if _COMMIT.match(str(source["revision"])) or not _COMMIT.match(commit):
            return None
        return {**source, "revision": commit}

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        repo = parse_repo(source.get("repo"))
        revision = parse_revision(source.get("revision"))
        asked = parse_files(source.get("files"))
        # Checked again here: the operator may have narrowed the team's patterns since the API accepted it.
        rules = allowed.allowed_for(ctx.team_id)
        if not allowed.matches(rules.huggingface_repos, repo):
            raise SourceForbidden(f"Your team may no longer import from {repo!r} (Team sources / "
                                  "IMPORT_HUGGINGFACE_REPOS).")
        hub = _Hub(repo, token_allowed=rules.huggingface_token, team=ctx.team_name)
        commit, listing = hub.resolve(revision)
        chosen, kind = choose_files(listing, asked, repo)
        total = sum(item.size for item in chosen)
        ctx.progress(0, total)  # reserves the quota: a repo larger than it is refused before any byte

        model_dir = ctx.workdir / "repo"
        model_dir.mkdir(parents=True)
        hashes: dict[str, str] = {}
        done = 0
        for item in chosen:
            destination = target_path(model_dir, item.name)
            hashes[item.name] = hub.download(commit, item, destination, ctx, done, total)
            done += item.size
        record = {"repo": repo, "revision": revision, "commit": commit, "files": hashes}
        if kind == "python":
            signature = _signature_in(model_dir)
            artifact = ctx.workdir / "model.tar"
            pack_tree(model_dir, artifact, max_entries=settings.ARCHIVE_MAX_ENTRIES,
                      max_total_size=settings.ARCHIVE_MAX_TOTAL_SIZE)
            return Fetched(path=artifact, filename="model.tar", declared_format="python", signature=signature,
                           record=record)
        only = chosen[0]
        return Fetched(path=target_path(model_dir, only.name), filename=PurePosixPath(only.name).name,
                       declared_format="onnx" if kind == "onnx" else "", record=record)


def _is_python_model(names: set[str]) -> bool:
    return "model.py" in names


def choose_files(listing: dict[str, RepoFile], asked: list[str] | None, repo: str) -> tuple[list[RepoFile], str]:
    """The files to fetch and what they make: "onnx", "python" or "file" (one file, detected as an upload is).
    SourceRefused naming the files expected when the repository holds no model Modelport can run."""
    if asked is not None:
        missing = [name for name in asked if name not in listing]
        if missing:
            raise SourceRefused(f"The repository {repo} has no {', '.join(repr(n) for n in missing[:5])} at that "
                                f"revision; it holds {_sample(listing)}.")
        names = set(asked)
        if _is_python_model(names):
            return [listing[name] for name in asked], "python"
        onnx = [name for name in asked if name.endswith(".onnx")]
        if len(asked) == 1:
            return [listing[asked[0]]], "onnx" if onnx else "file"
        if any(name.endswith(".safetensors") for name in asked):
            raise _safetensors_refusal(repo)
        raise SourceRefused(f"source.files names {len(asked)} files but no model.py: Modelport imports one model "
                            "file (an .onnx), or a python model (model.py with the files it loads).")
    names = set(listing)
    if _is_python_model(names):
        picked = sorted(name for name in names if name.endswith(_PYTHON_SUFFIXES))
        if len(picked) > MAX_FILES:
            raise SourceRefused(f"The repository {repo} has {len(picked)} files a python model would take; name "
                                f"the ones it needs in source.files (at most {MAX_FILES}).")
        return [listing[name] for name in picked], "python"
    onnx = sorted(name for name in names if name.endswith(".onnx"))
    if onnx:
        preferred: list[str] = [name for name in ("model.onnx", "onnx/model.onnx") if name in names]
        choice: str
        if preferred:
            choice = preferred[0]
        elif len(onnx) == 1:
            choice = onnx[0]
        else:
            raise SourceRefused(f"The repository {repo} holds several ONNX files ({', '.join(onnx[:8])}); name the "
                                "one to import in source.files, e.g. [\"" + onnx[0] + "\"].")
        external = [name for name in names if name.startswith(choice) and name != choice]
        if external:
            raise SourceRefused(f"{choice} in {repo} keeps its weights in external data files "
                                f"({', '.join(sorted(external)[:4])}): Modelport's ONNX format takes one "
                                "self-contained .onnx file (onnx.save(model, path, save_as_external_data=False), for "
                                "models under 2 GB).")
        return [listing[choice]], "onnx"
    if any(name.endswith(".safetensors") for name in names):
        raise _safetensors_refusal(repo)
    raise SourceRefused(f"The repository {repo} holds no model Modelport can run: an ONNX export (model.onnx), or "
                        f"safetensors weights with a model.py; it holds {_sample(listing)}.")


def _safetensors_refusal(repo: str) -> SourceRefused:
    return SourceRefused(f"{repo} holds safetensors weights but no model.py: Modelport runs safetensors with a Triton "
                         "python-backend model. Add model.py (class TritonPythonModel, loading the weights with the "
                         "safetensors package) and, if it needs packages, requirements.txt and a signature.json "
                         "of its inputs and outputs, beside the .safetensors files; or import an ONNX export.")


def _sample(listing: dict[str, RepoFile]) -> str:
    names = sorted(listing)
    shown = ", ".join(names[:8])
    return f"{shown}{', ...' if len(names) > 8 else ''}" if names else "no files"


def _signature_in(model_dir: Path) -> Signature | None:
    """A python model's inputs and outputs from its signature.json (Modelport's signature JSON), where it has one."""
    path = model_dir / _SIGNATURE_FILE
    if not path.is_file():
        return None
    if path.stat().st_size > _SIGNATURE_MAX_BYTES:
        raise SourceRefused(f"{_SIGNATURE_FILE} is larger than {_SIGNATURE_MAX_BYTES} bytes.")
    try:
        return parse_signature(json.loads(path.read_bytes()))
    except (ValueError, SignatureError) as exc:
        raise SourceRefused(f"{_SIGNATURE_FILE} in the repository is not a signature: {str(exc)[:300]}") from None


class _Hub:
    """One repository on HF_ENDPOINT, as one team sees it (with the operator's token or with none)."""

    def __init__(self, repo: str, *, token_allowed: bool, team: str) -> None:
        self.repo = repo
        self.team = team
        self.endpoint = settings.HF_ENDPOINT
        self.token_sent = bool(token_allowed and settings.HF_TOKEN)
        # False, not None: None would let huggingface_hub read a token from the environment or the disk.
        self.token: str | bool = settings.HF_TOKEN if self.token_sent else False
        self.timeout = httpx2.Timeout(settings.IMPORT_READ_TIMEOUT_SECONDS,
                                      connect=settings.IMPORT_CONNECT_TIMEOUT_SECONDS)

    def commit_of(self, revision: str, timeout: float) -> str:
        """The commit `revision` names now, in one call of at most `timeout` seconds a read."""
        api = HfApi(endpoint=self.endpoint, token=self.token)
        info = self._call(lambda: api.model_info(self.repo, revision=revision, timeout=timeout),
                          f"revision {revision!r}")
        if not isinstance(info.sha, str) or not _COMMIT.match(info.sha):
            raise SourceRefused(f"The Hugging Face endpoint gave no commit for revision {revision!r} of {self.repo}.")
        return info.sha

    def resolve(self, revision: str) -> tuple[str, dict[str, RepoFile]]:
        """The commit `revision` names now, and the repository's files at that commit."""
        api = HfApi(endpoint=self.endpoint, token=self.token)
        info = self._call(lambda: api.model_info(self.repo, revision=revision, files_metadata=True,
                                                 timeout=settings.IMPORT_READ_TIMEOUT_SECONDS),
                          f"revision {revision!r}")
        commit = info.sha
        if not isinstance(commit, str) or not _COMMIT.match(commit):
            raise SourceRefused(f"The Hugging Face endpoint gave no commit for revision {revision!r} of {self.repo}.")
        siblings = info.siblings or []
        if len(siblings) > _MAX_LISTED:
            raise SourceRefused(f"{self.repo} lists more than {_MAX_LISTED} files: not a model repository.")
        entries = [(s.rfilename, s.size, s.blob_id, s.lfs) for s in siblings]
        if any(size is None and lfs is None for _, size, _, lfs in entries):
            # A mirror that answers model_info without the files' metadata (no ?blobs=True): the tree listing of the
            # same commit has them. Read one page at a time, and stopped past the bound.
            entries = self._call(lambda: self._tree(api, commit), f"the file listing at {commit[:12]}")
        listing: dict[str, RepoFile] = {}
        probe = Path("/nonexistent-root")
        for name, listed_size, blob_id, lfs in entries:
            if not isinstance(name, str) or len(name) > _NAME_MAX:
                raise SourceRefused(f"{self.repo} lists a file name Modelport refuses: {str(name)[:80]!r}.")
            # A listing is as hostile as an archive: '../../etc/passwd' is refused here, before any request.
            canonical = target_path(probe, name).relative_to(probe).as_posix()
            size = lfs.size if lfs is not None else listed_size
            if not isinstance(size, int) or size < 0:
                raise SourceRefused(f"The Hugging Face endpoint gave no size for {name[:80]!r} in {self.repo}.")
            sha256 = str(lfs.sha256) if lfs is not None else ""
            listing[canonical] = RepoFile(name=canonical, size=size, sha256=sha256.lower(),
                                          blob_id=str(blob_id or "").lower())
        return commit, listing

    def _tree(self, api: HfApi, commit: str) -> list[tuple[str, int | None, str | None, Any]]:
        entries: list[tuple[str, int | None, str | None, Any]] = []
        for entry in api.list_repo_tree(self.repo, revision=commit, recursive=True):
            if not isinstance(entry, HubRepoFile):
                continue  # a folder
            entries.append((entry.path, entry.size, entry.blob_id, entry.lfs))
            if len(entries) > _MAX_LISTED:
                raise SourceRefused(f"{self.repo} lists more than {_MAX_LISTED} files: not a model repository.")
        return entries

    def _call(self, call: Callable[[], _T], what: str) -> _T:
        """One call to the hub's API, its failures as the fetch protocol's."""
        try:
            return call()
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            raise self._refusal(status, what) from None
        except httpx2.TransportError as exc:
            raise TransientFetchError(f"The Hugging Face endpoint could not be reached: {str(exc)[:200]}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceRefused(f"The Hugging Face endpoint's answer about {self.repo} is malformed "
                                f"({type(exc).__name__}).") from None

    def download(self, commit: str, item: RepoFile, destination: Path, ctx: FetchContext, done: int,
                 total: int) -> str:
        """Stream one file into `destination`, never past its listed size; its sha256, checked with the listing's."""
        url = hf_hub_url(self.repo, item.name, revision=commit, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        # The bytes as stored: a compressed body would be inflated in memory a chunk at a time before the size check
        # sees it (one MiB of gzip can be a GiB), and the hashes are of the stored bytes anyway.
        headers["Accept-Encoding"] = "identity"
        sha256 = hashlib.sha256()
        blob = hashlib.sha1(b"blob %d\0" % item.size, usedforsecurity=False)
        written = 0
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            with get_session().stream("GET", url, headers=headers, timeout=self.timeout,
                                      follow_redirects=True) as response:
                # The hub's own answer (before its redirect to the CDN) is checked before the CDN's.
                first = response.history[0] if response.history else response
                if first.status_code >= 400:
                    raise self._refusal(first.status_code, f"{item.name!r} at {commit[:12]}")
                self._check_resolved(first, commit, item)
                if response.status_code >= 400:
                    raise self._refusal(response.status_code, f"{item.name!r} at {commit[:12]}")
                with open(destination, "xb") as out:
                    for chunk in response.iter_bytes(CHUNK):
                        written += len(chunk)
                        if written > item.size:
                            raise SourceRefused(f"{item.name} in {self.repo} is larger than the {item.size} bytes "
                                                "the hub listed: the download was cut and refused.")
                        out.write(chunk)
                        sha256.update(chunk)
                        blob.update(chunk)
                        ctx.progress(done + written, total)
                        ctx.check_time()
        except httpx2.TransportError as exc:
            raise TransientFetchError(f"Fetching {item.name} from {self.repo} failed: {str(exc)[:200]}") from None
        if written != item.size:
            raise TransientFetchError(f"{item.name} in {self.repo} ended after {written} of its {item.size} bytes.")
        digest = sha256.hexdigest()
        if item.sha256 and digest != item.sha256:
            raise SourceRefused(f"{item.name} in {self.repo} does not have the sha256 the hub listed "
                                f"({item.sha256[:16]}..., got {digest[:16]}...): refused.")
        if not item.sha256 and item.blob_id and blob.hexdigest() != item.blob_id:
            raise SourceRefused(f"{item.name} in {self.repo} does not have the git blob id the hub listed: refused.")
        return digest

    def _check_resolved(self, first: httpx2.Response, commit: str, item: RepoFile) -> None:
        """The hub's own answer for the file (the first response, before its redirect to the CDN) agrees with the
        listing: the same commit, and for an LFS file the same sha256 (X-Linked-Etag) and size (X-Linked-Size).
        A mirror that serves another commit's file under this one's name is refused before its bytes are read."""
        served = first.headers.get("x-repo-commit", "")
        if served and served.lower() != commit:
            raise SourceRefused(f"The Hugging Face endpoint served {item.name} of {self.repo} from commit "
                                f"{served[:40]!r}, not the {commit} it listed: refused.")
        if not item.sha256:
            return
        linked = first.headers.get("x-linked-etag", "").removeprefix("W/").strip('"').lower()
        if linked and linked != item.sha256:
            raise SourceRefused(f"The Hugging Face endpoint's etag of {item.name} in {self.repo} is not the sha256 "
                                "it listed: refused.")
        linked_size = first.headers.get("x-linked-size", "")
        if linked_size and linked_size != str(item.size):
            raise SourceRefused(f"The Hugging Face endpoint's size of {item.name} in {self.repo} ({linked_size[:20]}) "
                                f"is not the {item.size} bytes it listed: refused.")

    def _refusal(self, status: int, what: str) -> Exception:
        if status in (401, 403):
            if self.token_sent:
                return SourceRefused(f"The Hugging Face endpoint refused {self.repo} ({status}) with the operator's "
                                     "token: it does not exist, or the token has no access to it (a gated repository "
                                     "needs its terms accepted by the token's account).")
            return SourceRefused(f"The Hugging Face endpoint refused {self.repo} ({status}): it is private or gated "
                                 "(or does not exist), and needs a token the operator has not allowed for team "
                                 f"{self.team!r} (Team sources: send the operator's Hugging Face token).")
        if status == 404:
            return SourceRefused(f"The Hugging Face endpoint has no {what} in {self.repo} (404): check the "
                                 "repository, the revision and the file names.")
        if status in (408, 429) or status >= 500:
            return TransientFetchError(f"The Hugging Face endpoint answered {status} for {self.repo}.")
        return SourceRefused(f"The Hugging Face endpoint answered {status} for {what} in {self.repo}.")


fetcher = HuggingFaceFetcher()
