"""Django's SQLite backend, making the database file and its folder owner-only
when it first connects.

The embedded default keeps ``db.sqlite3`` under ``var/``, which importing the
settings no longer creates (dashboard/site/embedded.py): ``manage.py migrate`` on a
fresh clone makes the folder here (0700), and the file too (0600), before SQLite
would make it readable by everyone under the usual umask; SQLite gives its
``-wal``, ``-shm`` and ``-journal`` files the database file's mode
(dashboard/site/private_files.py).
"""

from __future__ import annotations

from pathlib import Path

from django.db.backends.sqlite3 import base

from dashboard.site.private_files import make_private_file, make_private_folder


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        name = conn_params.get("database")
        in_memory = self.creation.is_in_memory_db(name)
        if isinstance(name, str | Path) and not in_memory and not str(name).startswith("file:"):
            make_private_folder(Path(name).parent)
            make_private_file(Path(name))
        return super().get_new_connection(conn_params)
