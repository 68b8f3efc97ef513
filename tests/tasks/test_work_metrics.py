"""What the work counts reaches GET /metrics in one process: provider
attempts by outcome and the stages' clocks as histograms
(tests/tasks/test_work_metrics_processes.py: added up over processes)."""

from __future__ import annotations

import pytest

from tests.dashboard import test_metrics as metrics_endpoint
from tests.dashboard.test_metrics import scrape

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}
scraping = metrics_endpoint.scrape_settings  # its fixture: the scrape's token


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_one_process_counts_attempts_and_the_stage_clocks(
    client, api, worker, manual_clock, scripted_provider, scraping
):
    scripted_provider("p", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["p"]}, expect=201).json()
    before = scrape(client)
    api.run_and_wait(thread["id"], "Hello")
    after = scrape(client)
    attempts = ("governance_provider_attempts_total", {"provider": "p", "outcome": "accepted"})
    assert value(after, attempts[0], **attempts[1]) == value(before, attempts[0], **attempts[1]) + 1
    queue = {"stage_kind": "model_turn", "clock": "queue", "timeout": "none"}
    assert value(after, "governance_stage_clock_seconds_count", **queue) > value(
        before, "governance_stage_clock_seconds_count", **queue
    )


def delta(before, after, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_genai_metrics_cost_and_refusal_sends_by_tier(
    client, api, worker, manual_clock, scripted_provider, scraping
):
    """OpenTelemetry's GenAI client metrics under their Prometheus names, what the
    requests cost by provider, the overall deadline's clock and the refusal
    protocol's sends by tier (R3.1, R3.2), counted once their tier is decided."""
    from decimal import Decimal

    from tasks.jobs import tier_attempts

    scripted_provider("shy", {"default": {"refuse": {"category": "policy"}}})
    able = scripted_provider("able", {"default": {"answer": {"text": "It is 42.", "chunks": 2}}})
    able.price_input_per_mtok, able.price_output_per_mtok = Decimal(1_000_000), Decimal(2_000_000)
    able.currency = "EUR"
    able.save()
    thread = api.post("/api/v1/threads", {"provider_chain": ["shy", "able"]}, expect=201).json()
    before = scrape(client)
    api.run_and_wait(thread["id"], "Hello there")
    tier_attempts()
    manual_clock.advance(minutes=16)  # R3.2: the first re-probe is due
    api.run_and_wait(thread["id"], "Hello again")
    tier_attempts()
    after = scrape(client)

    chat = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "able",
        "gen_ai_request_model": "able-model",
        "gen_ai_response_model": "able-model",
    }
    duration = "gen_ai_client_operation_duration_seconds_count"
    assert delta(before, after, duration, **chat, error_type="") == 2
    refused = {**chat, "gen_ai_provider_name": "shy", "gen_ai_request_model": "shy-model",
               "gen_ai_response_model": "shy-model"}  # fmt: skip
    assert delta(before, after, duration, **refused, error_type="refusal") == 2
    tokens = "gen_ai_client_token_usage_sum"
    assert delta(before, after, tokens, **chat, gen_ai_token_type="output") == 2 * 3  # "It is 42."
    assert delta(before, after, tokens, **chat, gen_ai_token_type="input") > 0
    first_chunk = "gen_ai_client_operation_time_to_first_chunk_seconds_count"
    assert delta(before, after, first_chunk, **chat) == 2

    # 1 EUR per input token and 2 per output token: the usage, priced.
    spent = delta(before, after, "governance_provider_cost_total", provider="able", currency="EUR")
    output_tokens = delta(before, after, tokens, **chat, gen_ai_token_type="output")
    input_tokens = delta(before, after, tokens, **chat, gen_ai_token_type="input")
    assert spent == pytest.approx(input_tokens + 2 * output_tokens)
    assert delta(before, after, "governance_provider_cost_total", provider="shy", currency="-") == 0

    sends = "governance_refusal_sends_total"
    assert delta(before, after, sends, provider="shy", tier="original") == 1
    assert delta(before, after, sends, provider="shy", tier="re_probe_1") == 1
    assert delta(before, after, sends, provider="able", tier="original") == 0
    deadline = {"stage_kind": "model_turn", "clock": "deadline_remaining", "timeout": "none"}
    assert delta(before, after, "governance_stage_clock_seconds_count", **deadline) == 2


def test_a_spent_ledger_is_counted_by_resource(
    client, api, worker, manual_clock, scripted_provider, scraping
):
    """R5: a draw the run's ledger refuses counts as an exhaustion of its resource."""
    scripted_provider("p", {"default": {"refuse": {"category": "policy"}}})
    scripted_provider("q", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["p", "q"]}, expect=201).json()
    before = scrape(client)
    run = api.run_and_wait(thread["id"], "Hello", budget={"model_requests": 1})
    after = scrape(client)
    assert run["settlement"]["outcome"] != "completed"
    exhausted = "governance_ledger_exhaustions_total"
    assert delta(before, after, exhausted, resource="model_requests") >= 1
    assert delta(before, after, exhausted, resource="tool_calls") == 0


def test_a_spent_tool_call_budget_is_counted_too(
    client, api, worker, manual_clock, scripted_provider, scraping
):
    """R5: the second of two calls in a turn, with one tool call in the budget."""
    two_calls = [
        {"name": "calculator", "arguments": {"expression": "1+1"}},
        {"name": "calculator", "arguments": {"expression": "2+2"}},
    ]
    scripted_provider(
        "p",
        {
            "rules": [{"when": {"last_role_not": "tool"}, "tool_call": two_calls}],
            "default": {"answer": {"text": "Done."}},
        },
    )
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": ["calculator"]}, expect=201
    ).json()
    before = scrape(client)
    api.run_and_wait(thread["id"], "Add", budget={"tool_calls": 1})
    after = scrape(client)
    exhausted = "governance_ledger_exhaustions_total"
    assert delta(before, after, exhausted, resource="tool_calls") == 1
