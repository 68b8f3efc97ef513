"""How the lifecycle names a provider failure (R2.1, R6.2).

The transient classes a retry may repair, the ``interrupted`` stream, the
short label a page shows for each class and the words a decision's reason
uses. Pure: no I/O, no clock.
"""

from __future__ import annotations

from governance.rules.classification import TIME_BASED_CLASSES

# R2.1: the classes that time repairs (one set with the health rule). Refusal
# (R3), auth and bad_request are not transient.
TRANSIENT_FAILURE_CLASSES = TIME_BASED_CLASSES
# R6.2: a stream that broke after its headers with no clock run out. A model
# request has no external effect, so the turn may be retried like a transient
# failure, but it is named for what it is: not a timeout, not a network failure.
INTERRUPTED = "interrupted"
RETRYABLE_FAILURE_CLASSES = TRANSIENT_FAILURE_CLASSES | {INTERRUPTED}

# The short name of a failure class where a page lists facts (R6.2).
FAILURE_LABELS = {
    INTERRUPTED: "interrupted (effect unknown)",
    "network": "network failure",
    "timeout": "provider timeout",
    "rate_limited": "rate limited",
    "server_error": "provider error",
}


def failure_label(failure_class: str) -> str:
    return FAILURE_LABELS.get(failure_class, failure_class.replace("_", " "))


# How the lifecycle's reasons name a provider failure (R6.2: words from the facts).
FAILURE_WORDS = {
    INTERRUPTED: (
        "the provider's stream broke off after its headers before any clock ran out "
        "(interrupted: the request may have been served, effect unknown)"
    ),
    "network": "the provider could not be reached (network)",
    "timeout": "the provider did not answer in time (timeout)",
    "rate_limited": "the provider is rate limiting (rate_limited)",
    "server_error": "the provider failed on its side (server_error)",
}
