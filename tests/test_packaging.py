"""make install: the editable install is quiet because its layout is declared."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO_ROOT


def test_editable_install_uses_a_plain_path_entry_for_the_root_packages():
    """setuptools picks a static .pth (no "Editable installation" warning block)
    only when the package directory is declared and every package sits under it
    (setuptools.command.editable_wheel._select_strategy)."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"": "."}
    for pattern in config["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert (REPO_ROOT / package / "__init__.py").is_file(), package


def test_make_install_keeps_pip_quiet_but_not_silent():
    recipe = (REPO_ROOT / "Makefile").read_text()
    assert "pip install --quiet -e '.[dev]'" in recipe
    # Errors must still show: no output thrown away, no exit status ignored.
    assert "2>/dev/null" not in recipe and ">/dev/null" not in recipe and "|| true" not in recipe
