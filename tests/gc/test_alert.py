"""The M-stall alert rule (pure): when it fires, when it must not, and what it names."""

from __future__ import annotations

from ctp_state.gc.alert import m_alert
from ctp_state.records import GcRecord, HeldBy


def run(seq: int, m: int | None, c: int, status: str = "ok") -> GcRecord:
    return GcRecord(
        seq=seq, run_id=f"r{seq}", status=status, started_ms=seq, finished_ms=seq, seconds=0, m=m, cluster_epoch=c
    )


HELD = (
    HeldBy(topic="orders", partition=3, m=5, reasons=("claim held by reconciler:dead (exclusive) until 99 ms",)),
    HeldBy(topic="orders", partition=4, m=5, reasons=("reconciler lag: 2 placeholders, 10 records, 900 bytes",)),
)


def alert(previous, m, c, held=HELD, quarantined=None, runs=3, epochs=3):
    return m_alert(
        m=m,
        cluster_epoch=c,
        held_by=held,
        quarantined=quarantined or {},
        previous=previous,
        stall_runs=runs,
        stall_epochs=epochs,
    )


def test_a_healthy_history_raises_nothing():
    # M follows C at the idle lag: never the same twice
    previous = [run(i, i + 1, i + 3) for i in range(10)]
    assert alert(previous, 11, 13) is None


def test_m_unchanged_over_n_runs_while_c_moved_k_is_a_stall_naming_partitions_and_reasons():
    previous = [run(0, 4, 6), run(1, 5, 7), run(2, 5, 8)]
    a = alert(previous, 5, 10)
    assert a is not None and a.kind == "stall"
    assert a.where == ("orders/3", "orders/4")
    assert "M stalled at 5 for 3 GC runs while C advanced 7 -> 10" in a.message
    assert "orders/3: claim held by reconciler:dead" in a.message and "orders/4: reconciler lag" in a.message


def test_not_yet_a_stall():
    previous = [run(0, 4, 6), run(1, 5, 7), run(2, 5, 8)]
    assert alert(previous, 5, 9) is None  # C advanced only 2 over the three runs
    assert alert(previous[-1:], 5, 12) is None  # only two runs at M = 5
    assert alert(previous, 6, 12) is None  # M moved
    assert alert(previous, 5, 12, runs=0) is None  # the rule is off


def test_runs_that_did_not_pass_the_gate_do_not_count_either_way():
    previous = [run(0, 5, 6), run(1, None, 7, "failed"), run(2, 9, 8, "gate_failed"), run(3, 5, 8)]
    a = alert(previous, 5, 9)
    assert a is not None and "C advanced 6 -> 9" in a.message


def test_a_dry_run_counts_as_a_run():
    previous = [run(0, 5, 6, "dry_run"), run(1, 5, 7, "dry_run")]
    assert alert(previous, 5, 9) is not None


def test_a_quarantine_alerts_at_once_even_with_the_stall_rule_off():
    q = {("orders", 7): ("l0/001/000000000000000004/abc.l0", "CRC32C mismatch"), ("orders", 2): (None, "not found")}
    a = alert([], 5, 6, quarantined=q, runs=0)
    assert a is not None and a.kind == "quarantine" and a.where == ("orders/2", "orders/7")
    assert a.message.startswith("2 partition(s) quarantined")
    assert "orders/7: CRC32C mismatch (L0 key l0/001/000000000000000004/abc.l0)" in a.message


def test_extra_gc_runs_without_an_advance_do_not_hide_a_stall():
    previous = [run(0, 4, 6), run(1, 5, 7), run(2, 5, 8), run(3, 5, 10), run(4, 5, 10), run(5, 5, 10)]
    a = alert(previous, 5, 10, runs=4, epochs=3)
    assert a is not None and "for 6 GC runs while C advanced 7 -> 10" in a.message


def test_an_idle_lag_longer_than_the_stall_epochs_is_waited_out():
    # idle_lag 4, every partition ticked at C=5: M stays 5 for the runs at C=5..8 (four
    # runs, C moved three) -- each partition's next tick is due at C=9. Healthy.
    previous = [run(0, 5, 5), run(1, 5, 6), run(2, 5, 7)]
    args = {"held_by": HELD, "quarantined": {}, "previous": previous, "stall_runs": 4, "stall_epochs": 3}
    assert m_alert(m=5, cluster_epoch=8, **args, idle_lag=4) is None
    assert m_alert(m=5, cluster_epoch=8, **args, idle_lag=2) is not None  # (the default lag: a stall)
    # still flat one epoch after the tick was due: a stall, as with any lag
    longer = {**args, "previous": [*previous, run(3, 5, 8)]}
    assert m_alert(m=5, cluster_epoch=9, **longer, idle_lag=4).kind == "stall"
