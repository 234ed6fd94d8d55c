"""Fixtures of the L1 lifecycle tests: a gate of the plain-Python backstop only (the
random walks run many GCs; the GX gate is tested on its own)."""

from __future__ import annotations

import pytest

from ctp_state.gc.prepare import GateResult


@pytest.fixture
def plain_gate():
    return lambda frames: GateResult(True, [])
