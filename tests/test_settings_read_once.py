"""Settings are read once, in dashboard/site/settings.py (with dashboard/site/env.py's readers).

Nothing else in governance/, tasks/ or dashboard/ reads the process
environment or repeats a setting's default: callers use ``settings.NAME``
plainly, and a secret whose variable an admin named at run time goes through
``settings.GOVERNANCE_NAMED_SECRET(name)``.

The only other environment uses are allow-listed by file and purpose:

- bootstrap: ``os.environ.setdefault("DJANGO_SETTINGS_MODULE", …)`` in the
  entry points that load Django (manage.py, asgi.py, wsgi.py, tasks/celery.py);
- child env: the ``up`` command may build a child process's environment from
  a copy of its own (``{**os.environ, …}``, ``os.environ.copy()``,
  ``dict(os.environ)``, given as ``env=`` or assigned to a name), never read a
  value out of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCANNED_PACKAGES = ("governance", "tasks", "dashboard")
SCANNED_FILES = ("manage.py",)
READERS = frozenset({"dashboard/site/settings.py", "dashboard/site/env.py"})

BOOTSTRAP = "bootstrap: os.environ.setdefault('DJANGO_SETTINGS_MODULE', ...)"
CHILD_ENV = "child env: a copy of os.environ for a subprocess"
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("manage.py", BOOTSTRAP),
        ("dashboard/site/asgi.py", BOOTSTRAP),
        ("dashboard/site/wsgi.py", BOOTSTRAP),
        ("tasks/celery.py", BOOTSTRAP),
        ("dashboard/site/management/commands/up.py", CHILD_ENV),
    }
)

ENV_ATTRS = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def scanned_files() -> list[Path]:
    paths = [REPO_ROOT / name for name in SCANNED_FILES]
    for package in SCANNED_PACKAGES:
        paths.extend((REPO_ROOT / package).rglob("*.py"))
    return sorted(p for p in paths if p.relative_to(REPO_ROOT).as_posix() not in READERS)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _os_aliases(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "os":
                    names.add(alias.asname or "os")
                elif alias.name.startswith("os.") and alias.asname is None:
                    names.add("os")  # ``import os.path`` binds ``os``
    return names


def _settings_aliases(tree: ast.AST) -> set[str]:
    names = {"settings"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "django.conf":
            names.update(a.asname or a.name for a in node.names if a.name == "settings")
    return names


def _purpose(node: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> str | None:
    """What an ``os.environ`` use is for, when it is one of the allowed kinds."""
    if node.attr != "environ":
        return None
    parent = parents.get(node)
    # os.environ.setdefault("DJANGO_SETTINGS_MODULE", "…") as a statement
    if isinstance(parent, ast.Attribute) and parent.attr == "setdefault":
        call = parents.get(parent)
        if (
            isinstance(call, ast.Call)
            and call.func is parent
            and len(call.args) == 2
            and not call.keywords
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == "DJANGO_SETTINGS_MODULE"
            and isinstance(parents.get(call), ast.Expr)
        ):
            return BOOTSTRAP
        return None
    # a copy of the whole environment: {**os.environ, …}, os.environ.copy(), dict(os.environ)
    copy: ast.AST | None = None
    if isinstance(parent, ast.Dict) and any(
        key is None and value is node for key, value in zip(parent.keys, parent.values, strict=True)
    ):
        copy = parent
    elif isinstance(parent, ast.Attribute) and parent.attr == "copy":
        call = parents.get(parent)
        if isinstance(call, ast.Call) and call.func is parent and not call.args:
            copy = call
    elif (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id == "dict"
        and parent.args == [node]
    ):
        copy = parent
    if copy is None:
        return None
    holder = parents.get(copy)
    if isinstance(holder, ast.keyword) and holder.arg == "env":
        return CHILD_ENV
    if isinstance(holder, ast.Assign | ast.AnnAssign) and holder.value is copy:
        return CHILD_ENV
    return None


def environment_uses(source: str, relpath: str) -> list[str]:
    """Every environment access in ``source`` that the allow-list does not cover."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = _parents(tree)
    aliases = _os_aliases(tree)
    offences = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            names = sorted(a.name for a in node.names if a.name in ENV_ATTRS or a.name == "*")
            if names:
                offences.append(f"{relpath}:{node.lineno}: {lines[node.lineno - 1].strip()}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ENV_ATTRS
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            purpose = _purpose(node, parents)
            if purpose is None or (relpath, purpose) not in ALLOWED:
                offences.append(f"{relpath}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return offences


def settings_defaults(source: str, relpath: str) -> list[str]:
    """``getattr(settings, "X", default)`` and ``hasattr(settings, "X")``: a
    default repeated outside settings.py (every setting is defined there)."""
    tree = ast.parse(source)
    aliases = _settings_aliases(tree)

    def is_settings(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in aliases) or (
            isinstance(node, ast.Attribute) and node.attr == "settings"
        )

    offences = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        defaulted = (node.func.id == "getattr" and len(node.args) >= 3) or node.func.id == "hasattr"
        if defaulted and is_settings(node.args[0]):
            offences.append(f"{relpath}:{node.lineno}: {ast.unparse(node)}")
    return offences


def _scan(check) -> list[str]:
    offences = []
    for path in scanned_files():
        found = check(path.read_text(), path.relative_to(REPO_ROOT).as_posix())
        offences.extend(sorted(found, key=lambda offence: int(offence.split(":")[1])))
    return offences


def test_nothing_outside_settings_reads_the_environment():
    offences = _scan(environment_uses)
    assert not offences, "read these through settings.NAME:\n" + "\n".join(offences)


def test_no_setting_default_is_repeated_outside_settings():
    offences = _scan(settings_defaults)
    assert not offences, "define once in settings.py, read settings.NAME:\n" + "\n".join(offences)


def test_allow_list_names_files_that_exist():
    missing = sorted(path for path, _ in ALLOWED if not (REPO_ROOT / path).is_file())
    assert missing == []


def test_the_scan_covers_the_entry_points_and_skips_only_the_readers():
    scanned = {p.relative_to(REPO_ROOT).as_posix() for p in scanned_files()}
    assert {
        "manage.py",
        "tasks/stages/model_turn.py",
        "tasks/span_store.py",
        "tasks/celery.py",
    } <= scanned
    assert {"dashboard/site/asgi.py", "dashboard/site/management/commands/up.py"} <= scanned
    assert scanned.isdisjoint(READERS)


# --------------------------------------------------------------------------- the checker itself


@pytest.mark.parametrize(
    "source",
    [
        "import os\nx = os.environ.get('X', '1')",
        "import os\nx = os.environ['X']",
        "import os\nx = os.getenv('X')",
        "import os\nx = 'X' in os.environ",
        "import os\nos.environ['X'] = '1'",
        "import os\nos.environ.setdefault('X', '1')",
        "import os\nfor k in os.environ: pass",
        "import os as o\nx = o.environ.get('X')",
        "import os.path\nx = os.environ.get('X')",
        "from os import environ\nx = environ['X']",
        "from os import getenv\nx = getenv('X')",
        "from os import *\nx = getenv('X')",
    ],
)
def test_checker_catches_stray_environment_reads(source):
    assert environment_uses(source, "tasks/anything.py") != []
    # Not even the allow-listed files may read a value.
    assert environment_uses(source, "dashboard/site/management/commands/up.py") != []
    assert environment_uses(source, "tasks/celery.py") != []


BOOTSTRAP_SOURCE = (
    "import os\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'dashboard.site.settings')"
)


def test_checker_allows_bootstrap_only_in_entry_points():
    assert environment_uses(BOOTSTRAP_SOURCE, "tasks/celery.py") == []
    assert environment_uses(BOOTSTRAP_SOURCE, "manage.py") == []
    assert environment_uses(BOOTSTRAP_SOURCE, "tasks/stages/model_turn.py") != []
    captured = "import os\nx = os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'd.s')"
    assert environment_uses(captured, "tasks/celery.py") != []


@pytest.mark.parametrize(
    "source",
    [
        "import os, subprocess\nsubprocess.Popen(['x'], env={**os.environ, 'A': '1'})",
        "import os\nchild_env = os.environ.copy()",
        "import os\nchild_env = dict(os.environ)",
        "import os\nchild_env: dict = {**os.environ}",
    ],
)
def test_checker_allows_child_env_only_in_up(source):
    assert environment_uses(source, "dashboard/site/management/commands/up.py") == []
    assert environment_uses(source, "dashboard/management/commands/demo.py") != []


def test_checker_does_not_take_a_copy_for_a_read():
    read_from_copy = "import os\nport = {**os.environ}.get('PORT')"
    assert environment_uses(read_from_copy, "dashboard/site/management/commands/up.py") != []


def test_checker_ignores_other_objects_environ():
    assert environment_uses("x = request.environ.get('X')", "dashboard/pages/overview.py") == []


@pytest.mark.parametrize(
    "source",
    [
        "from django.conf import settings\nx = getattr(settings, 'X', 1)",
        "from django.conf import settings\nx = getattr(settings, 'X', None)",
        "from django.conf import settings as dj\nx = getattr(dj, 'X', 1)",
        "import django.conf\nx = getattr(django.conf.settings, 'X', 1)",
        "from django.conf import settings\nx = settings.X if hasattr(settings, 'X') else 1",
    ],
)
def test_checker_catches_settings_defaults(source):
    assert settings_defaults(source, "governance/anything.py") != []


def test_checker_allows_plain_settings_reads():
    plain = "from django.conf import settings\nx = settings.X\ny = getattr(settings, name)"
    assert settings_defaults(plain, "governance/anything.py") == []
    assert settings_defaults("x = getattr(obj, 'X', 1)", "governance/anything.py") == []
