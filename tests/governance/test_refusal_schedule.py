"""R3.2 (issue 12): a re-probe schedule other than the default, validated."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance.rules.refusal import (
    MAX_SCHEDULE_TIERS,
    REFUSAL_REPROBE_DELAYS,
    REFUSAL_SCOPE_TTL,
    RefusalError,
    check_schedule,
)

MIN = timedelta(minutes=1)


def test_r3_2_the_default_schedule_is_a_valid_schedule():
    assert check_schedule(REFUSAL_REPROBE_DELAYS) == REFUSAL_REPROBE_DELAYS
    assert check_schedule([MIN]) == (MIN,)
    assert check_schedule([MIN * n for n in range(1, MAX_SCHEDULE_TIERS + 1)])[-1] == 5 * MIN


@pytest.mark.parametrize(
    ("delays", "words"),
    [
        ((), "1 to 5 re-probes, not 0"),
        (tuple(MIN * n for n in range(1, 7)), "1 to 5 re-probes, not 6"),
        ((10 * MIN, 10 * MIN), "re-probe 2's delay must be longer than re-probe 1's"),
        ((MIN, 3 * MIN, 2 * MIN), "re-probe 3's delay must be longer than re-probe 2's"),
        ((MIN, REFUSAL_SCOPE_TTL + MIN), "the last delay must be at most 6 h"),
        ((timedelta(0),), "positive"),
        ((-MIN, MIN), "positive"),
        (("15m",), "positive"),
    ],
)
def test_r3_2_a_bad_schedule_is_refused_in_plain_words(delays, words):
    with pytest.raises(RefusalError, match=words):
        check_schedule(delays)
