"""Fixtures for the adversarial tests: a plain file store (the cheap backend) and the
real GX gate from tests/safety."""

from __future__ import annotations

import pytest

from ctp_state.storage import open_store
from tests.safety.conftest import LostResponses, gate


@pytest.fixture
def fstore(tmp_path):
    """A file store only: for scenarios with hundreds of appends."""
    return open_store(f"file://{tmp_path}/store", {})


__all__ = ["LostResponses", "fstore", "gate"]
