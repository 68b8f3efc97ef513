"""The Content-Security-Policy (django-csp, dashboard/site/content_security.py) and
the templates and scripts that keep to it: no inline script or style, no eval.
tests/browser/test_content_security_policy.py walks the pages in Chromium."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from tests.conftest import REPO_ROOT

PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
    "base-uri 'self'; frame-ancestors 'none'; form-action 'self'"
)
API_POLICY = "default-src 'none'; frame-ancestors 'none'"


def directives(policy: str) -> dict[str, str]:
    """A Content-Security-Policy header as {directive: its sources}, in any order."""
    found = {}
    for part in policy.split(";"):
        name, _, sources = part.strip().partition(" ")
        if name:
            found[name] = sources
    return found


def test_the_policy_is_set_once_in_the_settings():
    header = "; ".join(
        f"{name} {' '.join(sources)}"
        for name, sources in settings.CONTENT_SECURITY_POLICY["DIRECTIVES"].items()
    )
    assert directives(header) == directives(PAGE_POLICY)
    assert "unsafe" not in header


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/login/", "/static/css/dashboard.css"])
def test_pages_and_their_files_carry_the_strict_policy(client, path):
    response = client.get(path)
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == directives(PAGE_POLICY)


@pytest.mark.django_db
def test_a_signed_in_page_carries_it_too(client, oncall):
    client.force_login(oncall)
    response = client.get("/")
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == directives(PAGE_POLICY)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "status"),
    [("/api/v1/openapi.json", 200), ("/api/v1/threads", 401), ("/api/v1/no-such-address", 404)],
)
def test_api_answers_load_nothing_and_are_never_framed(client, path, status, settings):
    settings.DEBUG = False  # django-csp leaves DEBUG's 404 and 500 pages without a policy
    response = client.get(path)
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    assert directives(response["Content-Security-Policy"]) == directives(API_POLICY)


def _files(folder: str, pattern: str) -> list:
    return sorted((REPO_ROOT / folder).rglob(pattern))


INLINE = {
    "style attribute": re.compile(r"\sstyle\s*=", re.I),
    "inline <style>": re.compile(r"<style\b", re.I),
    "inline <script>": re.compile(r"<script\b(?![^>]*\bsrc=)[^>]*>", re.I),
    "event handler attribute": re.compile(r"\son[a-z]+\s*=\s*[\"']", re.I),
    "hx-on (eval)": re.compile(r"\shx-on[:-]", re.I),
    "hx-trigger filter (eval)": re.compile(r"hx-trigger=\"[^\"]*\[", re.I),
    "js: values (eval)": re.compile(r"hx-va(ls|rs)=['\"]\s*(js|javascript):", re.I),
    "javascript: URL": re.compile(r"javascript:", re.I),
}


@pytest.mark.parametrize(
    "path",
    [*_files("templates", "*.html"), *_files("dashboard/pages", "*_html.py")],
    ids=lambda p: p.relative_to(REPO_ROOT).as_posix(),
)
def test_markup_needs_no_inline_script_style_or_eval(path):
    text = path.read_text()
    found = [what for what, pattern in INLINE.items() if pattern.search(text)]
    assert found == [], f"{path.relative_to(REPO_ROOT)}: {', '.join(found)}"


def test_htmx_runs_without_eval_or_styles_of_its_own():
    base = (REPO_ROOT / "templates" / "base.html").read_text()
    config = re.search(r'<meta name="htmx-config" content=\'([^\']*)\'>', base).group(1)
    assert '"allowEval": false' in config
    assert '"includeIndicatorStyles": false' in config
    assert '"attributesToSettle": ["class", "width", "height"]' in config  # no style
