from __future__ import annotations

from celery import shared_task

from accounts.idempotency import delete_expired_records


@shared_task(expires=600)
def delete_expired_idempotency_records() -> int:
    return delete_expired_records()
