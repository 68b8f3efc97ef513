"""Owner-only folders and files for what the embedded defaults keep on disk.

The SQLite database, the file-system broker's messages and the cache hold run
inputs, answers and session data: the folders under ``VAR_DIR`` are made 0700
and the database file 0600, whatever the umask (a usual 0022 would leave them
readable by every user of the machine). SQLite gives the files it adds beside
its database (``-wal``, ``-shm``, ``-journal``) the database file's mode, so
the file is made before SQLite opens it.

What an older version left readable by others is tightened when the system
starts (``dashboard/site/embedded.py``: ``make_folders``), with one log line.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

FOLDER_MODE = 0o700
FILE_MODE = 0o600
# What SQLite adds beside its database file.
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def make_private_folder(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents, each 0700; returns the ones made.

    A folder that exists is left as it is (``tighten`` is for those).
    """
    missing = []
    at = Path(folder)
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    made = []
    for path in reversed(missing):
        try:
            path.mkdir(mode=FOLDER_MODE)
        except FileExistsError:  # another process made it meanwhile
            continue
        path.chmod(FOLDER_MODE)  # mkdir's mode passes through the umask
        made.append(path)
    return made


def make_private_file(path: Path) -> bool:
    """Make an empty ``path`` with mode 0600 unless it exists; True when made."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(descriptor, FILE_MODE)  # os.open's mode passes through the umask
    finally:
        os.close(descriptor)
    return True


def sqlite_files(database: Path) -> list[Path]:
    """The database file and what SQLite keeps beside it."""
    return [database, *(database.with_name(database.name + end) for end in SQLITE_COMPANIONS)]


def tighten(paths: Iterable[Path]) -> list[str]:
    """Take group's and others' access away from each existing path; log one
    line naming what changed and return those words (empty when nothing did).

    A folder with the sticky bit (a shared one such as /tmp, named as VAR_DIR
    by mistake) is left alone, as is a path whose mode cannot be changed.
    """
    changed, refused = [], []
    for path in dict.fromkeys(Path(p) for p in paths):
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if not mode & 0o077:
            continue
        if stat.S_ISDIR(info.st_mode) and mode & stat.S_ISVTX:
            refused.append(f"{path} (a shared folder)")
            continue
        try:
            path.chmod(mode & ~0o077)
        except OSError as exc:
            refused.append(f"{path} ({exc.strerror})")
            continue
        changed.append(f"{path} {mode:04o} → {mode & ~0o077:04o}")
    if changed:
        logger.warning(
            "Made owner-only what group or others could read (as older versions left it): %s",
            ", ".join(changed),
        )
    if refused:
        logger.warning("Could not make owner-only: %s", ", ".join(refused))
    return changed
