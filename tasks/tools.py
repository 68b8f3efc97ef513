"""Built-in tools: executors that report only the fact of their own operation.

R4.1: a tool may establish that *its* operation succeeded, failed, was
refused, or has an unknown effect. It never concludes that the run failed and
it never raises into the runner (R4.2): every outcome is a ``ToolResult``.

The runner owns everything around a call: it admits the budget (tool calls,
and the separate search quota of R5.2), writes the ``ToolReceipt`` with effect
"pending" *before* calling (attempt before effect), then records the result
returned here. These functions write no rows.

Webhook effects and their verification (R6.2, R6.4)
----------------------------------------------------
``webhook`` POSTs JSON with the header ``Idempotency-Key: <key>``:

* 2xx, body read completely            -> succeeded
* 4xx                                  -> failed (the receiver refused; do not replay)
* 5xx other than 502/504               -> failed (the receiver itself reports failure)
* 502/504, 1xx/3xx                     -> unknown (a gateway or redirect speaks for an
                                          origin that may have acted)
* bad URL, host not allowed, bad key   -> failed / refused, no request made
* an address the outbound check refuses -> refused, no request made (checked
  (loopback, link-local/metadata,         when sending, against every address
  private, reserved; plain http in        the host resolves to, and the request
  production), unless allow-listed        connects to a checked address)
* connect error / connect timeout      -> failed (nothing left the machine)
* timeout, reset or close after the request was sent, or a response body
  interrupted after the headers        -> unknown (we cannot know whether the
                                          receiver acted; never "timeout = failed")

``verify_webhook`` asks the receiver, by idempotency key, what happened. The
contract a receiver implements::

    GET {url}?idempotency_key=<key>        (also sent as header Idempotency-Key)
    200 {"status": "processed", ...}  -> the effect happened        -> succeeded
    404 {"status": "unseen"}          -> the key was never received -> failed, seen False
    anything else, or no answer       -> unknown (still)

A bare 404 without the ``"unseen"`` body is *not* proof: an endpoint that does
not implement verification answers 404 too, and replaying on that would risk a
double effect. Verification never replays; the runner may replay with the SAME
key only after a "failed" / ``seen: False`` answer.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from governance.rules import tools as tool_rules
from governance.services.outbound import Resolver
from tasks import outbound
from tasks.adapters.base import ToolSpec

Effect = Literal["succeeded", "failed", "refused", "unknown"]
EFFECTS: frozenset[str] = frozenset({"succeeded", "failed", "refused", "unknown"})


@dataclass(frozen=True)
class ToolResult:
    """The executor's fact about one operation (R4.1).

    ``output`` is what the model sees (JSON-serialisable); ``error`` is human
    words for the dashboard; ``external`` says the tool acts outside this
    process, so an "unknown" result must be verified before any replay (R6.4).
    """

    effect: Effect
    output: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    external: bool = False

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise ValueError(f"unknown effect {self.effect!r}")


def _failed(error: str, *, external: bool = False, **output: Any) -> ToolResult:
    return ToolResult("failed", dict(output), error, external)


# ---------------------------------------------------------------------------
# calculator

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 1000
MAX_RESULT_BITS = 4000  # about 1200 decimal digits: well inside int->str limits

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class _CalcError(Exception):
    pass


def _not_allowed(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"names are not allowed ({node.id!r}); use numbers only"
    if isinstance(node, ast.Call):
        return "function calls are not allowed"
    if isinstance(node, ast.Attribute):
        return "attribute access is not allowed"
    if isinstance(node, ast.BinOp):
        return f"operator {type(node.op).__name__} is not allowed; use + - * / // % **"
    if isinstance(node, ast.UnaryOp):
        return f"unary operator {type(node.op).__name__} is not allowed"
    if isinstance(node, ast.Constant):
        return f"only numbers are allowed, not {node.value!r}"
    return f"{type(node).__name__} is not allowed in an arithmetic expression"


def _number(value: Any) -> int | float:
    if isinstance(value, complex):
        raise _CalcError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _CalcError("the result is too large (not a finite number)")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise _CalcError("the result is too large")
    return value


def _bound_work(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse a huge power or product by estimate, before computing it.

    The estimates are lower bounds of the result's size, so anything refused
    here really is too large; borderline results are computed and measured.
    """
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise _CalcError(f"the exponent {right} exceeds the limit of {MAX_EXPONENT}")
        both_int = isinstance(left, int) and isinstance(right, int)
        if both_int and right > 0 and (abs(left).bit_length() - 1) * right > MAX_RESULT_BITS:
            raise _CalcError("the result is too large")
    elif isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
        product_bits = abs(left).bit_length() + abs(right).bit_length() - 1
        if product_bits > MAX_RESULT_BITS:
            raise _CalcError("the result is too large")


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _CalcError(_not_allowed(node))
        return _number(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _number(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        _bound_work(node.op, left, right)
        return _number(_BINARY[type(node.op)](left, right))
    raise _CalcError(_not_allowed(node))


def calculator(arguments: dict[str, Any], *, idempotency_key: str) -> ToolResult:
    """Evaluate an arithmetic expression; never raises (R4.1, R4.2).

    Numbers, + - * / // % **, unary + -, parentheses. No names, calls or
    attributes; exponent and result size are bounded.
    """
    expression = arguments.get("expression") if isinstance(arguments, dict) else None
    if not isinstance(expression, str) or not expression.strip():
        return _failed("calculator needs a non-empty 'expression' string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        return _failed(
            f"the expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return _failed(f"not a valid arithmetic expression: {expression!r}")
    try:
        result = _eval(tree)
    except _CalcError as exc:
        return _failed(str(exc))
    except ZeroDivisionError:
        return _failed("division by zero")
    except OverflowError:
        return _failed("the result is too large")
    except (RecursionError, MemoryError):
        return _failed("the expression is too deeply nested")
    return ToolResult("succeeded", {"expression": expression, "result": result})


# ---------------------------------------------------------------------------
# kb_search

KB_DEFAULT_LIMIT = 5
KB_MAX_LIMIT = 20
KB_MAX_QUERY_CHARS = 500
KB_MAX_TERMS = 10
SNIPPET_CHARS = 200
_TERM = re.compile(r"\w+")
# Ranking weights: a term in the title says more than one in the body.
_TITLE_WEIGHT, _TAG_WEIGHT, _BODY_WEIGHT = 3, 2, 1


def _snippet(body: str, terms: list[str]) -> str:
    text = " ".join(body.split())
    lowered = text.lower()
    positions = [p for p in (lowered.find(t) for t in terms) if p >= 0]
    start = max(0, min(positions) - SNIPPET_CHARS // 4) if positions else 0
    piece = text[start : start + SNIPPET_CHARS]
    return ("…" if start > 0 else "") + piece + ("…" if start + SNIPPET_CHARS < len(text) else "")


def _tags_text(tags: Any) -> str:
    if isinstance(tags, list):
        return " ".join(str(tag) for tag in tags).lower()
    return str(tags).lower() if isinstance(tags, str) else ""


def kb_search(arguments: dict[str, Any], *, idempotency_key: str) -> ToolResult:
    """Search the knowledge base (title, body, tags), case-insensitively.

    Ranked by the number of distinct query terms matched, then by weighted
    occurrences (title x3, tag x2, body x1), then title. Reads only: the
    search quota (R5.2) is admitted by the runner, not here.
    """
    from django.db import DatabaseError
    from django.db.models import Q

    from governance.models import KnowledgeDocument

    if not isinstance(arguments, dict):
        return _failed("kb_search needs an object of arguments")
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return _failed("kb_search needs a non-empty 'query' string")
    if len(query) > KB_MAX_QUERY_CHARS:
        return _failed(f"the query is longer than {KB_MAX_QUERY_CHARS} characters")
    limit = arguments.get("limit", KB_DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return _failed(f"'limit' must be a positive integer (at most {KB_MAX_LIMIT})")
    limit = min(limit, KB_MAX_LIMIT)
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(query)))[:KB_MAX_TERMS]
    if not terms:
        return _failed("the query has no searchable words")

    where = Q()
    for term in terms:
        where |= Q(title__icontains=term) | Q(body__icontains=term) | Q(tags__icontains=term)
    try:
        documents = list(KnowledgeDocument.objects.filter(where))
    except DatabaseError as exc:
        return _failed(f"the knowledge base could not be read: {exc}")

    ranked = []
    for doc in documents:
        title, body, tags = doc.title.lower(), doc.body.lower(), _tags_text(doc.tags)
        matched = [t for t in terms if t in title or t in body or t in tags]
        if not matched:
            continue  # the database matched JSON syntax, not a tag
        hits = sum(
            _TITLE_WEIGHT * title.count(t)
            + _TAG_WEIGHT * tags.count(t)
            + _BODY_WEIGHT * body.count(t)
            for t in matched
        )
        ranked.append((-len(matched), -hits, doc.title, doc.pk, doc, matched, hits))
    ranked.sort(key=lambda row: row[:4])
    results = [
        {
            "id": doc.pk,
            "title": doc.title,
            "snippet": _snippet(doc.body, matched),
            "matched_terms": matched,
            "score": hits,
        }
        for *_, doc, matched, hits in ranked[:limit]
    ]
    return ToolResult(
        "succeeded", {"query": query, "terms": terms, "limit": limit, "results": results}
    )


# ---------------------------------------------------------------------------
# webhook and its verification

MAX_RESPONSE_BYTES = 4096
MAX_IDEMPOTENCY_KEY_CHARS = 300  # ToolReceipt.idempotency_key
_KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")  # printable ASCII, header-safe
_USER_AGENT = "agent-governance-tools/1"


class _Interrupted(Exception):
    """The response started (headers) but did not complete."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _check_url(url: Any, allowed_hosts: Iterable[str] | None) -> tuple[Effect, str] | None:
    """Why this URL may not be called, or None. Checked before any byte is sent."""
    if not isinstance(url, str) or not url:
        return "failed", "a 'url' string is required"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        return "failed", f"not a valid URL: {exc}"
    if parsed.scheme not in {"http", "https"}:
        return "failed", f"only http and https URLs are allowed, not {parsed.scheme or 'none'!r}"
    if not parsed.host:
        return "failed", "the URL has no host"
    if allowed_hosts is not None and parsed.host.lower() not in {h.lower() for h in allowed_hosts}:
        return "refused", f"host {parsed.host!r} is not on the webhook allow-list"
    return None


def _check_key(idempotency_key: Any) -> str | None:
    if not isinstance(idempotency_key, str) or not _KEY.fullmatch(idempotency_key):
        return "the idempotency key must be non-empty printable ASCII"
    if len(idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS:
        return f"the idempotency key is longer than {MAX_IDEMPOTENCY_KEY_CHARS} characters"
    return None


def _exchange(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    content: bytes | None,
    params: dict[str, str] | None,
    timeout_s: float,
    transport: httpx.BaseTransport | None,
    resolver: Resolver | None = None,
) -> tuple[int, bytes, bool]:
    """One request; returns (status, body up to the cap, truncated).

    Raises ``outbound.OutboundRefused`` before connecting when the URL's
    addresses are not allowed (the request goes to the checked address),
    httpx.TransportError for failures before a response, and
    ``_Interrupted`` when the body broke off after the headers arrived.
    ``timeout_s`` bounds each network phase (connect, write, each read) and
    the whole body read, so a slowly dripping response cannot outlast it.
    """
    with (
        httpx.Client(
            transport=transport, timeout=httpx.Timeout(timeout_s), follow_redirects=False
        ) as client,
        outbound.stream(
            client,
            method,
            url,
            headers=headers,
            content=content,
            params=params,
            resolver=resolver,
        ) as response,
    ):
        started = time.monotonic()
        body = bytearray()
        truncated = False
        try:
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > MAX_RESPONSE_BYTES:
                    truncated = True
                    break
                if time.monotonic() - started > timeout_s:
                    raise _Interrupted(
                        response.status_code, "the response body exceeded the timeout"
                    )
        except httpx.TransportError as exc:
            raise _Interrupted(response.status_code, f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, bytes(body[:MAX_RESPONSE_BYTES]), truncated


def _sent_nothing(exc: httpx.TransportError) -> bool:
    """True when the failure happened before any byte of the request left.

    Connecting (TCP/TLS), waiting for a pool slot, an unsupported scheme or a
    request we could not even encode: the receiver cannot have acted. Every
    other transport error (write, read, reset, remote close, read timeout)
    comes after bytes were sent.
    """
    return isinstance(
        exc,
        httpx.ConnectError
        | httpx.ConnectTimeout
        | httpx.PoolTimeout
        | httpx.UnsupportedProtocol
        | httpx.LocalProtocolError
        | httpx.ProxyError,
    )


def _decode(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


WEBHOOK_CLASS = tool_rules.builtin_effect_class("webhook")


class _NotSent(Exception):
    """A call refused before any request: its effect and why."""

    def __init__(self, effect: Effect, error: str) -> None:
        super().__init__(error)
        self.effect, self.error = effect, error


def _webhook_request(
    arguments: Any, idempotency_key: str, allowed_hosts: Iterable[str] | None
) -> tuple[str, bytes]:
    """The webhook's URL and JSON body (``_NotSent`` when nothing may be sent)."""
    if not isinstance(arguments, dict):
        raise _NotSent("failed", "webhook needs an object of arguments")
    url = arguments.get("url")
    if problem := _check_url(url, allowed_hosts):
        raise _NotSent(problem[0], problem[1])
    if err := _check_key(idempotency_key):
        raise _NotSent("failed", err)
    if "payload" not in arguments:
        raise _NotSent("failed", "webhook needs a 'payload' to send")
    try:
        return url, json.dumps(arguments["payload"], allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise _NotSent("failed", f"the payload is not JSON-serialisable: {exc}") from None


def webhook(
    arguments: dict[str, Any],
    *,
    idempotency_key: str,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
    allowed_hosts: Iterable[str] | None = None,
    resolver: Resolver | None = None,
) -> ToolResult:
    """POST ``arguments["payload"]`` as JSON to ``arguments["url"]`` (R4.1, R6.2).

    See the module docstring for the status -> effect table. ``allowed_hosts``
    (exact host names, case-insensitive) refuses any other host before a
    request is made; None allows every host. Whatever it says, an address the
    outbound check refuses is never called (``refused``); ``resolver``
    replaces DNS (tests).
    """

    def result(effect: Effect, error: str = "", **output: Any) -> ToolResult:
        return ToolResult(effect, dict(output), error, external=True)

    try:
        url, content = _webhook_request(arguments, idempotency_key, allowed_hosts)
    except _NotSent as exc:
        return result(exc.effect, exc.error, request_sent=False)

    headers = {
        "Idempotency-Key": idempotency_key,
        "Content-Type": "application/json",
        "User-Agent": _USER_AGENT,
    }
    try:
        status, body, truncated = _exchange(
            "POST",
            url,
            headers=headers,
            content=content,
            params=None,
            timeout_s=timeout_s,
            transport=transport,
            resolver=resolver,
        )
    except outbound.OutboundRefused as exc:
        # R4.1: the tool's own "no" — nothing was sent, so nothing to verify.
        return result("refused", exc.reason, request_sent=False)
    except _Interrupted as exc:
        return result(
            tool_rules.call_effect("no_answer", WEBHOOK_CLASS),
            f"the receiver answered HTTP {exc.status} but the response was interrupted "
            f"({exc.reason}); whether it acted must be verified by idempotency key",
            status=exc.status,
            request_sent=True,
        )
    except httpx.TransportError as exc:
        if _sent_nothing(exc):
            return result(
                tool_rules.call_effect("not_sent", WEBHOOK_CLASS),
                f"could not reach the receiver ({type(exc).__name__}: {exc}); nothing was sent",
                request_sent=False,
            )
        return result(
            tool_rules.call_effect("no_answer", WEBHOOK_CLASS),
            f"the request was sent but no complete answer came back ({type(exc).__name__}: "
            f"{exc}); whether the receiver acted must be verified by idempotency key",
            status=None,
            request_sent=True,
        )

    seen = {"status": status, "body": _decode(body), "truncated": truncated, "request_sent": True}
    effect = tool_rules.call_effect(tool_rules.http_status_end(status), WEBHOOK_CLASS)
    if effect == "succeeded":
        return result("succeeded", **seen)
    if effect == "failed":
        said = "refused the request" if status < 500 else "reported a failure"
        return result("failed", f"the receiver {said} (HTTP {status})", **seen)
    return result(
        "unknown",
        f"HTTP {status} does not say whether the receiver acted; verify by idempotency key",
        **seen,
    )


def verify_webhook(
    arguments: dict[str, Any],
    *,
    idempotency_key: str,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
    allowed_hosts: Iterable[str] | None = None,
    resolver: Resolver | None = None,
) -> ToolResult:
    """Ask the receiver whether it processed ``idempotency_key`` (R6.4).

    Only an explicit answer settles the question: 200 ``{"status":
    "processed"}`` -> succeeded; 404 ``{"status": "unseen"}`` -> failed with
    ``output["seen"] is False`` (the runner may replay with the SAME key).
    Everything else stays "unknown". Never sends the payload again.
    """

    def unknown(error: str, **output: Any) -> ToolResult:
        return ToolResult("unknown", {"seen": None, **output}, error, external=True)

    url = arguments.get("url") if isinstance(arguments, dict) else None
    # An unusable URL or key proves nothing about the original effect.
    problem = _check_url(url, allowed_hosts)
    if problem:
        return unknown(f"cannot verify: {problem[1]}")
    if err := _check_key(idempotency_key):
        return unknown(f"cannot verify: {err}")
    try:
        status, body, truncated = _exchange(
            "GET",
            url,
            headers={"Idempotency-Key": idempotency_key, "User-Agent": _USER_AGENT},
            content=None,
            params={"idempotency_key": idempotency_key},
            timeout_s=timeout_s,
            transport=transport,
            resolver=resolver,
        )
    except outbound.OutboundRefused as exc:
        # The address is not allowed (now): that proves nothing about the effect.
        return unknown(f"cannot verify: {exc.reason}")
    except (_Interrupted, httpx.TransportError) as exc:
        return unknown(f"verification got no complete answer ({type(exc).__name__}: {exc})")

    answer: Any = None
    if not truncated:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
    reported = answer.get("status") if isinstance(answer, dict) else None
    if status == 200 and reported == "processed":
        return ToolResult(
            "succeeded", {"seen": True, "status": status, "receipt": answer}, "", external=True
        )
    if status == 404 and reported == "unseen":
        return ToolResult(
            "failed",
            {"seen": False, "status": status},
            "the receiver has no record of this idempotency key; the effect did not happen",
            external=True,
        )
    return unknown(
        f"HTTP {status} with status {reported!r} is not a verification answer "
        "(expected 200 'processed' or 404 'unseen')",
        status=status,
        body=_decode(body),
    )


# ---------------------------------------------------------------------------
# HTTP tools of the registry


def http_tool(
    arguments: dict[str, Any],
    *,
    url: str,
    method: str,
    effect_class: str,
    idempotency_key: str,
    timeout_s: float = 30.0,
    token: str | None = None,
    transport: httpx.BaseTransport | None = None,
    resolver: Resolver | None = None,
) -> ToolResult:
    """Call a registered HTTP tool: the arguments as JSON (as the query for
    GET and DELETE). The webhook's table reads the answer
    (``rules.tools.http_status_end``); an ``external_effect`` tool sends
    ``Idempotency-Key`` and, when no complete answer came back after the
    request left, its effect is unknown; a ``read_only`` one simply failed
    (``rules.tools.call_effect``). The arguments were checked against the
    tool's schema by the caller."""
    external = effect_class == "external_effect"

    def result(end: str, error: str = "", **output: Any) -> ToolResult:
        return ToolResult(tool_rules.call_effect(end, effect_class), dict(output), error, external)

    if problem := _check_url(url, None):
        return result("not_sent", problem[1], request_sent=False)
    if err := _check_key(idempotency_key):
        return result("not_sent", err, request_sent=False)
    headers = {"User-Agent": _USER_AGENT, "Accept": "application/json"}
    if external:
        headers["Idempotency-Key"] = idempotency_key
    if token:
        headers["Authorization"] = f"Bearer {token}"
    content, params = None, None
    if method in ("GET", "DELETE"):
        params = {
            k: v if isinstance(v, str) else json.dumps(v, allow_nan=False)
            for k, v in arguments.items()
        }
    else:
        try:
            content = json.dumps(arguments, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            return result("not_sent", f"the arguments are not JSON: {exc}", request_sent=False)
        headers["Content-Type"] = "application/json"
    try:
        status, body, truncated = _exchange(
            method, url, headers=headers, content=content, params=params,
            timeout_s=timeout_s, transport=transport, resolver=resolver,
        )  # fmt: skip
    except outbound.OutboundRefused as exc:
        return ToolResult("refused", {"request_sent": False}, exc.reason, external)
    except _Interrupted as exc:
        return result(
            "no_answer",
            f"HTTP {exc.status} but the response was interrupted ({exc.reason})",
            status=exc.status, request_sent=True,
        )  # fmt: skip
    except httpx.TransportError as exc:
        if _sent_nothing(exc):
            return result(
                "not_sent",
                f"could not reach the tool ({type(exc).__name__}: {exc}); nothing was sent",
                request_sent=False,
            )
        return result(
            "no_answer",
            f"the request was sent but no complete answer came back ({type(exc).__name__}: {exc})",
            request_sent=True,
        )
    text = _decode(body)
    answer: Any = text
    if not truncated:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = text
    end = tool_rules.http_status_end(status)
    seen = {"status": status, "body": answer, "truncated": truncated, "request_sent": True}
    if end == "result":
        return result(end, **seen)
    if end == "tool_error":
        return result(end, f"the tool answered HTTP {status}", **seen)
    return result(end, f"HTTP {status} does not say whether the tool acted", **seen)


# ---------------------------------------------------------------------------
# registry and dispatch

ToolFunction = Callable[..., ToolResult]

TOOL_SPECS: dict[str, ToolSpec] = {
    "calculator": ToolSpec(
        name="calculator",
        description=(
            "Evaluate an arithmetic expression with numbers, + - * / // % ** and "
            "parentheses. No variables or functions."
        ),
        parameters={
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "maxLength": MAX_EXPRESSION_CHARS,
                    "description": "For example: (2 + 3) * 4 ** 2",
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    ),
    "kb_search": ToolSpec(
        name="kb_search",
        description=(
            "Search the knowledge base by words in title, body and tags. "
            "Returns the best-matching documents with a snippet."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": KB_MAX_QUERY_CHARS},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": KB_MAX_LIMIT,
                    "default": KB_DEFAULT_LIMIT,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    "webhook": ToolSpec(
        name="webhook",
        description=(
            "POST a JSON payload to an http(s) URL. This has an external effect; "
            "it is sent once with an idempotency key."
        ),
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "http or https URL"},
                "payload": {"type": "object", "description": "JSON body to send"},
            },
            "required": ["url", "payload"],
            "additionalProperties": False,
        },
    ),
}

TOOLS: dict[str, ToolFunction] = {
    "calculator": calculator,
    "kb_search": kb_search,
    "webhook": webhook,
}
EXTERNAL_TOOLS = tool_rules.BUILTIN_EXTERNAL_TOOLS
# How the executor of an external tool verifies an unknown effect (R6.4).
VERIFIERS: dict[str, ToolFunction] = {"webhook": verify_webhook}
# Options each tool accepts from the runner; others are not passed on.
_TOOL_OPTIONS: dict[str, frozenset[str]] = {
    "calculator": frozenset(),
    "kb_search": frozenset(),
    "webhook": frozenset({"timeout_s", "transport", "allowed_hosts", "resolver"}),
}


def run_tool(
    name: str, arguments: dict[str, Any], *, idempotency_key: str, **options: Any
) -> ToolResult:
    """Run the tool called ``name``; always returns a ToolResult (R4.1, R4.2).

    An unknown tool is "refused". An unexpected exception is "failed" for a
    local tool and "unknown" for an external one (it may have acted first).
    Options a tool does not take (e.g. ``timeout_s`` for the calculator) are
    ignored, so the runner can pass the same options to every tool.
    """
    tool = TOOLS.get(name)
    if tool is None:
        return ToolResult("refused", {}, f"there is no tool named {name!r}")
    effect_class = tool_rules.builtin_effect_class(name)
    external = effect_class == "external_effect"
    if not isinstance(arguments, dict):
        return _failed(f"{name} needs an object of arguments", external=external)
    accepted = {k: v for k, v in options.items() if k in _TOOL_OPTIONS[name]}
    try:
        return tool(arguments, idempotency_key=idempotency_key, **accepted)
    except Exception as exc:  # R4.2: a local failure never ends the run
        effect = tool_rules.uncertain_effect(effect_class)
        return ToolResult(effect, {}, f"{name} raised {type(exc).__name__}: {exc}", external)
