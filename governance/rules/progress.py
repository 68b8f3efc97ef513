"""R4.4: the no-progress rule.

A model turn is classified by the business progress it made: a valid tool
call or a deliverable body is progress; a turn with neither ends the run
honestly (the decision table settles it with ``NO_ANSWER_TEXT``). Pure: no
I/O, no clock.
"""

from __future__ import annotations

from governance.rules._checks import is_int
from governance.rules.authority import FactKind
from governance.rules.lifecycle_input import LifecycleError

NO_ANSWER_TEXT = (
    "No answer was produced: the model turn returned neither a deliverable body nor a "
    "valid tool call, so the run ended here."
)


def classify_turn(deliverable_body: str, valid_tool_calls: int) -> FactKind:
    """R4.4: classify a model turn by the business progress it made.

    Only a deliverable body or a valid tool call is progress; reasoning
    fragments, usage events and heartbeats are not (R6.1) and are not inputs.
    """
    if not isinstance(deliverable_body, str):
        raise LifecycleError("deliverable_body must be a string (empty when there is none)")
    if not is_int(valid_tool_calls) or valid_tool_calls < 0:
        raise LifecycleError("valid_tool_calls must be an int >= 0")
    if valid_tool_calls > 0:
        return FactKind.TURN_CALLED_TOOLS
    if deliverable_body.strip():
        return FactKind.TURN_ANSWERED
    return FactKind.TURN_WITHOUT_PROGRESS
