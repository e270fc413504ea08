"""Model repositories in S3, where Triton's pods load them from (`--model-repository=s3://...`).

S3 has no directories, only keys: an empty directory of the rendered tree (an ensemble's version directory) would
vanish, and Triton refuses an ensemble without its version directory. Every empty directory therefore gets a
placeholder object. A repository is complete once its marker object (beside the prefix, outside the tree Triton
reads) exists, so an upload interrupted half-way is simply done again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deployments.k8s.config import KubernetesConfig

PLACEHOLDER = ".modelport-keep"
MARKER_SUFFIX = ".uploaded"


def client(config: KubernetesConfig) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=config.s3_endpoint_url or None,
        region_name=config.s3_region,
        aws_access_key_id=config.s3_access_key_id or None,
        aws_secret_access_key=config.s3_secret_access_key or None,
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


def is_uploaded(s3: Any, bucket: str, prefix: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=_marker(prefix))
    except s3.exceptions.ClientError:
        return False
    return True


def upload_repository(s3: Any, bucket: str, prefix: str, root: Path) -> list[str]:
    """Mirror the rendered tree at `root` to `prefix` (objects of an earlier attempt that are not in the tree are
    removed), then write the marker. Returns the keys written."""
    assert prefix.endswith("/")
    written = []
    for relative, path in repository_keys(root):
        key = prefix + relative
        if path is None:
            s3.put_object(Bucket=bucket, Key=key, Body=b"")
        else:
            s3.upload_file(str(path), bucket, key)
        written.append(key)
    stale = [key for key in list_keys(s3, bucket, prefix) if key not in set(written)]
    _delete_keys(s3, bucket, stale)
    s3.put_object(Bucket=bucket, Key=_marker(prefix), Body=b"")
    return written


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
