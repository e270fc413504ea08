"""portal.asgi without the tus PATCH thin path (models_registry.tus_asgi): PATCH bodies go on to Django's ASGI
handler, which spools them before the view runs, as before the thin path existed. Only for bench/upload_bench.py,
which measures both in one run; everything else in the stack is what `make run` serves."""

from __future__ import annotations

import re

from portal import asgi  # first: sets Django up

# isort: split
from models_registry import tus_asgi

tus_asgi.PATCH_PATH = re.compile(r"(?!)")  # matches no path: every PATCH goes on to Django
application = asgi.application
