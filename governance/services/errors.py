"""Errors a service raises for bad input (the API answers 4xx with the field)."""

from __future__ import annotations


class ServiceError(ValueError):
    """Bad input to a service: ``field`` names what is wrong (API answers 4xx)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class BoundaryConflict(ServiceError):
    """The segment the operator looked at was closed meanwhile (answer 409)."""


class RunSettled(ServiceError):
    """A stop asked of a run that already settled (R6.5: answer 409)."""
