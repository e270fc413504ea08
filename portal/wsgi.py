from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from infra import tracing
from infra.var_dir import prepare_process

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# var/ before whitenoise looks for STATIC_ROOT; no start without a secret key (infra/var_dir.py).
prepare_process()
# Tracing, as portal/asgi.py: off, and nothing imported, without an endpoint.
tracing.configure()
tracing.instrument_portal()
application = get_wsgi_application()
