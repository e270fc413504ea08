"""Django's SQLite backend, creating the database file's folder when it first connects.

The embedded database lives under var/, which importing the settings no longer creates; without this, `manage.py
migrate` on a fresh checkout failed with SQLite's "unable to open database file" before any system check could
say why. The connection is what needs the folder, so the connection creates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        database = str(conn_params["database"])
        if database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)
