from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from infra import tracing
from infra.open_files import raise_open_files_limit
from infra.var_dir import prepare_process

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Up to the hard limit, so that the web server's connection caps bind before EMFILE does (portal/web_server.py).
raise_open_files_limit()
# var/ before whitenoise looks for STATIC_ROOT; no start without a secret key (infra/var_dir.py).
prepare_process()
# OpenTelemetry from the OTEL_* variables; off, and free, without an endpoint (docs/observability.md). Before Django
# loads its middleware: the Django instrumentation adds its own.
tracing.configure()
tracing.instrument_portal()
django_application = get_asgi_application()

from gateway.app import Gateway  # noqa: E402 - needs Django set up first
from gateway.bodylimit import BodyLimit  # noqa: E402
from models_registry.tus_asgi import TusPatchRoute  # noqa: E402

# /serve/... goes to the gateway's fast path; a tus PATCH streams into storage (TusPatchRoute, which bounds it by the
# upload's remaining length); everything else to Django, its request bodies capped first (BodyLimit).
application = Gateway(TusPatchRoute(BodyLimit(django_application)))
