"""Metric names, for the tests of what reads GET /metrics (the alert rules in
deploy/prometheus/, the Grafana dashboard in deploy/grafana/): the names one
scrape exports, and the names a PromQL expression queries."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from governance.rules.outbound import parse_allow_list

# The series Prometheus stores for a family of each type: a counter only as
# ``_total``, a histogram only as its three parts; a gauge under its own name.
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}


def exported_names(client, settings) -> set[str]:
    """The series names one GET /metrics answers with, as PromQL names them.

    A family with no sample yet (a counter nothing has counted) still says its
    name and type, so every metric the code defines is here."""
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list(["127.0.0.0/8"])
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200, response.content
    exported = set()
    for family in text_string_to_metric_families(response.content.decode()):
        exported.update(family.name + s for s in SERIES_SUFFIXES.get(family.type, ("",)))
    return exported


# Words of PromQL that are never a metric when not followed by "(": binary
# operators, modifiers, and the keywords before a label list.
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
    | {"by", "without", "on", "ignoring", "group_left", "group_right"}
)
# Keywords whose "(...)" that follows is a list of label names.
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Grafana's template variables: ${name}, ${name:format}, $name, [[name]].
TEMPLATE_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[^\]]*\]\]")
TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>\#[^\n]*)
      | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
      | (?P<number>[0-9][0-9A-Za-z_.]*|\.[0-9][0-9A-Za-z_.]*)
      | (?P<identifier>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<punctuation>=~|!~|!=|==|<=|>=|.)""",
    re.VERBOSE,
)


def _tokens(expression: str) -> list[tuple[str, str]]:
    # A variable is neither an identifier nor a duration: it stands for one.
    text = TEMPLATE_VARIABLE.sub(" 0 ", expression)
    found = []
    for match in TOKEN.finditer(text):
        kind = match.lastgroup
        if kind not in ("space", "comment"):
            found.append((kind, match.group()))
    return found


def promql_metric_names(expression: str) -> set[str]:
    """Every metric a PromQL expression selects: an identifier outside ``{}``
    and ``[]`` that is not followed by ``(`` or by/without (a function or an
    aggregation), is no keyword and is not in the label list after by,
    without, on, ignoring, group_left or group_right; plus
    ``{__name__="..."}``."""
    tokens = _tokens(expression)
    names: set[str] = set()
    braces = brackets = 0
    label_list_depth = None  # the parenthesis depth of a label list being read
    depth = 0
    for i, (kind, text) in enumerate(tokens):
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "punctuation":
            if text == "{":
                braces += 1
            elif text == "}":
                braces -= 1
            elif text == "[":
                brackets += 1
            elif text == "]":
                brackets -= 1
            elif text == "(":
                depth += 1
            elif text == ")":
                if label_list_depth == depth:
                    label_list_depth = None
                depth -= 1
            continue
        if kind != "identifier" or brackets or label_list_depth is not None:
            continue
        if braces:
            # A label matcher: only __name__="x" names a metric.
            if text == "__name__" and following == "=" and i + 2 < len(tokens):
                value_kind, value = tokens[i + 2]
                if value_kind == "string":
                    names.add(value[1:-1])
            continue
        if text.lower() in KEYWORDS:  # PromQL's keywords are case-insensitive
            if text.lower() in LABEL_LISTS and following == "(":
                label_list_depth = depth + 1
            continue
        if following == "(" or following.lower() in ("by", "without"):
            continue  # a function, or an aggregation (its clause before or after)
        names.add(text)
    return names
