from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_application = get_asgi_application()

from gateway.app import Gateway  # noqa: E402 - needs Django set up first
from gateway.bodylimit import BodyLimit  # noqa: E402

# /serve/... goes to the gateway's fast path; everything else to Django, its request bodies capped first.
application = Gateway(BodyLimit(django_application))
