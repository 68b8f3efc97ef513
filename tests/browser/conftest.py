"""Real Chromium (Debian's /usr/bin/chromium) driven by Playwright against a live server.

Screenshots go to test-output/browser/<test name>/ so a person can look at them.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Playwright's sync API runs an event loop in the test thread; the ORM calls the
# tests make there are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="module")
def browser():
    # Module scope: Playwright's sync API keeps an event loop running in this
    # thread while it is open, which breaks async views tested after it.
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), (
        f"Chromium not found at {CHROMIUM}: apt-get install chromium (make test does on CI)"
    )
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield instance
        instance.close()


@pytest.fixture
def shots(request):
    """A folder for this test's screenshots; returns a save(page, name) helper."""
    folder = REPO_ROOT / "test-output" / "browser" / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)

    def save(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


@pytest.fixture
def page_for(browser, live_server):
    """Log a user in through the real login form and return the page."""
    contexts = []

    def login(
        username: str, password: str = "pw-for-tests-1", *, width=1280, height=800, **options
    ):
        """``options``: more of Playwright's context options (``timezone_id``, …)."""
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{live_server.url}/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/")
        return page

    yield login
    for context in contexts:
        context.close()


# axe-core from npm, fetched once into .cache/ (not in git) and injected by the tests.
AXE_VERSION = "4.14.1"
AXE_FOLDER = REPO_ROOT / ".cache" / f"axe-core-{AXE_VERSION}"
# The impacts a page must not have (axe's four: minor, moderate, serious, critical).
AXE_BLOCKING = ("serious", "critical")


@pytest.fixture(scope="session")
def axe_source() -> str:
    script = AXE_FOLDER / "node_modules" / "axe-core" / "axe.min.js"
    AXE_FOLDER.mkdir(parents=True, exist_ok=True)
    with open(AXE_FOLDER / ".lock", "w") as lock:  # two test processes, one download
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not script.is_file():
            assert shutil.which("npm"), "npm is needed for axe-core: apt-get install npm"
            subprocess.run(
                ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix",
                 str(AXE_FOLDER), f"axe-core@{AXE_VERSION}"],
                check=True, timeout=300, capture_output=True,
            )  # fmt: skip
    return script.read_text()


def axe_problems(page, axe_source: str) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now
    (evaluated through the DevTools protocol: the page's CSP does not apply)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(axe_source)
    found = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
            .map(v => ({id: v.id, impact: v.impact, help: v.help,
                        nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))}))"""
    )
    return [
        f"{page.url} [{page.viewport_size['width']}px] {v['impact']} {v['id']}: {v['help']}"
        f" — {', '.join(v['nodes'])}"
        for v in found
        if v["impact"] in AXE_BLOCKING
    ]
