"""The tus 1.0 resumable upload protocol (core, creation, termination, checksum, expiration) at /api/v1/uploads/,
so that stock clients (tus-js-client, tuspy) work. Finished uploads become model versions by their id."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.utils.http import http_date
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from accounts.context import current_team
from infra.api_errors import error_response
from models_registry import quota
from models_registry.models import Upload
from models_registry.uploads import (
    UploadProblem,
    append_chunk,
    check_chunk,
    create_upload,
    encode_metadata,
    expired_message,
    parse_checksum,
    parse_metadata,
    parse_uint,
    stall_text,
    terminate,
)

TUS_VERSION = "1.0.0"
TUS_EXTENSIONS = "creation,termination,checksum,expiration"


def _tus_headers(response: HttpResponse) -> HttpResponse:
    response["Tus-Resumable"] = TUS_VERSION
    # Browsers (tus-js-client) need to read these headers.
    response["Access-Control-Expose-Headers"] = (
        "Location, Upload-Offset, Upload-Length, Upload-Expires, Upload-Metadata, Tus-Resumable, Tus-Version, "
        "Tus-Extension, Tus-Max-Size, Tus-Checksum-Algorithm"
    )
    return response


def problem(status: int, message: str) -> HttpResponse:
    code = {400: "invalid", 404: "not_found", 408: "timeout", 409: "conflict", 410: "gone", 412: "precondition_failed",
            413: "too_large", 415: "unsupported_media_type", 429: "too_many_uploads", 460: "checksum_mismatch",
            503: "unavailable", 507: "insufficient_storage"}.get(status, "error")
    return _tus_headers(error_response(status, code, message))


def _int_header(request: Request, name: str) -> int | None:
    return parse_uint(name, request.headers.get(name))


@extend_schema(exclude=True)  # a binary protocol of its own (tus 1.0), documented in docs/api.md
class TusView(APIView):
    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        return _tus_headers(super().finalize_response(request, response, *args, **kwargs))

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if request.method != "OPTIONS" and request.headers.get("Tus-Resumable") != TUS_VERSION:
            raise _TusVersionMissing()

    def handle_exception(self, exc: Exception) -> Any:
        if isinstance(exc, _TusVersionMissing):
            response = problem(412, f"Send 'Tus-Resumable: {TUS_VERSION}': only tus {TUS_VERSION} is supported.")
            response["Tus-Version"] = TUS_VERSION
            return response
        if isinstance(exc, UploadProblem):
            return problem(exc.status, exc.message)
        return super().handle_exception(exc)

    # The tus answer is a plain HttpResponse (no content negotiation), which DRF accepts from any handler; the
    # stubs type APIView.options as returning Response and taking a DRF Request where View.options takes HttpRequest.
    def options(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponse:  # type: ignore[override]
        response = HttpResponse(status=204)
        response["Tus-Version"] = TUS_VERSION
        response["Tus-Extension"] = TUS_EXTENSIONS
        response["Tus-Max-Size"] = str(settings.MAX_UPLOAD_SIZE)
        response["Tus-Checksum-Algorithm"] = "sha256"
        return response


class _TusVersionMissing(Exception):
    pass


class UploadCreateView(TusView):
    def post(self, request: Request) -> HttpResponse:
        if request.headers.get("Upload-Defer-Length"):
            raise UploadProblem(400, "Upload-Defer-Length is not supported: send Upload-Length")
        length = _int_header(request, "Upload-Length")
        if length is None:
            raise UploadProblem(400, "Upload-Length is required")
        metadata = parse_metadata(request.headers.get("Upload-Metadata"))
        team = current_team(request)
        upload = create_upload(team, request.user, length, metadata)  # type: ignore[arg-type]
        response = HttpResponse(status=201)
        response["Location"] = request.build_absolute_uri(f"/api/v1/uploads/{upload.id}")
        response["Upload-Expires"] = http_date(upload.expires_at.timestamp())
        response["Upload-Offset"] = str(upload.offset)
        return response


def _get_upload(request: Request, upload_id: str) -> Upload:
    try:
        uuid.UUID(upload_id)
    except ValueError:
        raise UploadProblem(404, "No such upload.") from None
    upload = Upload.objects.filter(pk=upload_id, team=current_team(request)).first()
    if upload is None:
        # Also what a client resuming an upload the sweep removed gets: say that it may have expired.
        raise UploadProblem(404, "No such upload: it may have expired and been removed (an unfinished upload expires "
                                 f"after {stall_text()} with no bytes, or {settings.UPLOAD_EXPIRY_HOURS} hours after "
                                 "it began). Start a new upload.")
    from django.utils import timezone

    now = timezone.now()
    claimed = upload.busy_until is not None and upload.busy_until >= now  # bytes arriving: not stalled
    if upload.expires_at < now and upload.completed_at is None and not claimed:
        raise UploadProblem(410, expired_message(upload))
    return upload


@dataclass(frozen=True)
class PatchPlan:
    """A PATCH request that passed every check that does not need its body."""

    upload: Upload
    offset: int
    content_length: int | None
    checksum: bytes | None
    remaining: int  # the most bytes the body may have


def plan_patch(request: Request, upload_id: str) -> PatchPlan:
    if request.content_type != "application/offset+octet-stream":
        raise UploadProblem(415, "PATCH requests must have Content-Type: application/offset+octet-stream")
    upload = _get_upload(request, upload_id)
    offset = _int_header(request, "Upload-Offset")
    if offset is None:
        raise UploadProblem(400, "Upload-Offset is required")
    checksum = parse_checksum(request.headers.get("Upload-Checksum"))
    content_length = _int_header(request, "Content-Length")
    remaining = check_chunk(upload, offset, content_length)
    # The upload's bytes were reserved when it was created, but something else (logs, rendered repositories) may
    # have filled the disk since: a chunk that would eat into the reserve waits until there is room again.
    full = quota.check_disk_for_chunk(min(content_length if content_length is not None else 0, remaining))
    if full:
        raise UploadProblem(507, full)
    return PatchPlan(upload=upload, offset=offset, content_length=content_length, checksum=checksum,
                     remaining=remaining)


def patched(upload: Upload) -> HttpResponse:
    response = HttpResponse(status=204)
    response["Upload-Offset"] = str(upload.offset)
    response["Upload-Expires"] = http_date(upload.expires_at.timestamp())
    return response


class UploadDetailView(TusView):
    def head(self, request: Request, upload_id: str) -> HttpResponse:
        upload = _get_upload(request, upload_id)
        response = HttpResponse(status=200)
        response["Upload-Offset"] = str(upload.offset)
        response["Upload-Length"] = str(upload.length)
        response["Upload-Expires"] = http_date(upload.expires_at.timestamp())
        if upload.metadata:
            response["Upload-Metadata"] = encode_metadata(upload.metadata)
        response["Cache-Control"] = "no-store"
        return response

    def patch(self, request: Request, upload_id: str) -> HttpResponse:
        """Under ASGI (`make run`) PATCH is served by models_registry.tus_asgi, which streams the body instead of
        letting Django spool it first; this handler serves WSGI and the test client, with the same checks."""
        plan = plan_patch(request, upload_id)
        upload = append_chunk(plan.upload, plan.offset, request._request, plan.content_length, plan.checksum)
        return patched(upload)

    def delete(self, request: Request, upload_id: str) -> HttpResponse:
        terminate(_get_upload(request, upload_id))
        return HttpResponse(status=204)
