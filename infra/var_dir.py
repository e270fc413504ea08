"""What a Modelport process creates under MODELPORT_VAR_DIR when it starts, never when settings are imported.

`manage.py ensure_dirs` (bin/run-portal and `make run` call it) runs both functions; the web server (portal/asgi.py,
portal/wsgi.py) and the Celery worker and beat (portal/celery.py) create the folders they need; storage creates its
own on first write, and the filesystem broker's channel its queue folders (infra/kombu_filesystem.py)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from infra.env import env_secret

SECRET_KEY_HINT = ("Set SECRET_KEY (or SECRET_KEY_FILE) to 50+ random characters; in development, "
                   "`manage.py ensure_dirs` (which `make run` runs) writes one to var/secret_key, or to "
                   "$MODELPORT_VAR_DIR/secret_key: export the same MODELPORT_VAR_DIR as the portal's.")


def ensure_dirs() -> list[Path]:
    """Create var/ and the static files' folder (whitenoise warns about a missing one); the folders created."""
    created = []
    for directory in (Path(settings.VAR_DIR), Path(settings.STATIC_ROOT)):
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            created.append(directory)
    return created


def secret_key_path() -> Path:
    return Path(settings.VAR_DIR) / "secret_key"


def ensure_secret_key() -> Path | None:
    """In development without SECRET_KEY, write a random key to var/secret_key once (mode 0600), so that sessions
    survive a restart; the path written, or None when there was nothing to do. Production never gets one written:
    it must set SECRET_KEY or SECRET_KEY_FILE (system check modelport.E100)."""
    if settings.PRODUCTION or env_secret("SECRET_KEY"):
        return None
    path = secret_key_path()
    if path.exists() and path.read_text().strip():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created with 0600 from the start: the key is never readable by others, even for an instant.
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_urlsafe(64))
    return path



def prepare_process() -> None:
    """At the start of a web server, worker or beat: create the folders, and refuse to start without a secret key
    (Django's own error would come at the first request that signs something, and say less)."""
    ensure_dirs()
    try:
        settings.SECRET_KEY  # noqa: B018 - Django raises on an empty key when it is read
    except ImproperlyConfigured:
        raise ImproperlyConfigured(f"SECRET_KEY is not set. {SECRET_KEY_HINT}") from None
