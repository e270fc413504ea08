"""Settings for the test suite: the production settings module with test-only speed-ups and a var/ of its own,
so that tests never share a broker queue, artifacts or processes with a `make run` on the same machine."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# One var/ per test run (worker and web processes started by the tests inherit it), so that two runs at the same
# time never share a database file or a filesystem broker queue.
os.environ.setdefault("MODELPORT_VAR_DIR",
                      str(Path(__file__).resolve().parent.parent / "var" / "test" / f"run-{os.getpid()}"))
# Fast reconciling, so that fault tests (a killed Triton must be back within 15 s) run quickly.
os.environ.setdefault("RECONCILE_INTERVAL_SECONDS", "1")
os.environ.setdefault("ROLLOUT_DRAIN_SECONDS", "1.5")
# A key of the run's own, in the environment so that the worker and web processes the tests start share it.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(64))

from portal.settings import *  # noqa: E402,F403
from portal.settings import DATABASES, VAR_DIR  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not the in-memory default, so that a real Celery worker process can share the test database.
    # The worker is started with MODELPORT_TEST_DB pointing at it.
    _test_db = VAR_DIR / "test-db.sqlite3"
    DATABASES["default"]["TEST"] = {"NAME": str(_test_db)}
    if os.environ.get("MODELPORT_TEST_DB"):
        DATABASES["default"]["NAME"] = os.environ["MODELPORT_TEST_DB"]
    else:
        # Django recreates the test database file but not SQLite's WAL side files; stale ones corrupt the new file.
        for _suffix in ("", "-wal", "-shm"):
            Path(f"{_test_db}{_suffix}").unlink(missing_ok=True)
