"""R6.3: what the lifecycle knows about one run (governance.rules.run_facts)."""

from __future__ import annotations

import pytest

from governance.rules.decision_table import next_path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.run_facts import Phase, RunFacts, record_fact
from governance.rules.transitions import apply_decision
from tests.governance.owner_facts import GOAL, tool_failed


@pytest.mark.parametrize(
    "build",
    [
        lambda: RunFacts(run_id="", goal=GOAL),
        lambda: RunFacts(run_id="r", goal=" "),
        lambda: RunFacts(run_id="r", goal=GOAL, facts=[tool_failed()]),  # type: ignore[arg-type]
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.FINALIZATION),
        lambda: RunFacts(run_id="r", goal=GOAL, finalization_from=0),
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.FINALIZATION, finalization_from=3),
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.SETTLED),
        lambda: RunFacts(run_id="r", goal=GOAL, phase="paused"),  # type: ignore[arg-type]
        lambda: RunFacts(run_id="r", goal=GOAL, recovery="ok"),  # type: ignore[arg-type]
        lambda: record_fact(RunFacts(run_id="r", goal=GOAL), "tool failed"),  # type: ignore[arg-type]
        lambda: next_path("run"),  # type: ignore[arg-type]
        lambda: apply_decision(RunFacts(run_id="r", goal=GOAL), "continue"),  # type: ignore[arg-type]
    ],
)
def test_r6_3_malformed_run_facts_are_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()
