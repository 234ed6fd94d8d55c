"""Retention and DeleteRecords (R11, I7): the start offset moves forward through the
state log with Kafka's meaning; readers stop at it; the table and the store follow; the
GC's gate lets a dropped file go only if something allows it."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from ctp_state import layout
from ctp_state.compact import run_compaction
from ctp_state.entries import AccessMode, Trim, TrimReason
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ConfigError, OffsetBeforeStart
from ctp_state.gc import run_gc
from ctp_state.incarnations import read_name, set_retention, tombstone
from ctp_state.l0 import Record
from ctp_state.partition_state import L1Ref
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.retention import delete_records, plan_trim, run_retention
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic
from tests.support import ctp, plog, reconcile
from tests.support.table import READERS, committed, do_publish, sortable, table_of

NOW = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)
HOUR = 3_600_000
T0 = int(time.time() * 1000) - 10 * HOUR  # the records' clock: ten hours ago


def timed_rounds(store, stamps, partitions=2, per=5, topic="t"):
    """One reconciled round (one L1 file per partition) per timestamp in ``stamps``."""
    create_topic(store, topic, partitions, exist_ok=True)
    sent = {p: [] for p in range(partitions)}
    for r, ts in enumerate(stamps):
        ClusterEpoch(store).advance()
        with Producer(store, epoch_ttl_s=0) as prod:
            chunks = [
                ((topic, p), [Record(f"r{r}-{p}-{i}".encode(), None, ts + i) for i in range(per)])
                for p in range(partitions)
            ]
            for v, (_, recs) in zip(prod.write(chunks), chunks):
                assert v.accepted, v.error
                sent[v.partition] += recs
        reconcile(store, topics=[topic])
    return sent


def offsets(store, topic="t", p=0, **kw):
    return [r["offset"] for r in read_partition(store, topic, p, **kw).to_pylist()]


# --- the plan, pure ----------------------------------------------------------------------


def refs(n):
    return [L1Ref(f"k{i}", 10 * i, 10 * i + 9, None) for i in range(n)]


def test_time_retention_drops_the_oldest_files_whose_newest_record_is_older_than_it():
    newest = {"k0": 100, "k1": 200, "k2": 900, "k3": 300}.get
    got = plan_trim(refs(4), {}, lambda f: newest(f.key), now_ms=1000, retention_ms=750, retention_bytes=None)
    assert got == (20, TrimReason.RETENTION_MS)  # k2 stays, and so does k3 behind it (oldest first)
    assert plan_trim(refs(4), {}, lambda f: None, now_ms=1000, retention_ms=1, retention_bytes=None) is None


def test_size_retention_keeps_at_least_the_bound_and_at_most_one_file_more():
    sizes = {f"k{i}": 100 for i in range(5)}
    got = plan_trim(refs(5), sizes, lambda f: None, now_ms=0, retention_ms=None, retention_bytes=250)
    assert got == (20, TrimReason.RETENTION_BYTES)  # 300 bytes stay: >= 250, < 250 + one file
    assert plan_trim(refs(5), sizes, lambda f: None, now_ms=0, retention_ms=None, retention_bytes=500) is None


# --- the topic's retention, in its history ------------------------------------------------


def test_retention_is_a_record_of_its_own_and_a_new_incarnation_starts_without_it(store):
    create_topic(store, "t", 1)
    _, changed = set_retention(store, "t", HOUR, None)
    assert changed and read_name(store, "t").retention_ms == HOUR
    assert set_retention(store, "t", HOUR, None)[1] is False  # unchanged: nothing written
    set_retention(store, "t", None, 1000)
    st = read_name(store, "t")
    assert (st.retention_ms, st.retention_bytes, st.next_seq) == (None, 1000, 2)
    tombstone(store, "t")
    create_topic(store, "t", 1)
    assert (read_name(store, "t").retention_ms, read_name(store, "t").retention_bytes) == (None, None)
    with pytest.raises(ConfigError, match="positive integer"):
        set_retention(store, "t", 0, None)


# --- applying it -------------------------------------------------------------------------


def test_time_retention_drops_whole_old_files_and_keeps_every_younger_record(store):
    sent = timed_rounds(store, [T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR])
    set_retention(store, "t", 90 * 60_000, None)  # 1.5 h
    summary = run_retention(store, now_ms=T0 + 3 * HOUR + 1000)
    assert summary.count("trimmed") == 2, summary.as_dict()
    for p in sent:
        st = plog(store, "t", p).read_state()
        assert st.start_offset == 10 and len(st.l1_ends) == 2  # the two oldest files went, whole
        assert offsets(store, "t", p) == list(range(10, 20))
        assert [r["value"] for r in read_partition(store, "t", p).to_pylist()] == [r.value for r in sent[p][10:]]
    with pytest.raises(OffsetBeforeStart, match="start offset 10"):
        read_partition(store, "t", 0, 3)
    assert offsets(store, "t", 0, from_offset=3, from_start=True) == list(range(10, 20))
    assert run_retention(store, now_ms=T0 + 3 * HOUR + 2000).count("trimmed") == 0  # nothing more yet


def test_size_retention_keeps_a_partition_within_its_bound_plus_one_file(store):
    timed_rounds(store, [T0 + i for i in range(6)], partitions=1)
    sizes = {o.key: o.size for o in store.list(layout.L1_ROOT)}
    one = max(sizes.values())
    set_retention(store, "t", None, 2 * one)
    run_retention(store)
    st = plog(store, "t", 0).read_state()
    kept = sum(sizes[f.key] for f in st.committed_l1_files())
    assert 2 * one <= kept < 3 * one + one  # >= the bound, < the bound plus one file
    assert st.start_offset == st.l1_first > 0


def test_delete_records_moves_the_start_inside_a_file_and_never_past_l1(store):
    timed_rounds(store, [T0, T0 + 1], partitions=1)
    r = delete_records(store, "t", 0, 7)
    assert (r.start_before, r.start_after, r.files_dropped) == (0, 7, 1)
    assert offsets(store) == [7, 8, 9]  # the file of 5-9 stays; 5 and 6 are not read
    assert delete_records(store, "t", 0, 3).status == "kept"  # backwards: nothing
    with pytest.raises(ConfigError, match="past what is in L1"):
        delete_records(store, "t", 0, 11)


def test_the_cli_sets_retention_applies_it_and_deletes_records(store, subprocess_env):
    env = subprocess_env
    r = ctp(env, "topic", "create", "t", "-p", "1", "--retention-bytes", "1")
    assert r.returncode == 0, r.stderr
    assert read_name(store, "t").retention_bytes == 1
    r = ctp(env, "topic", "alter", "t", "--retention-ms", "60000", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["retention_bytes"] == 1, r.stderr
    r = ctp(env, "topic", "alter", "t", "--retention-bytes", "none", "--retention-ms", "zero")
    assert r.returncode == 2 and "--retention-ms" in r.stderr
    timed_rounds(store, [T0, T0 + 1, T0 + 2], partitions=1)
    r = ctp(env, "retention", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["partitions"][0]["status"] == "planned", r.stdout
    r = ctp(env, "retention")  # every record is hours older than retention.ms: every file goes
    assert r.returncode == 0, r.stderr
    assert plog(store, "t", 0).read_state().start_offset == 15
    r = ctp(env, "read", "t", "0", "--from", "2")
    assert r.returncode == 1 and "start offset 15" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = ctp(env, "delete-records", "t", "0", "99")
    assert r.returncode == 1 and "reconcile first" in r.stderr


# --- the GC's gate ---------------------------------------------------------------------


def test_the_gc_deletes_what_retention_dropped_and_the_table_follows(fstore, catalogs, gate, tmp_path):
    config, store = catalogs, fstore
    timed_rounds(store, [T0, T0 + HOUR, T0 + 2 * HOUR])
    do_publish(store, config, tmp_path)
    set_retention(store, "t", HOUR // 2, None)
    run_retention(store, now_ms=T0 + 2 * HOUR + 10)
    dropped = {f"{k}" for k in (o.key for o in store.list(layout.L1_ROOT))} - {
        f.key for p in range(2) for f in plog(store, "t", p).read_state().committed_l1_files()
    }
    assert len(dropped) == 4
    pub = do_publish(store, config, tmp_path)
    assert pub.files_removed == 4 and pub.files_added == 0
    table = table_of(store, config, tmp_path)
    for name, read in READERS.items():
        assert sortable(read(table, store)).equals(committed(store, 2)), name
    hook = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    run_gc(store, gate=gate, config=NOW, tables=hook)  # expires the snapshots naming them
    rec = run_gc(store, gate=gate, config=NOW, tables=hook)
    assert rec.status == "ok" and rec.l1_retired_deleted == 4, rec.gate.failures
    assert not dropped & {o.key for o in store.list(layout.L1_ROOT)}


def test_a_partition_whose_every_published_file_was_dropped_keeps_its_gc_going(fstore, catalogs, gate, tmp_path):
    """Found by the soak (file seed 19): DeleteRecords past every record of a partition,
    a publish that removes its files from the table (its published vector still names
    the offsets), and every GC after it refused by the gate ("published vector names
    exactly the offsets its files hold": none held, -1 against 14). The files reach just
    before the start offset; the table and the log agree."""
    config, store = catalogs, fstore
    timed_rounds(store, [T0, T0 + HOUR])
    do_publish(store, config, tmp_path)
    hook = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    assert run_gc(store, gate=gate, config=NOW, tables=hook).status == "ok"  # (and a pack to start from)
    end = plog(store, "t", 0).read_state().last_reconciled_offset
    delete_records(store, "t", 0, end + 1)
    pub = do_publish(store, config, tmp_path)
    assert pub.files_removed == 2
    recs = [run_gc(store, gate=gate, config=NOW, tables=hook) for _ in range(3)]
    assert [r.status for r in recs] == ["ok"] * 3, [r.gate.failures for r in recs]
    assert sum(r.l1_retired_deleted for r in recs) == 2
    assert offsets(store, p=0) == [] and len(offsets(store, p=1)) == 10


def forged_trim(store, start, reason, p=0):
    """A trim appended by a bug (or a zombie): the log takes it, the GC must judge it."""
    log = plog(store, "t", p)
    st = log.claim(log.read_state(), "bug", AccessMode.EXCLUSIVE, lease_ms=60_000).outcome.state
    log.append(st, lambda s: Trim(start, reason, s.writer_epoch, "bug"))


def test_a_trim_that_nothing_allows_keeps_its_files_and_only_them(store, gate):
    """A trim appended by a bug (reason: retention.ms, but the topic has none): its file
    stays, with a warning; every other partition's garbage still goes."""
    timed_rounds(store, [T0, T0 + 1], partitions=2)
    forged_trim(store, 5, TrimReason.RETENTION_MS)
    delete_records(store, "t", 1, 5)  # partition 1: an operator's trim, allowed
    for _ in range(2):  # M passes the rounds' L0 objects
        ClusterEpoch(store).advance()
        reconcile(store)
    before = {o.key for o in store.list(layout.L1_ROOT)}
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and rec.deleted > 0, rec.gate.failures  # the L0 GC goes on
    assert (rec.l1_retired_deleted, rec.l1_dropped_held) == (1, 1)
    gone = before - {o.key for o in store.list(layout.L1_ROOT)}
    assert len(gone) == 1 and "/000001/" in min(gone) and layout.parse_l1_key(min(gone)).first == 0
    assert [k for k in before - gone if layout.parse_l1_key(k).first == 0 and "/000000/" in k]  # partition 0's stays
    # an operator's DeleteRecords past it is what allows it
    delete_records(store, "t", 0, 5)  # (already there: nothing changes, so still kept)
    assert run_gc(store, gate=gate, config=NOW).l1_dropped_held == 1
    delete_records(store, "t", 0, 6)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (1, 0)


def test_a_size_trim_that_drops_more_than_its_bound_demands_keeps_its_files(store, gate):
    """retention.bytes is set, but a bug's trim drops files the bound keeps: the bytes
    after each dropped file are weighed, not the reason."""
    timed_rounds(store, [T0 + i for i in range(4)], partitions=1)
    sizes = [o.size for o in sorted(store.list(layout.L1_ROOT), key=lambda o: o.key)]
    set_retention(store, "t", None, sum(sizes[1:]))  # keeps the newest three files: drops one
    forged_trim(store, 15, TrimReason.RETENTION_BYTES)  # drops three
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (1, 2), rec
    set_retention(store, "t", None, sizes[3])  # now the bound allows dropping all but one
    rec = run_gc(store, gate=gate, config=NOW)
    assert (rec.l1_retired_deleted, rec.l1_dropped_held) == (2, 0), rec
    assert [o.size for o in store.list(layout.L1_ROOT)] == sizes[3:]


def test_a_size_trim_then_a_compaction_that_shrinks_the_bytes_after_it_still_lets_its_files_go(store, gate):
    """Found by the soak (seed 47): retention.bytes dropped the oldest files, then a
    compaction merged the files after them into one file with fewer bytes (one footer
    instead of four). Weighed against the compacted file alone, the trim looked
    unjustified and its files were held until the partition grew; the bytes the trim
    weighed are the replaced files', still in the store: the dropped files go."""
    timed_rounds(store, [T0 + i for i in range(6)], partitions=1)
    sizes = [o.size for o in sorted(store.list(layout.L1_ROOT), key=lambda o: o.key)]
    set_retention(store, "t", None, sum(sizes[2:]))  # keeps the newest four: drops two
    assert run_retention(store).count("trimmed") == 1
    assert run_compaction(store, config=CompactSettings(max_small_files=1)).files_replaced == 4
    merged = plog(store, "t", 0).read_state().committed_l1_files()
    assert len(merged) == 1 and store.head(merged[0].key).size < sum(sizes[2:])
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and rec.l1_dropped_held == 0, rec
    assert [o.key for o in store.list(layout.L1_ROOT)] == [merged[0].key]
    assert offsets(store) == list(range(10, 30))


def test_a_size_trims_files_still_go_after_the_files_a_compaction_replaced_are_deleted(store, gate):
    """Found by the soak (seed 47), the same trim a step further: the files after the
    dropped ones were merged into one smaller file and the replaced files were deleted
    (here: an operator loosened retention.bytes for a while, so the GC held the dropped
    files and deleted the replaced ones). Once the bound is back, the bytes the trim
    weighed are nowhere in the store: the compacted file weighs the bytes of the files
    it replaced (its footer names them), so the dropped files go instead of waiting
    for the partition to grow."""
    timed_rounds(store, [T0 + i for i in range(6)], partitions=1)
    sizes = [o.size for o in sorted(store.list(layout.L1_ROOT), key=lambda o: o.key)]
    bound = sum(sizes[2:])
    set_retention(store, "t", None, bound)  # keeps the newest four: drops two
    assert run_retention(store).count("trimmed") == 1
    set_retention(store, "t", None, 10 * bound)
    assert run_compaction(store, config=CompactSettings(max_small_files=1)).files_replaced == 4
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (4, 2), rec
    (merged,) = plog(store, "t", 0).read_state().committed_l1_files()
    assert store.head(merged.key).size < bound
    set_retention(store, "t", None, bound)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (2, 0), rec
    assert [o.key for o in store.list(layout.L1_ROOT)] == [merged.key]
    assert offsets(store) == list(range(10, 30))


def test_a_compaction_of_compacted_files_weighs_what_they_replaced(store, gate):
    """The weight a compacted file's footer names adds up through compactions of
    compacted files: the bytes of the files the reconciles wrote, never the smaller
    files that replaced them (deleted by the GC in between)."""
    from ctp_state.l1 import file_weight

    timed_rounds(store, [T0, T0 + 1], partitions=1)
    first = [o.size for o in sorted(store.list(layout.L1_ROOT), key=lambda o: o.key)]
    assert run_compaction(store, config=CompactSettings(max_small_files=1)).files_replaced == 2
    assert run_gc(store, gate=gate, config=NOW).l1_retired_deleted == 2
    (c1,) = plog(store, "t", 0).read_state().committed_l1_files()
    assert file_weight(store, c1.key, store.head(c1.key).size) == sum(first)
    timed_rounds(store, [T0 + 2, T0 + 3], partitions=1)
    later = [o.size for o in sorted(store.list(layout.L1_ROOT), key=lambda o: o.key) if o.key != c1.key]
    assert run_compaction(store, config=CompactSettings(max_small_files=1)).files_replaced == 3
    (c2,) = plog(store, "t", 0).read_state().committed_l1_files()
    size = store.head(c2.key).size
    assert size < sum(first) + sum(later) == file_weight(store, c2.key, size)
    assert offsets(store) == list(range(20))


def test_a_loosened_retention_holds_back_only_the_files_it_no_longer_allows(store, gate):
    """retention.ms dropped the old files, then an operator raised it before the GC ran:
    the dropped files' records are already behind the start offset; the files stay until
    they age past the new retention, and the GC of everything else goes on."""
    timed_rounds(store, [T0, T0 + HOUR], partitions=1)
    set_retention(store, "t", HOUR, None)
    assert run_retention(store, now_ms=T0 + 2 * HOUR - 100).count("trimmed") == 1  # the older file goes
    set_retention(store, "t", 100 * HOUR, None)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (0, 1), rec
    set_retention(store, "t", 9 * HOUR, None)  # the file's records are ten hours old
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and (rec.l1_retired_deleted, rec.l1_dropped_held) == (1, 0), rec
    assert offsets(store) == list(range(5, 10))


def test_the_gate_stops_a_run_that_would_delete_a_file_nothing_allows(store, gate):
    """The gate checks the run's own choice: were a bug to put an unauthorized dropped
    file on the delete list, the gate and the backstop both refuse the run."""
    from ctp_state.gc.prepare import check, prepare

    timed_rounds(store, [T0, T0 + 1], partitions=1)
    forged_trim(store, 5, TrimReason.RETENTION_MS)
    p = prepare(store, GcSettings(dry_run=True, l1_grace_s=0, l1_reader_grace_s=0))
    rows = p.frames["l1_dropped"].to_pylist()
    assert [(r["authorized"], r["deleting"]) for r in rows] == [(False, False)]
    _, failures = check(p, gate)
    assert failures == [], failures
    p.frames["l1_dropped"] = pa.Table.from_pylist([{**rows[0], "deleting": True}], schema=p.frames["l1_dropped"].schema)
    _, failures = check(p, gate)
    assert any("authorized" in f and "deleting" in f for f in failures), failures
    assert any(f.startswith("backstop: L1 file") and "nothing allows" in f for f in failures), failures


def test_the_gate_refuses_a_start_offset_that_went_back(store, gate):
    """A partition's log restored from an older backup: its start offset is below what
    the last passing GC saw."""
    from ctp_state.gc.prepare import check, prepare

    timed_rounds(store, [T0, T0 + 1], partitions=1)
    delete_records(store, "t", 0, 5)
    assert run_gc(store, gate=gate, config=GcSettings()).status == "ok"
    # the restore: the trim entry and every snapshot after it gone
    st = plog(store, "t", 0).read_state()
    store.delete_many(
        [layout.log_entry("t", 0, st.l1_changed_log_offset, st.topic_id)]
        + [o.key for o in store.list(layout.snapshot("t", 0, st.topic_id).rsplit("/", 1)[0] + "/")]
    )
    entries = sorted(o.key for o in store.list(layout.log_prefix("t", 0, st.topic_id)))
    store.delete_many([k for k in entries if k > layout.log_entry("t", 0, st.l1_changed_log_offset, st.topic_id)])
    p = prepare(store, GcSettings(dry_run=True))
    _, failures = check(p, gate)
    assert any("start offset 0 is below the 5" in f for f in failures), failures


def test_delete_records_killed_before_its_trim_then_a_rerun_moves_the_start_once(store, subprocess_env):
    import subprocess

    from tests.support import CTP

    timed_rounds(store, [T0, T0 + 1], partitions=1)
    env = {**subprocess_env, "CTP_FAULT": "trim_before_commit"}
    args = [CTP, "delete-records", "t", "0", "7", "--lease-seconds", "1"]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert r.returncode == -9, (r.returncode, r.stderr[-1500:])
    assert plog(store, "t", 0).read_state().start_offset == 0  # nothing moved
    time.sleep(1.2)  # (the killed run's claim lapses)
    r = subprocess.run(args, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert offsets(store) == [7, 8, 9]


def _forge_newest_stat(store, key: str, old_us: int, new_us: int) -> None:
    """Rewrite the timestamp statistics in ``key``'s footer (same length, data pages
    untouched): bit rot, or a bad rewrite, that makes its records look older."""
    import struct

    data = bytearray(store.get(key))
    flen = struct.unpack("<I", data[-8:-4])[0]
    lo = len(data) - 8 - flen
    footer = bytes(data[lo:-8])
    assert struct.pack("<q", old_us) in footer
    data[lo:-8] = footer.replace(struct.pack("<q", old_us), struct.pack("<q", new_us))
    store.put(key, bytes(data))


def test_a_file_whose_footer_makes_its_records_look_old_is_not_deleted_by_retention_ms(store, gate):
    """(From the twenty-fifth session's retention review.) L1 is the only copy: the GC
    lets a file retention.ms dropped go only by its records' own timestamps, read from
    its data pages (page checksums verified), not by its footer's statistics, which the
    trim trusted (one ranged read). Before, the file below -- records five minutes old,
    retention an hour, a footer that says a day -- was trimmed and then deleted."""
    now = int(time.time() * 1000)
    young = now - 5 * 60_000
    timed_rounds(store, [young, young + 1], partitions=1)
    set_retention(store, "t", HOUR, None)
    first = plog(store, "t", 0).read_state().committed_l1_files()[0]
    _forge_newest_stat(store, first.key, (young + 4) * 1000, (young - 24 * HOUR) * 1000)
    run_retention(store)  # the trim reads the footer: its start offset moves past the file
    for _ in range(2):  # later commits, so the GC reads the partition's log
        ClusterEpoch(store).advance()
        reconcile(store)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and rec.l1_retired_deleted == 0 and rec.l1_dropped_held == 1, rec
    assert store.head(first.key) is not None
