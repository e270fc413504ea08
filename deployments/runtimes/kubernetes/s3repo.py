"""Model repositories in S3, where the init container of Triton's pods fetches them from.

The worker renders a revision's repository, uploads it under a prefix of its own, and records what it uploaded
(each file's path, size and sha256) in the revision's marker object, written last, beside the prefix and outside
the tree. A repository is complete once its marker holds that manifest, so an upload interrupted half-way (or
one made by an older Modelport, whose marker was empty) is simply done again. Triton's pods get no S3 key: the
worker presigns one GET URL per file of the manifest (`presign`), and the pod verifies each file against the
manifest's sha256.

S3 has no directories, only keys: an empty directory of the rendered tree (an ensemble's version directory)
gets a placeholder object, and the manifest lists it as a directory to create.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from deployments.runtimes.kubernetes.config import KubernetesConfig

PLACEHOLDER = ".modelport-keep"
MARKER_SUFFIX = ".uploaded"
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class RepositoryFile:
    path: str  # relative to the revision's prefix
    size: int
    sha256: str


@dataclass(frozen=True)
class RepositoryManifest:
    """What the worker uploaded for one revision: the files Triton's pod must receive, byte for byte."""

    files: tuple[RepositoryFile, ...]
    directories: tuple[str, ...] = ()  # empty directories to create

    def to_json(self) -> str:
        return json.dumps({"format": MANIFEST_FORMAT,
                           "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
                           "directories": list(self.directories)}, sort_keys=True)

    @classmethod
    def from_json(cls, data: bytes) -> RepositoryManifest | None:
        """None for anything but a well-formed manifest (an older Modelport's empty marker included)."""
        try:
            raw = json.loads(data)
            if raw.get("format") != MANIFEST_FORMAT:
                return None
            files = tuple(RepositoryFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw["files"])
            directories = tuple(str(d) for d in raw.get("directories", []))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not all(_inside(f.path) for f in files) or not all(_inside(d) for d in directories):
            return None
        return cls(files=files, directories=directories)


def _inside(relative: str) -> bool:
    path = PurePosixPath(relative)
    return bool(relative) and not path.is_absolute() and ".." not in path.parts and str(path) == relative


def client(config: KubernetesConfig) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=config.s3_endpoint_url or None,
        region_name=config.s3_region,
        aws_access_key_id=config.s3_access_key_id or None,
        aws_secret_access_key=config.s3_secret_access_key or None,
        # SigV4: what every S3-compatible store accepts for presigned URLs, for up to 7 days.
        config=Config(signature_version="s3v4"),
    )


def deployment_prefix(config: KubernetesConfig, team: str, name: str, deployment_id: int) -> str:
    """Every revision of one deployment lives under this prefix (the id keeps a re-created name apart)."""
    return "/".join(p for p in (config.s3_prefix, team, f"{name}-{deployment_id}") if p) + "/"


def revision_prefix(config: KubernetesConfig, team: str, name: str, deployment_id: int, revision: int) -> str:
    return f"{deployment_prefix(config, team, name, deployment_id)}r{revision}/"


def _marker(prefix: str) -> str:
    return prefix.rstrip("/") + MARKER_SUFFIX


def repository_keys(root: Path) -> Iterator[tuple[str, Path | None]]:
    """(relative key, file) for every file of the tree, and (key of a placeholder, None) per empty directory."""
    for path in sorted(Path(root).rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        relative = path.relative_to(root).as_posix()
        if path.is_file():
            yield relative, path
        elif path.is_dir() and not any(path.iterdir()):
            yield f"{relative}/{PLACEHOLDER}", None


def read_manifest(s3: Any, bucket: str, prefix: str) -> RepositoryManifest | None:
    """The revision's manifest, or None when the repository is not (completely) uploaded."""
    try:
        body = s3.get_object(Bucket=bucket, Key=_marker(prefix))["Body"]
    except s3.exceptions.NoSuchKey:
        return None
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
            return None
        raise
    with body:
        return RepositoryManifest.from_json(body.read(MAX_MANIFEST_BYTES + 1))


def is_uploaded(s3: Any, bucket: str, prefix: str) -> bool:
    return read_manifest(s3, bucket, prefix) is not None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upload_repository(s3: Any, bucket: str, prefix: str, root: Path) -> RepositoryManifest:
    """Mirror the rendered tree at `root` to `prefix` (objects of an earlier attempt that are not in the tree are
    removed), then write the marker holding the manifest: each file's size and sha256, hashed here, before the
    upload, from the tree the worker rendered."""
    assert prefix.endswith("/")
    written = []
    files, directories = [], []
    for relative, path in repository_keys(root):
        key = prefix + relative
        if path is None:
            s3.put_object(Bucket=bucket, Key=key, Body=b"")
            directories.append(relative.removesuffix(f"/{PLACEHOLDER}"))
        else:
            files.append(RepositoryFile(relative, path.stat().st_size, _sha256(path)))
            s3.upload_file(str(path), bucket, key)
        written.append(key)
    stale = [key for key in list_keys(s3, bucket, prefix) if key not in set(written)]
    _delete_keys(s3, bucket, stale)
    manifest = RepositoryManifest(files=tuple(files), directories=tuple(directories))
    s3.put_object(Bucket=bucket, Key=_marker(prefix), Body=manifest.to_json().encode(),
                  ContentType="application/json")
    return manifest


def presign(s3: Any, bucket: str, prefix: str, manifest: RepositoryManifest, seconds: int) -> list[dict[str, Any]]:
    """The manifest's files with a presigned GET URL each: read access to exactly these objects, for `seconds`.
    Signing is local (no request to S3), so it costs nothing to renew."""
    assert prefix.endswith("/")
    return [{"path": f.path, "size": f.size, "sha256": f.sha256,
             "url": s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": prefix + f.path},
                                              ExpiresIn=seconds)}
            for f in manifest.files]


def list_keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def _delete_keys(s3: Any, bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
        batch = keys[start:start + 1000]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})


def delete_repository(s3: Any, bucket: str, prefix: str) -> int:
    """Remove a revision's repository (marker first: a half-deleted one must not count as uploaded)."""
    assert prefix.endswith("/")
    s3.delete_object(Bucket=bucket, Key=_marker(prefix))
    keys = list_keys(s3, bucket, prefix)
    _delete_keys(s3, bucket, keys)
    return len(keys)


def delete_prefix(s3: Any, bucket: str, prefix: str) -> int:
    """Remove everything under `prefix` (a deployment's repositories and markers)."""
    assert prefix.endswith("/")
    keys = list_keys(s3, bucket, prefix)
    _delete_keys(s3, bucket, keys)
    return len(keys)


def uploaded_revisions(s3: Any, bucket: str, deployment_prefix: str) -> list[int]:
    """Revision numbers with a repository (or its remains) under the deployment's prefix."""
    numbers: set[int] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=deployment_prefix, Delimiter="/"):
        names = [p["Prefix"][len(deployment_prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        names += [c["Key"][len(deployment_prefix):].removesuffix(MARKER_SUFFIX) for c in page.get("Contents", [])]
        numbers.update(int(n[1:]) for n in names if n.startswith("r") and n[1:].isdigit())
    return sorted(numbers)
