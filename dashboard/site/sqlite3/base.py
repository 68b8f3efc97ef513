"""Django's SQLite backend, making the database file's folder when it first connects.

The embedded default keeps ``db.sqlite3`` under ``var/``, which importing the
settings no longer creates (dashboard/site/embedded.py): ``manage.py migrate`` on a
fresh clone makes the folder here, as SQLite makes the file.
"""

from __future__ import annotations

from pathlib import Path

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        name = conn_params.get("database")
        in_memory = self.creation.is_in_memory_db(name)
        if isinstance(name, str | Path) and not in_memory and not str(name).startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)
