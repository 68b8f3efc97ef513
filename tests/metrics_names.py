"""Metric names, for the tests of what reads GET /metrics (the alert rules in
deploy/prometheus/, the Grafana dashboard in deploy/grafana/): the names one
scrape exports, and the names a PromQL expression queries."""

from __future__ import annotations

import re
from collections.abc import Iterator

import promql_parser
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


# Grafana's template variables: ${name}, ${name:format}, $name, [[name]].
TEMPLATE_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[^\]]*\]\]")


def parse_promql(expression: str) -> promql_parser.Expr:
    """An expression as Prometheus parses it (``promql_parser``, a binding of the
    Rust port of Prometheus's parser); a Grafana variable stands for a duration
    in a range, for a number elsewhere."""
    for stand_in in ("5m", "0"):
        try:
            return promql_parser.parse(TEMPLATE_VARIABLE.sub(stand_in, expression))
        except ValueError:
            continue
    return promql_parser.parse(expression)  # raises, naming what does not parse


def _selected(node) -> Iterator[str]:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        for matcher in node.matchers.matchers:
            if matcher.name == "__name__" and matcher.op == promql_parser.MatchOp.Equal:
                yield matcher.value
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from _selected(node.vector_selector)
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _selected(node.lhs)
        yield from _selected(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for argument in node.args:
            yield from _selected(argument)
    elif isinstance(node, promql_parser.AggregateExpr):
        yield from _selected(node.expr)
        if node.param is not None:
            yield from _selected(node.param)
    elif isinstance(
        node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)
    ):
        yield from _selected(node.expr)


def promql_metric_names(expression: str) -> set[str]:
    """Every metric a PromQL expression selects, read from its syntax tree: the
    names of its vector selectors (and ``{__name__="..."}``)."""
    return set(_selected(parse_promql(expression)))
