"""Fixtures for the second adversarial round: re-export the first round's."""

from __future__ import annotations

from tests.attack.conftest import LostResponses, fstore, gate  # noqa: F401

__all__ = ["LostResponses", "fstore", "gate"]
