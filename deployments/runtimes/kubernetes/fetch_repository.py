#!/usr/bin/env python3
"""Fetch one revision's model repository and verify every file: the init container of Modelport's Triton pods.

Usage: python3 fetch_repository.py MANIFEST_JSON TARGET_DIRECTORY

The pod holds no S3 credential. Modelport's worker writes this script and MANIFEST_JSON into a Secret of the
revision (mounted read-only); the manifest lists each file of the repository with its size, its sha256 (as the
worker recorded them when it uploaded the repository) and a presigned GET URL for that one object, valid for a
limited time and renewed by the worker. Each file is streamed to a temporary name while it is counted and
hashed, and renamed into place only when both match; Triton then loads the directory, which it mounts read-only.

A file that does not match is refused (exit 2) and the pod does not start. An expired or revoked URL (S3 answers
403) exits 3: the kubelet retries this container, and each try reads the mounted Secret again, so it picks up the
URLs the worker renewed. Files already in place with the right size and hash are kept, so a retry resumes.

Standard library only, and Python 3.8+: it runs in the Triton image (or the small image an operator picks).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

CHUNK = 1024 * 1024
ATTEMPTS = 5  # per file, for connection failures and 5xx answers
TIMEOUT_SECONDS = 60
PARTIAL_SUFFIX = ".modelport-partial"

EXIT_FAILED, EXIT_MISMATCH, EXIT_REFUSED = 1, 2, 3


class FetchError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


class _Transient(Exception):
    """A failure worth retrying: no connection, a timeout, a 5xx answer."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A presigned URL names its object: following a redirect elsewhere is never what it meant."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"refused redirect to {newurl.split('?')[0]}", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects)


def log(message: str) -> None:
    print(f"fetch-repository: {message}", flush=True)


def _relative(value: Any, what: str) -> str:
    """A path inside the target directory: relative, no "..", no empty or hidden tricks."""
    if not isinstance(value, str) or not value or "\0" in value or "\\" in value:
        raise FetchError(f"the manifest has an invalid {what}: {value!r}")
    path = PurePosixPath(value)
    if path.is_absolute() or any(part in ("", ".", "..") for part in path.parts) or str(path) != value:
        raise FetchError(f"the manifest has an invalid {what}: {value!r} (it must stay inside the repository)")
    if value.endswith(PARTIAL_SUFFIX):
        raise FetchError(f"the manifest has an invalid {what}: {value!r}")
    return value


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FetchError(f"cannot read the manifest {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != 1 or not isinstance(manifest.get("files"), list):
        raise FetchError(f"{path} is not a Modelport repository manifest (format 1)")
    seen = set()
    for entry in manifest["files"]:
        if not isinstance(entry, dict):
            raise FetchError("the manifest lists a file that is not an object")
        name = _relative(entry.get("path"), "file path")
        size, digest, url = entry.get("size"), entry.get("sha256"), entry.get("url")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise FetchError(f"the manifest gives {name} an invalid size: {size!r}")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise FetchError(f"the manifest gives {name} an invalid sha256: {digest!r}")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise FetchError(f"the manifest gives {name} no http(s) URL")
        if name in seen:
            raise FetchError(f"the manifest lists {name} twice")
        seen.add(name)
    for directory in manifest.get("directories", []):
        _relative(directory, "directory")
    return manifest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, partial: Path, size: int) -> tuple[int, str]:
    """(bytes, sha256) of the body written to `partial`; never more than `size` bytes are accepted."""
    digest = hashlib.sha256()
    count = 0
    try:
        with _OPENER.open(urllib.request.Request(url, method="GET"), timeout=TIMEOUT_SECONDS) as response, \
                partial.open("wb") as out:
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                count += len(chunk)
                if count > size:
                    return count, ""  # longer than recorded: refused without reading the rest
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2048).decode("utf-8", "replace") if exc.fp is not None else ""
        if exc.code >= 500:
            raise _Transient(f"HTTP {exc.code}") from None
        code = EXIT_REFUSED if exc.code in (400, 401, 403) else EXIT_FAILED
        reason = "expired" if "expired" in detail.lower() else f"HTTP {exc.code} {exc.reason}"
        raise FetchError(f"S3 refused the download ({reason}){_s3_code(detail)}", code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Transient(str(getattr(exc, "reason", None) or exc)) from None
    return count, digest.hexdigest()


def _s3_code(body: str) -> str:
    start, end = body.find("<Code>"), body.find("</Code>")
    return f": {body[start + 6:end]}" if 0 <= start < end else ""


def fetch_file(entry: dict[str, Any], root: Path) -> bool:
    """Put one file in place; False when it was there already."""
    name, size, expected = entry["path"], entry["size"], entry["sha256"]
    target = root / name
    if target.is_file() and not target.is_symlink() and target.stat().st_size == size and sha256_of(target) == expected:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + PARTIAL_SUFFIX)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            count, digest = _download(entry["url"], partial, size)
            break
        except _Transient as exc:
            if attempt == ATTEMPTS:
                raise FetchError(f"{name}: no answer from S3 after {ATTEMPTS} attempts ({exc})") from None
            log(f"{name}: {exc}; trying again")
            time.sleep(min(2 ** attempt, 30))
        except FetchError as exc:
            partial.unlink(missing_ok=True)
            raise FetchError(f"{name}: {exc}", exc.code) from None
    if count != size or digest != expected:
        partial.unlink(missing_ok=True)
        got = f"more than {size} bytes" if count > size else f"{count} bytes, sha256 {digest}"
        raise FetchError(f"{name} does not match what Modelport recorded: expected {size} bytes, sha256 "
                         f"{expected}; got {got}. Refusing to serve it.", EXIT_MISMATCH)
    os.replace(partial, target)
    return True


def clean(root: Path, manifest: dict[str, Any]) -> None:
    """Remove whatever the manifest does not list (a partial file of an earlier try, a symlink, anything else)."""
    wanted = {PurePosixPath(entry["path"]) for entry in manifest["files"]}
    keep_dirs = {PurePosixPath(d) for d in manifest.get("directories", [])}
    for wanted_path in wanted | set(keep_dirs):
        keep_dirs.update(wanted_path.parents)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in filenames:
            if PurePosixPath((here / name).relative_to(root).as_posix()) not in wanted:
                (here / name).unlink()
        for name in list(dirnames):
            path = here / name
            if path.is_symlink() or PurePosixPath(path.relative_to(root).as_posix()) not in keep_dirs:
                if path.is_symlink():
                    path.unlink()
                else:
                    shutil.rmtree(path)
                dirnames.remove(name)


def fetch(manifest_path: Path, root: Path) -> int:
    manifest = load_manifest(manifest_path)
    root.mkdir(parents=True, exist_ok=True)
    clean(root, manifest)
    fetched = kept = total = 0
    for entry in manifest["files"]:
        if fetch_file(entry, root):
            fetched += 1
        else:
            kept += 1
        total += entry["size"]
    for directory in manifest.get("directories", []):
        (root / directory).mkdir(parents=True, exist_ok=True)
    log(f"revision {manifest.get('revision', '?')}: {fetched} file(s) fetched, {kept} already in place, "
        f"{total} bytes, every sha256 verified")
    return len(manifest["files"])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} MANIFEST_JSON TARGET_DIRECTORY", file=sys.stderr)
        return EXIT_FAILED
    try:
        fetch(Path(argv[1]), Path(argv[2]))
    except FetchError as exc:
        log(f"error: {exc}")
        if exc.code == EXIT_REFUSED:
            log("the download URLs may have expired: Modelport's worker renews them; this container is retried and "
                "reads the renewed ones")
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
