"""``/docs/api/``: the API's OpenAPI description (``dashboard.api.openapi``) as a
page: each endpoint, its body, its query and its answers, in words."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.api.openapi import openapi_document
from dashboard.site import permissions


@login_required
@permissions.requires(GET=None)
def api_reference(request: HttpRequest) -> HttpResponse:
    """/docs/api/ — the same description, as a page: each endpoint, its body and answers."""
    document = openapi_document()
    schemas = document["components"]["schemas"]
    endpoints = []
    for path, methods in document["paths"].items():
        for method, described in methods.items():
            ref = described.get("requestBody", {}).get("content", {}).get("application/json", {})
            body_name = ref.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1] or None
            endpoints.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": described["summary"],
                    "description": described.get("description", ""),
                    "body": _fields(schemas.get(body_name, {}), schemas) if body_name else [],
                    "query": [
                        {
                            "name": p["name"],
                            "required": "required" if p.get("required") else "optional",
                            "rule": _words(p.get("schema", {}), schemas),
                            "description": p.get("description", ""),
                        }
                        for p in described.get("parameters", [])
                        if p.get("in") == "query"
                    ],
                    "answers": [
                        (status, answer["description"])
                        for status, answer in described["responses"].items()
                    ],
                }
            )
    return render(request, "api_reference.html", {"endpoints": endpoints, "info": document["info"]})


def _fields(schema: dict[str, Any], schemas: dict[str, Any]) -> list[dict[str, str]]:
    required = set(schema.get("required", []))
    return [
        {
            "name": name,
            "required": "required" if name in required else "optional",
            "rule": _words(spec, schemas),
            "description": spec.get("description", ""),
        }
        for name, spec in schema.get("properties", {}).items()
    ]


def _number(value: Any) -> str:
    return (
        f"{value:g}" if isinstance(value, float) else f"{value:,}" if value > 9999 else str(value)
    )


def _words(spec: dict[str, Any], schemas: dict[str, Any]) -> str:
    """A schema in a few words: type and bounds."""
    if "anyOf" in spec:
        return " or ".join(_words(option, schemas) for option in spec["anyOf"])
    if "$ref" in spec:
        target = schemas.get(spec["$ref"].rsplit("/", 1)[-1], {})
        if "properties" in target:
            inner = "; ".join(
                f"{name}: {_words(sub, schemas)}" for name, sub in target["properties"].items()
            )
            return f"object ({inner})"
        return _words(target, schemas)
    kind = spec.get("type", "any")
    parts = [kind]
    if "enum" in spec:
        parts = ["one of " + ", ".join(map(str, spec["enum"]))]
    for key, word in (("minLength", "≥ {} chars"), ("maxLength", "≤ {} chars"),
                      ("minimum", "≥ {}"), ("maximum", "≤ {}"),
                      ("minItems", "≥ {} items"), ("maxItems", "≤ {} items")):  # fmt: skip
        if key in spec and not (key == "minLength" and spec[key] == 0):
            parts.append(word.format(_number(spec[key])))
    if kind == "array" and "items" in spec:
        parts.append(f"of {_words(spec['items'], schemas)}")
    return ", ".join(parts)
