"""Issues 9.4 and 9.7: corrupt state is never trusted, and the GC deletes nothing while
any partition's state cannot be read.

Every state-log entry and snapshot carries a CRC32C; a snapshot is also checked for
self-consistency when it is loaded, and one that fails either check is set aside: the
state is rebuilt from the log, which is the truth. Reads start from the snapshot, as
the state does.
"""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData, CtpError
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.partition_log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from tests.support import key_id, l0_keys, plog, values


def three_epochs_unreconciled(store) -> PartitionLog:
    """t/0 with one unreconciled record at each of epochs 1, 2, 3; C = 4. Its lower
    bound is 1 (nothing reconciled), so M must stay 0."""
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(3):
            assert prod.write([(("t", 0), [Record(f"r{i}".encode())])])[0].accepted
            ce.advance()
    log = plog(store, "t", 0)
    st = log.read_state()
    assert (st.min_epoch_lower_bound, st.previous_applied_epoch, st.max_applied_epoch) == (1, 2, 3)
    log.write_snapshot(st)
    return log


def edit_json(store, key: str, old: str, new: str) -> None:
    data = store.get(key)
    assert old.encode() in data, data
    store.put(key, data.replace(old.encode(), new.encode(), 1))


def test_a_flipped_digit_in_a_snapshot_does_not_make_the_gc_delete_unreconciled_data(store, gate):
    three_epochs_unreconciled(store)
    before = l0_keys(store)
    # Lower bound 1 -> 2: still passes every gate rule (lower bound <= previous applied).
    edit_json(
        store, layout.snapshot("t", 0, key_id(store, "t")), '"min_epoch_lower_bound":1', '"min_epoch_lower_bound":2'
    )

    rec = run_gc(store, gate=gate)
    assert rec.m == 0
    assert l0_keys(store) == before
    assert values(store) == [b"r0", b"r1", b"r2"]


def test_a_forged_snapshot_with_a_valid_checksum_fails_its_consistency_check(store, gate):
    from ctp_state import codec

    three_epochs_unreconciled(store)
    before = l0_keys(store)
    key = layout.snapshot("t", 0, key_id(store, "t"))
    body = codec.unseal(store.get(key), key)
    body["min_epoch_lower_bound"] = 2  # a pending placeholder (epoch 1) is now below it
    store.put(key, codec.seal(body))

    rec = run_gc(store, gate=gate)
    assert rec.m == 0 and l0_keys(store) == before
    assert values(store) == [b"r0", b"r1", b"r2"]


def test_a_json_valid_edit_of_a_pending_entry_is_caught_and_the_gc_deletes_nothing(store, gate):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(2):
            ce.advance()
            assert prod.write([(("t", 0), [Record(f"r{i}-{j}".encode()) for j in range(10)])])[0].accepted
    run_reconcile(store)  # lower bound moves, L0 garbage exists
    for _ in range(2):
        ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        ce.advance()
        assert prod.write([(("t", 0), [Record(f"late-{j}".encode()) for j in range(10)])])[0].accepted
    log = plog(store, "t", 0)
    last = log.read_state().applied_offset
    entry_key = layout.log_entry("t", 0, last, key_id(store, "t"))
    epoch = json.loads(store.get(entry_key))["epoch"]
    # Epoch 6 -> 2: JSON-valid, and R2 would now reject the entry: ten acknowledged
    # records would vanish from every read.
    edit_json(store, entry_key, f'"epoch":{epoch}', '"epoch":2')
    before = l0_keys(store)

    with pytest.raises(CorruptData) as err:
        read_partition(store, "t", 0)
    assert entry_key in str(err.value)
    with pytest.raises(CtpError, match=entry_key):
        run_gc(store, gate=gate)
    assert l0_keys(store) == before


def one_record_per_epoch(store, rounds: int, partitions: int = 1) -> ClusterEpoch:
    """Topic t; ``rounds`` times: advance C, then one record ``r<i>`` to each partition."""
    create_topic(store, "t", partitions)
    ce = ClusterEpoch(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(rounds):
            ce.advance()
            for v in prod.write([(("t", p), [Record(f"r{i}".encode())]) for p in range(partitions)]):
                assert v.accepted
    return ce


def test_a_garbage_entry_covered_by_the_snapshot_does_not_stop_reads(store):
    one_record_per_epoch(store, 3)
    run_reconcile(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"pending")])])[0].accepted
    log = plog(store, "t", 0)
    log.write_snapshot(log.read_state())
    store.put(layout.log_entry("t", 0, 1, key_id(store, "t")), b"\x00garbage")  # an old placeholder, covered

    assert plog(store, "t", 0).read_state().next_offset == 4  # the state reads
    assert values(store) == [b"r0", b"r1", b"r2", b"pending"]  # and so does `ctp read`


def test_a_corrupt_newest_entry_stops_the_gc_even_with_a_fresh_summary(store, gate):
    ce = one_record_per_epoch(store, 3, partitions=2)
    ce.advance()
    ce.advance()
    run_reconcile(store)  # a fresh summary: every partition reconciled, M can move
    # The reconciler left a snapshot at its release (what it covers is read from the
    # snapshot, as any covered entry); a write after it is an entry the GC must read.
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 1), [Record(b"after the reconcile")])])[0].accepted
    end = plog(store, "t", 1).read_state().applied_offset
    assert plog(store, "t", 1).read_snapshot().applied_offset < end
    newest = layout.log_entry("t", 1, end, key_id(store, "t"))
    store.put(newest, store.get(newest)[:-7] + b"garbage")
    before = l0_keys(store)

    with pytest.raises(CtpError, match=newest):
        run_gc(store, gate=gate)
    assert l0_keys(store) == before
    # The run is on record, with the partition that stopped it.
    from ctp_state.gc.history import GcHistory

    last = GcHistory(store).tail(1)[0]
    assert last.status == "failed" and newest in last.error


def test_l1_files_are_read_through_the_snapshot_too(store):
    """The committed L1 files come from the state (snapshot + tail), not a replay."""
    one_record_per_epoch(store, 2)
    run_reconcile(store)
    log = plog(store, "t", 0)
    st = log.read_state()
    log.write_snapshot(st)
    # Every entry unreadable but the one the snapshot ends at (a reader checks it holds
    # the bytes the snapshot names): only the snapshot is left to say what is committed.
    for off in range(st.applied_offset):
        store.put(layout.log_entry("t", 0, off, key_id(store, "t")), b"{}")
    rows = read_partition(store, "t", 0)
    assert rows.column("value").to_pylist() == [b"r0", b"r1"]
    (key,) = [o.key for o in store.list(layout.L1_ROOT)]
    assert pq.read_metadata(io.BytesIO(store.get(key))).num_rows == 2
