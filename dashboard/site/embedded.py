"""The embedded defaults' folders under ``var/``: made when the system starts.

Importing the settings creates nothing (``manage.py up --help`` leaves the
checkout as it was). The folders are made by what needs them:

- ``manage.py up`` makes all of them before it migrates (``make_folders``),
  so the web, worker and scheduler it starts find them;
- the SQLite file's folder when the first connection opens
  (``dashboard/site/sqlite3``: ``manage.py migrate`` on a fresh clone);
- the file-system broker's folders when a channel opens (``FilesystemTransport``:
  any process that publishes or consumes, a worker started by hand too);
- the beat schedule's folder when beat opens it (``BeatScheduler``);
- the file-based cache's folder on its first write (``FileBasedCache``; Django's
  makes it when the cache is opened, which every system check does);
- ``collectstatic`` fills ``STATIC_ROOT``.

Each is made owner-only (0700) and the SQLite file 0600, whatever the umask
(dashboard/site/private_files.py; Django's cache makes its folder 0700 itself);
``make_folders`` also tightens what an older version left readable by others.
"""

from __future__ import annotations

from pathlib import Path

from celery.beat import PersistentScheduler
from django.conf import settings
from django.core.cache.backends import filebased
from kombu.transport import filesystem

from dashboard.site.private_files import make_private_folder, sqlite_files, tighten


def folders() -> list[Path]:
    """Every folder the settings name for files kept under the embedded defaults."""
    found = [Path(settings.VAR_DIR), Path(settings.STATIC_ROOT)]
    database = _sqlite_database()
    if database is not None:
        found.append(database.parent)
    if settings.CELERY_BROKER_URL == "filesystem://":
        found.extend(_broker_folders(settings.CELERY_BROKER_TRANSPORT_OPTIONS))
    found.append(Path(settings.CELERY_BEAT_SCHEDULE_FILENAME).parent)
    unique: dict[Path, None] = dict.fromkeys(found)
    return list(unique)


def make_folders() -> list[Path]:
    """Make every folder of ``folders()`` owner-only and tighten what an older
    version left readable by others; returns the folders that were missing."""
    missing = [folder for folder in folders() if not folder.is_dir()]
    for folder in folders():
        make_private_folder(folder)
    database = _sqlite_database()
    tighten([*_folders_in_var(), *(sqlite_files(database) if database else [])])
    return missing


def _sqlite_database() -> Path | None:
    database = settings.DATABASES["default"]
    if database["ENGINE"] != "dashboard.site.sqlite3" or database["NAME"] == ":memory:":
        return None
    return Path(database["NAME"])


def _folders_in_var() -> list[Path]:
    """``VAR_DIR`` and the folders of ``folders()`` in it, with those between.

    Only these are tightened: a folder outside it (a SQLite file's, named by
    DATABASE_URL) is the person's own and keeps its mode.
    """
    var = Path(settings.VAR_DIR)
    found = []
    for folder in folders():
        if folder != var and var not in folder.parents:
            continue
        while folder != var:
            found.append(folder)
            folder = folder.parent
    return [var, *dict.fromkeys(reversed(found))]


def _broker_folders(options: dict) -> list[Path]:
    names = ["data_folder_in", "data_folder_out", "control_folder"]
    if options.get("store_processed"):
        names.append("processed_folder")
    return [Path(options[name]) for name in names if options.get(name)]


class FilesystemChannel(filesystem.Channel):
    """Kombu's file-system channel, making its folders when it opens."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for folder in _broker_folders(
            {
                "data_folder_in": self.data_folder_in,
                "data_folder_out": self.data_folder_out,
                "control_folder": str(self.control_folder),
                "processed_folder": str(self.processed_folder),
                "store_processed": self.store_processed,
            }
        ):
            make_private_folder(folder)


class FilesystemTransport(filesystem.Transport):
    """``filesystem://`` (settings.CELERY_BROKER_TRANSPORT names this class)."""

    Channel = FilesystemChannel

    @property
    def default_connection_params(self):
        # The folders are the address: no host to default to, so kombu does
        # not warn "No hostname was supplied" on every start of the worker.
        return {"port": self.default_port}


class BeatScheduler(PersistentScheduler):
    """Celery's default scheduler, making the schedule file's folder first."""

    def setup_schedule(self):
        make_private_folder(Path(self.schedule_filename).parent)
        super().setup_schedule()


class FileBasedCache(filebased.FileBasedCache):
    """Django's file-based cache, making its folder on the first write, not when opened.

    Django's own makes it on every write too ("the cache dir can be deleted at
    any time") and reads a missing folder as a miss.
    """

    def __init__(self, dir, params):
        self._opening = True
        super().__init__(dir, params)
        self._opening = False

    def _createdir(self):
        if not self._opening:
            super()._createdir()
