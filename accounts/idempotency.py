"""Idempotency-Key on create calls: a retried request gets the first one's response instead of a second object."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import acting_user
from accounts.models import IdempotencyRecord
from infra.api_errors import error_body
from infra.api_schema import KEY_PATTERN, MAX_KEY_LENGTH

KEEP_FOR = timedelta(hours=24)
# A view whose response holds a secret (a new API token) sets this attribute on the response to what a retry
# gets instead, (status, body): the record then keeps that, never the secret.
REPLAY_ATTRIBUTE = "idempotent_replay"


def _request_hash(request: Request) -> str:
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    content_type = request.content_type or ""
    data = request.data
    if content_type.startswith("application/json") or not isinstance(data, dict):
        digest.update(json.dumps(data, sort_keys=True, default=str).encode())
    else:
        # Multipart: the form fields and the uploaded files' names and sizes.
        for key in sorted(data.keys()):
            value = data.get(key)
            digest.update(f"{key}={getattr(value, 'name', value)}:{getattr(value, 'size', '')}\n".encode())
    return digest.hexdigest()


def idempotent(view: Callable[..., Response]) -> Callable[..., Response]:
    """For DRF function views: POSTs with an Idempotency-Key header are done once per user and key (24 hours)."""

    @functools.wraps(view)
    def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key")
        if request.method != "POST" or not key:
            return view(request, *args, **kwargs)
        if len(key) > MAX_KEY_LENGTH or not re.fullmatch(KEY_PATTERN, key):
            return Response(error_body("invalid", f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters of "
                                                  "visible ASCII (letters, digits, punctuation)."), status=400)
        user = acting_user(request)
        fingerprint = _request_hash(request)
        IdempotencyRecord.objects.filter(user=user, key=key, created_at__lt=timezone.now() - KEEP_FOR).delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(user=user, key=key, request_hash=fingerprint)
        except IntegrityError:
            existing = IdempotencyRecord.objects.get(user=user, key=key)
            if existing.request_hash != fingerprint:
                return Response(error_body("idempotency_key_reused",
                                           "This Idempotency-Key was used for a different request; use a new key."),
                                status=422)
            if existing.status_code is None:
                return Response(error_body("conflict",
                                           "A request with this Idempotency-Key is still running; retry shortly."),
                                status=409, headers={"Retry-After": "1"})
            response = Response(existing.response_body, status=existing.status_code)
            response["Idempotent-Replayed"] = "true"
            return response
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            record.delete()  # nothing happened: the client may try again with the same key
            raise
        if response.status_code >= 500:
            record.delete()
        else:
            status_code, body = getattr(response, REPLAY_ATTRIBUTE, None) or (response.status_code, response.data)
            IdempotencyRecord.objects.filter(pk=record.pk).update(status_code=status_code, response_body=body)
        return response

    return wrapper


def delete_expired_records() -> int:
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=timezone.now() - KEEP_FOR).delete()
    return deleted
