"""The provider kinds: the one list every layer takes them from.

A kind is a wire protocol the runtime speaks. Its adapter (the client of that
protocol, which reads its vendor's answer into evidence, R2.4) is a module of
``tasks/adapters/``, whose registry maps each kind named here to it and checks
at import that the two name the same kinds. What the facts need to know of a
kind is here: its label and what configuration it takes (a server's base URL
and key, or a script). The model's choices, the API's schema, ``manage.py
provider`` and the service's checks all read this list, so adding a kind is
its adapter's module, its registry entry and its line here.

Pure, like ``governance/rules/``: no Django, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["KINDS", "ProviderKind", "choices", "kind", "names"]


@dataclass(frozen=True)
class ProviderKind:
    """One provider kind: ``takes`` says what its configuration holds.

    ``"server"``: an http(s) base URL and, optionally, the name of the
    environment variable holding its key; no script. ``"script"``: a script
    (its adapter validates it), no base URL and no key.
    """

    name: str
    label: str
    takes: Literal["server", "script"]

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier() or len(self.name) > 16:
            raise ValueError(f"a provider kind is a short identifier, got {self.name!r}")
        if self.takes not in ("server", "script"):
            raise ValueError(f"takes must be 'server' or 'script', got {self.takes!r}")

    @property
    def has_server(self) -> bool:
        return self.takes == "server"

    @property
    def has_script(self) -> bool:
        return self.takes == "script"


# The kinds, in the order people see them. Tests may add one for a while
# (every reader below looks the list up when it is asked).
KINDS: dict[str, ProviderKind] = {
    spec.name: spec
    for spec in (
        ProviderKind("openai", "OpenAI-compatible chat completions", "server"),
        ProviderKind("anthropic", "Anthropic messages", "server"),
        ProviderKind("scripted", "Scripted (deterministic)", "script"),
    )
}


def names() -> tuple[str, ...]:
    """Every kind's name, in order."""
    return tuple(KINDS)


def kind(name: str) -> ProviderKind | None:
    """The kind called ``name``, or None when there is none."""
    return KINDS.get(name) if isinstance(name, str) else None


def choices() -> list[tuple[str, str]]:
    """(name, label) pairs, as a model field's ``choices`` takes them."""
    return [(spec.name, spec.label) for spec in KINDS.values()]
