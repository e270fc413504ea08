"""Room for uploads: a team's storage quota, and the free space of the disk that holds the artifacts.

A team's usage is what it holds: the blobs its versions reference (a blob shared with another team counts for both:
each team pays for what it keeps), the staged bytes of versions not yet validated, and every upload it has begun and
that has not expired, counted with its declared length from the moment it is created, so that declaring is what
reserves. A reservation is the declaring team's alone: it counts against that team's quota and its caps on open
uploads (uploads.check_open_uploads), never against the disk's free space as other teams see it, so that one team
declaring 80 GiB and sending nothing takes no room from another. The disk's room for an upload is its free space
less the operator's reserve: what is really written. When written bytes do fill it, every chunk waits with a 507
(check_disk_for_chunk) until there is room again.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet, Sum
from django.utils import timezone

from accounts.models import Team
from models_registry.models import Blob, ModelVersion, TeamStorageQuota, Upload
from models_registry.validation import ArtifactRejected


class NoRoom(ArtifactRejected):
    """An upload the team's quota or the disk cannot hold (HTTP 413); the message names which and by how much."""


def size_text(n: int) -> str:
    """Bytes for people: '20.0 GiB (21474836480 bytes)'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def quota_of(team: Team) -> int:
    override = TeamStorageQuota.objects.filter(team=team).values_list("bytes", flat=True).first()
    return int(override) if override is not None else int(settings.TEAM_STORAGE_QUOTA_BYTES)


def _sum(total: int | None) -> int:
    return int(total or 0)


def live_uploads(team: Team) -> QuerySet[Upload]:
    """The team's uploads that still hold their reservation: finished ones (until they become versions or expire)
    and unfinished ones not past their expiry (the sweep deletes those later; they stop counting at once)."""
    return Upload.objects.filter(team=team).exclude(completed_at__isnull=True, expires_at__lt=timezone.now())


def usage_of(team: Team) -> int:
    """The bytes the team holds or has reserved (see the module's docstring)."""
    blobs = Blob.objects.filter(pk__in=ModelVersion.objects.filter(model__team=team, blob__isnull=False)
                                .values("blob_id")).aggregate(total=Sum("size"))["total"]
    staged = (ModelVersion.objects.filter(model__team=team, blob__isnull=True).exclude(staged_key="")
              .aggregate(total=Sum("size"))["total"])
    uploads = live_uploads(team).aggregate(total=Sum("length"))["total"]
    # An import reserves its source's total (its `size`) before the bytes arrive (models_registry/imports.py).
    importing = (ModelVersion.objects.filter(model__team=team, status=ModelVersion.Status.IMPORTING)
                 .aggregate(total=Sum("size"))["total"])
    return _sum(blobs) + _sum(staged) + _sum(uploads) + _sum(importing)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes() -> int | None:
    """Free space where uploads land (ARTIFACT_ROOT's filesystem); None when artifacts are on S3, which has no
    disk of ours to fill."""
    if settings.S3_BUCKET:
        return None
    return int(shutil.disk_usage(_existing(Path(settings.ARTIFACT_ROOT))).free)


@dataclass(frozen=True)
class Room:
    quota: int
    used: int
    disk: int | None  # what the disk may still take for uploads; None: no local disk (S3)


def room_for(team: Team) -> Room:
    free = free_bytes()
    # Other uploads' declared lengths are not taken off: they are their teams' reservations, against their quotas.
    disk = None if free is None else free - settings.STORAGE_FREE_SPACE_RESERVE_BYTES
    return Room(quota=quota_of(team), used=usage_of(team), disk=disk)


def check_room(team: Team, size: int, *, disk: bool = True) -> None:
    """NoRoom unless `size` more bytes fit in the team's quota and (with `disk`) on the disk. Call it under the
    team's row lock where the bytes are then recorded, so that two requests of one team cannot both pass."""
    room = room_for(team)
    left = max(room.quota - room.used, 0)
    if size > left:
        raise NoRoom(f"The upload is {size_text(size)}, but team {team.name!r} has {size_text(left)} left of its "
                     f"storage quota of {size_text(room.quota)} ({size_text(room.used)} used, unfinished uploads "
                     "counted at their full length). Delete versions or unfinished uploads you no longer need, or "
                     "ask an operator for a larger quota.")
    if disk and room.disk is not None and size > max(room.disk, 0):
        raise NoRoom(f"The upload is {size_text(size)}, but the server's disk can take only "
                     f"{size_text(max(room.disk, 0))} more (its free space, less the "
                     f"{size_text(settings.STORAGE_FREE_SPACE_RESERVE_BYTES)} kept in reserve). Try a smaller upload "
                     "or try again later, or ask an operator to free space.")


def lock_team(team: Team) -> None:
    """The team's row, locked until the transaction ends (FOR NO KEY UPDATE: a plain FOR UPDATE would block every
    insert that references the team)."""
    Team.objects.select_for_update(no_key=True).filter(pk=team.pk).first()


def check_disk_for_chunk(size: int) -> str:
    """A message when the disk has no room for a chunk of `size` bytes above the reserve (something other than
    uploads filled it meanwhile), else ''."""
    free = free_bytes()
    if free is None or free - settings.STORAGE_FREE_SPACE_RESERVE_BYTES >= size:
        return ""
    return (f"The server's disk is too full to take this chunk of {size_text(size)} (free space "
            f"{size_text(max(free, 0))}, {size_text(settings.STORAGE_FREE_SPACE_RESERVE_BYTES)} kept in reserve): "
            "the bytes received so far are kept; resume the upload later.")
