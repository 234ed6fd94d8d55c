"""The operator's status of a partition (ctp_state.gc.safe_epoch.partition_status): pure, worst
first, and named with what the operator acts on (the L0 key, the claim's owner and
lease end, the lag)."""

from __future__ import annotations

from ctp_state.entries import AccessMode
from ctp_state.gc.safe_epoch import PARTITION_STATUSES, partition_status
from ctp_state.state import Holder, PartitionState, Pending
from ctp_state.tick_schedule import due_epoch

NOW = 1_800_000_000_000
C = 10


def state(lb: int | None = C, pending: int = 0, holders: tuple[Holder, ...] = ()) -> PartitionState:
    return PartitionState(
        "orders",
        3,
        max_applied_epoch=C,
        previous_applied_epoch=C,
        min_epoch_lower_bound=lb,
        holders=holders,
        pending=tuple(Pending(i, 7, f"l0/001/{7:018d}/x{i}.l0", 0, 100, 5, 0, i * 5) for i in range(pending)),
    )


def test_a_partition_at_c_minus_1_with_no_lag_is_caught_up():
    st = partition_status(state(lb=C), C, now_ms=NOW)
    assert (st.status, st.detail, st.rank) == ("caught up", None, PARTITION_STATUSES.index("caught up"))


def test_a_partition_whose_lower_bound_trails_is_idle_and_says_until_when():
    st = partition_status(state(lb=C - 2), C, now_ms=NOW)
    assert st.status == "idle" and "M(p)=7 < C-1=9" in st.detail and "once it trails C by its idle_lag" in st.detail


def test_an_idle_partitions_status_names_the_epoch_the_reconciler_advances_it_at():
    """As the GC's holdback reason does: from the newest reconcile's settings (its
    ``idle_lag`` and whether ticks are spread), the epoch C must reach."""
    lb = C - 2
    for spread in (False, True):
        due = due_epoch("orders", 3, lb, 6, spread=spread)
        assert lb < due <= lb + 6
        for c in (C, due - 1, due, due + 1):
            st = partition_status(state(lb=lb), c, now_ms=NOW, idle_lag=6, ticks_spread=spread)
            assert st.status == "idle" and f"M(p)={lb - 1} < C-1={c - 1}" in st.detail, st
            if c >= due:
                assert "the next reconcile advances it" in st.detail, (spread, c, st)
            else:
                assert f"a reconcile advances it once C reaches {due}" in st.detail, (spread, c, st)
            assert ("at its phase" in st.detail) == (spread and due < lb + 6), (spread, c, st)


def test_lag_is_counted_in_placeholders_records_and_bytes():
    st = partition_status(state(lb=C - 3, pending=2), C, now_ms=NOW)
    assert st.status == "lagging" and st.detail == "2 placeholders, 10 records, 200 bytes not in L1"


def test_a_held_claim_names_its_owner_and_lease_end_and_a_lapsed_one_says_so():
    live = Holder("reconciler-a", AccessMode.EXCLUSIVE, 4, NOW + 60_000)
    st = partition_status(state(pending=1, holders=(live,)), C, now_ms=NOW)
    assert st.status == "claim held" and st.detail.startswith("reconciler-a (exclusive), lease until 2027-01-15")
    lapsed = Holder("reconciler-b", AccessMode.SHARED, 5, NOW - 1)
    st = partition_status(state(holders=(lapsed,)), C, now_ms=NOW)
    assert st.status == "claim held" and "reconciler-b (shared), lease ran out at" in st.detail


def test_quarantine_outranks_everything_and_names_the_l0_key():
    held = Holder("r", AccessMode.EXCLUSIVE, 4, NOW + 1)
    q = {("orders", 3): ("l0/002/000000000000000007/bad.l0", "chunk CRC32C mismatch")}
    st = partition_status(state(pending=3, holders=(held,)), C, now_ms=NOW, quarantined=q)
    assert st.status == "quarantined" and st.detail == "L0 key l0/002/000000000000000007/bad.l0: chunk CRC32C mismatch"
    assert st.rank == 0
    other = {("orders", 4): ("k", "why")}
    assert partition_status(state(), C, now_ms=NOW, quarantined=other).status == "caught up"
