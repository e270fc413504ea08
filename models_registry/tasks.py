from __future__ import annotations

from celery import shared_task

from models_registry import inspection, uploads


@shared_task(acks_late=True)
def inspect_version(version_id: int) -> None:
    inspection.inspect_version(version_id)


@shared_task(expires=300)
def delete_expired_uploads() -> int:
    """Expired uploads, then the S3 multipart uploads left behind (an abort that failed, a process that died)."""
    count = uploads.delete_expired_uploads()
    uploads.abort_stale_multipart_uploads()
    return count
