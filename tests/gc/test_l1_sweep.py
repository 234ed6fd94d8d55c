"""The GC's L1 sweep (ctp_state/gc/l1_sweep.py) in whole GC runs behind the real gate, on both
backends: a new L1 file whose bytes are not the committed ones fails the gate, orphans of
crashed reconcilers are collected after the grace (never a file a live writer could
still commit), the watermark stays on a commit boundary, the periodic full sweep finds
what incremental sweeps cannot, and a name ctp never writes stops the run."""

from __future__ import annotations

import re

import pytest

from ctp_state import layout
from ctp_state.errors import CorruptData, GateFailed
from ctp_state.gc import l1_sweep as gc_l1, run_gc
from ctp_state.read import committed_l1_keys
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings
from tests.support import assert_exactly_once, key_id, plog, produce_rounds, space
from tests.support.gc import l0_epochs, reconciled


def test_a_damaged_l1_file_fails_the_l1_suite(store, gate):
    reconciled(store)
    key = committed_l1_keys(plog(store, "t", 1))[0][0]
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(store.get(key)))
    buf = io.BytesIO()
    pq.write_table(table.slice(0, table.num_rows - 1), buf)  # one offset lost
    store.put(key, buf.getvalue())
    before = l0_epochs(store)
    # Its bytes are not the ones committed (CRC32C), whatever else is wrong with it.
    with pytest.raises(GateFailed, match=r"l1_files: expect_column_values_to_be_in_set\(column=checksums_ok"):
        run_gc(store, gate=gate)
    assert l0_epochs(store) == before


def test_l1_orphans_of_a_crashed_reconciler_are_collected_after_the_grace(store, gate):
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    (committed,), _ = committed_l1_keys(plog(store, "t", 0))
    superseded = layout.l1_key("t", 0, 0, 9, key_id(store, "t"))  # a crashed run's smaller file over the same offsets
    beyond = layout.l1_key("t", 0, 20, 29, key_id(store, "t"))  # a file past the last reconciled offset
    store.put(superseded, store.get(committed))
    store.put(beyond, store.get(committed))
    young = run_gc(store, gate=gate)  # default grace: 1 h
    assert young.l1_orphans == 0 and young.l1_young_skipped == 1
    rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert rec.l1_orphans_deleted == 1
    assert store.head(superseded) is None
    assert store.head(beyond) is not None  # a live writer could still commit it
    assert store.head(committed) is not None
    assert_exactly_once(store, "t", sent)
    again = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert again.l1_partitions_unchanged == 1 and again.l1_listed == 0  # nothing new: no listing


def test_a_young_orphan_inside_a_committed_file_does_not_move_the_watermark_off_a_commit_boundary(store, gate):
    # Found by the soak (file seed 23): a crashed run split the offsets differently from
    # the run that committed them, so its young orphan starts inside a committed file.
    # The sweep set its watermark just before the orphan, inside that file; every later
    # gate then saw the committed file start before the watermark (I2 "not contiguous")
    # and refused the GC cluster-wide, for good.
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    (committed,), _ = committed_l1_keys(plog(store, "t", 0))
    first, last = gc_l1._range(committed)
    assert last > first
    orphan = layout.l1_key("t", 0, first + 1, last, key_id(store, "t"))  # starts inside the committed file
    store.put(orphan, store.get(committed))
    young = run_gc(store, gate=gate)  # default grace: the orphan is young and stays
    assert young.status == "ok" and young.l1_young_skipped == 1
    sent[0] += produce_rounds(store, partitions=1, rounds=1, per=5)[0]
    run_reconcile(store)
    later = run_gc(store, gate=gate)  # refused by the gate before the fix
    assert later.status == "ok" and later.gate.success
    swept = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert swept.status == "ok" and swept.l1_orphans_deleted == 1
    assert store.head(orphan) is None and store.head(committed) is not None
    assert_exactly_once(store, "t", sent)


def test_a_watermark_an_older_version_left_inside_a_committed_file_heals(store):
    # A store the watermark bug already wedged: W sits inside a committed file. The
    # sweep checks that file from its own start, so the gate's I2 row is consistent.
    produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    state = plog(store, "t", 0).read_state()
    (ref,) = state.committed_l1_files()
    assert ref.last > ref.first
    inp = gc_l1.SweepInput(
        "t",
        0,
        state.last_reconciled_offset,
        state.next_offset,
        swept_through=ref.first,
        swept_log_end=-1,
        committed=(ref,),
    )
    res = gc_l1.sweep_partition(store, inp, now_s=0, grace_s=0)
    (row,) = res.new_files
    assert row.first_offset == row.expected_first_offset == ref.first
    assert row.checksums_ok and res.swept_through == state.last_reconciled_offset


def test_an_orphan_written_behind_the_watermark_is_collected_by_the_periodic_full_sweep(store, gate):
    # A reconciler whose lease ran out writes its file after a GC's sweep moved the
    # watermark past the file's offsets: incremental sweeps start after the watermark,
    # so only a full sweep can ever see it.
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    first = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert first.l1_full_sweep is True  # no full sweep on record yet
    late = layout.l1_key("t", 0, 0, 4, key_id(store, "t"))  # the lapsed writer's file, behind the watermark
    (committed,), _ = committed_l1_keys(plog(store, "t", 0))
    store.put(late, store.get(committed))
    sent[0] += produce_rounds(store, partitions=1, rounds=1, per=5, advance=False)[0]  # the log moves
    incremental = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert incremental.l1_full_sweep is False and incremental.l1_orphans == 0
    assert store.head(late) is not None
    # Once the last full sweep is older than the period, the next run lists everything.
    full = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0, l1_full_sweep_s=0))
    assert full.l1_full_sweep is True and full.l1_orphans_deleted == 1
    assert store.head(late) is None and store.head(committed) is not None
    assert_exactly_once(store, "t", sent, all_in_l1=False)
    # The time of the full sweep carries forward: the default period (a day) is not due.
    after = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert after.l1_full_sweep is False and after.l1_full_sweep_ms == full.l1_full_sweep_ms


@pytest.mark.parametrize("name", ["00000000000000000005-00000000000000000003.parquet", "5-9.parquet"])
def test_a_key_under_l1_that_ctp_never_writes_stops_the_run_and_is_named(store, gate, name):
    """L1 names are parsed by layout.parse_l1_key alone: a name no reconciler writes (last
    before first, or not 20 digits) is never collected as an orphan; the run stops
    before any delete and names the key, as for L0."""
    reconciled(store)
    key = f"l1/{space(store)}/000000/{name}"
    store.put(key, b"not parquet")
    before = l0_epochs(store)
    with pytest.raises(CorruptData, match=re.escape(key)):
        run_gc(store, gate=gate, config=GcSettings(l1_full_sweep_s=0, l1_grace_s=0))
    assert l0_epochs(store) == before and store.head(key) is not None
