"""Child processes (``ctp``, helper scripts) import this checkout's code.

The venv's ``ctp`` console script is an editable install that may point at another
checkout of the project; ``PYTHONPATH`` puts this one first (the editable finder only
answers what ``sys.path`` does not).
"""

from __future__ import annotations

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def with_this_checkout(env: dict[str, str]) -> dict[str, str]:
    path = [REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != REPO]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture
def subprocess_env(subprocess_env: dict[str, str]) -> dict[str, str]:
    return with_this_checkout(subprocess_env)
