"""Planted bugs for the simulation's self-test. Every process of a planted run (workers,
``ctp`` runs, spark-submit and its Python workers) has this directory first on
``PYTHONPATH``, so Python imports this module at start-up and the bug named by
``CTP_SIM_PLANT`` is in all of them, as a bug in the code would be. Unset, it does nothing.
"""

import os

_PLANT = os.environ.get("CTP_SIM_PLANT")

if _PLANT == "lower_bound_plus_one":
    # R3 computed one epoch too high: a reconcile may commit a lower bound past the
    # previous applied epoch, so M can reach an epoch a placeholder may still use.
    from ctp_state import state as _sm

    _allowed = _sm.allowed_lower_bound

    def allowed_lower_bound(s, through_log_offset):  # type: ignore[no-untyped-def]
        return _allowed(s, through_log_offset) + 1

    _sm.allowed_lower_bound = allowed_lower_bound
elif _PLANT:
    raise SystemExit(f"unknown CTP_SIM_PLANT {_PLANT!r}")
