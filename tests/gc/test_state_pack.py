"""The GC's state pack (docs/design.md, section 14): a run starts from the states the
previous passing run decided on, reads only the partitions the reconciler says it
touched, and reads every log every ``full_read_every`` runs. A pack is a cache: one
that is damaged, another run's or another store's, or stale, costs reads and never
raises M, never passes a pending placeholder, and never lets the L1 sweep take a
committed file for an orphan. On both stores, behind the real gate."""

from __future__ import annotations

import pytest

from ctp_state import codec, layout
from ctp_state.compact import run_compaction
from ctp_state.entries import AccessMode, Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import GateFailed, StateUnreadable
from ctp_state.gc import gather, run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.gc.pack import decode_pack, pack_seq
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.records import PartitionFacts, PartitionReport, ReconcileSummary
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.status import reconcile_summaries
from ctp_state.storage import LocalStore
from ctp_state.topics import create_topic
from tests.compact.test_compaction import many_small_files
from tests.compact.test_gc_retired import hook
from tests.support import assert_exactly_once, claim_given_up, plog, reconcile
from tests.support.table import do_publish, load

P = 4


def epoch(store, gate, config=GcSettings()):
    """One round of an idle topic: advance, reconcile, GC."""
    ClusterEpoch(store).advance()
    assert reconcile(store).ok
    rec = run_gc(store, gate=gate, config=config)
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return rec


def true_m(store) -> int:
    """M from every partition's log (no pack), for comparison."""
    c, views = gather(store)
    return min([c - 1, *(v.m for v in views)])


def test_an_idle_topics_gc_reads_its_logs_once_then_only_the_ticks(store, gate):
    create_topic(store, "t", P)
    recs = [epoch(store, gate) for _ in range(6)]
    assert recs[0].partitions_read == P  # no pack yet: every log
    assert [r.partitions_read for r in recs[1:]] == [0] * 5
    assert all(r.pack_key and r.pack_full_seq == recs[0].seq for r in recs)
    # M moves as a run that reads every log would have it, run after run
    assert recs[-1].m == true_m(store) and recs[-1].m > recs[1].m
    # the pack holds exactly the states of the partitions, and old packs go
    last = recs[-1]
    packed = decode_pack(
        store.get(last.pack_key), last.pack_key, seq=last.seq, run_id=last.run_id, crc32c=last.pack_crc32c
    )
    states = [s for s, _ in packed]
    assert sorted((s.topic, s.partition) for s in states) == [("t", p) for p in range(P)]
    assert {s.applied_offset for s in states} == {plog(store, "t", 0).read_state().applied_offset}
    # each with the CRC32C of the bytes of the entry it ends at
    for s, crc in packed:
        log = plog(store, "t", s.partition)
        assert crc == codec.crc32c(store.get(log.key(s.applied_offset)))
    assert sorted(pack_seq(o.key) for o in store.list(layout.GC_PACKS)) == [last.seq - 2, last.seq - 1, last.seq]


def test_a_run_from_the_pack_gets_the_reconcile_summary_once(store, gate, monkeypatch):
    """The summary since the pack gives the hints and is the newest (R7's annotations):
    one GET serves both (at 100k partitions a summary is about 2 s of JSON)."""
    create_topic(store, "t", P)
    for _ in range(2):
        epoch(store, gate)
    ClusterEpoch(store).advance()
    assert reconcile(store).ok
    prefix, got, get = reconcile_summaries(store).prefix, [], store.get
    monkeypatch.setattr(store, "get", lambda key: (got.append(key), get(key))[1])
    rec = run_gc(store, gate=gate, config=GcSettings())
    assert rec.status == "ok" and rec.partitions_read == 0
    newest = reconcile_summaries(store).key(reconcile_summaries(store).last())
    assert [k for k in got if k.startswith(prefix) and not k.endswith("hint")] == [newest]


def test_every_nth_run_reads_every_log(store, gate):
    create_topic(store, "t", P)
    recs = [epoch(store, gate, GcSettings(full_read_every=3)) for _ in range(7)]
    assert [r.partitions_read for r in recs] == [P, 0, 0, P, 0, 0, P]
    assert [r.pack_full_seq for r in recs] == [0, 0, 0, 3, 3, 3, 6]


def test_a_log_read_that_finds_only_ticks_since_the_last_sweep_does_not_list_l1(store, gate, monkeypatch):
    """A tick changes no L1 file (no claim a writer could write under), so the L1 sweep
    skips a partition whose log grew only by ticks since it last looked -- whether its
    state came from the pack or, in a run that reads every log, from the log itself.
    Any other entry (a commit here) is listed after."""
    create_topic(store, "t", P)
    every = GcSettings(full_read_every=1)  # every run reads every log
    for _ in range(3):
        epoch(store, gate, every)
    listed, lst = [], store.list
    monkeypatch.setattr(store, "list", lambda p="", *a, **k: (listed.append(p), lst(p, *a, **k))[1])
    before = plog(store, "t", 0).read_state().applied_offset
    for _ in range(4):  # LAG2: every partition ticks in two of these
        rec = epoch(store, gate, every)
        assert rec.partitions_read == P
        assert rec.l1_partitions_unchanged == P and rec.l1_listed == 0, rec
    assert not [p for p in listed if p.startswith(layout.L1_ROOT)]
    assert plog(store, "t", 0).read_state().applied_offset == before + 2  # (it ticked twice)
    # a commit is not a tick: the partition written to is listed, the others are not
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"v", b"k", 1000, ())])])[0].accepted
    rec = epoch(store, gate, every)
    assert rec.l1_partitions_unchanged == P - 1 and rec.l1_new_files_checked == 1


def test_a_log_that_grew_without_a_commit_since_the_last_sweep_is_not_listed(store, gate, monkeypatch):
    """With the sweep's W at the last reconciled offset, a listing after W can only find
    files past it, which the sweep leaves (a writer may commit them): placeholders
    pending at the GC's run, or a claim given up, cost no L1 listing. The commit that
    reconciles them moves LR past W, and the partition is listed then."""
    create_topic(store, "t", P)
    every = GcSettings(full_read_every=1)
    for _ in range(2):
        epoch(store, gate, every)
    listed, lst = [], store.list
    monkeypatch.setattr(store, "list", lambda p="", *a, **k: (listed.append(p), lst(p, *a, **k))[1])
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"v", b"k", 1000, ())])])[0].accepted
    claim_given_up(store, "t", 1)
    rec = run_gc(store, gate=gate, config=every)  # (no reconcile: partition 0 has its placeholder pending)
    assert rec.status == "ok" and rec.partitions_read == P
    assert rec.l1_partitions_unchanged == P and rec.l1_listed == 0, rec
    assert not [p for p in listed if p.startswith(layout.L1_ROOT)]
    rec = epoch(store, gate, every)  # the commit
    assert rec.l1_partitions_unchanged == P - 1 and rec.l1_new_files_checked == 1


def corrupt(store, key: str, how) -> None:
    data = store.get(key)
    store.delete_many([key])
    store.put(key, how(data))


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(lambda d: d[:-7], id="cut-short"),
        pytest.param(lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], id="a-flipped-bit"),
        pytest.param(lambda d: b"", id="empty"),
    ],
)
def test_a_damaged_pack_is_not_used_and_the_run_reads_every_log(store, gate, how):
    create_topic(store, "t", P)
    first = [epoch(store, gate) for _ in range(3)][-1]
    corrupt(store, first.pack_key, how)
    rec = epoch(store, gate)
    assert rec.partitions_read == P and rec.m == true_m(store)
    assert rec.pack_full_seq == rec.seq  # it read everything: the next run starts from its pack
    assert epoch(store, gate).partitions_read == 0


def test_a_pack_from_another_store_or_an_older_run_is_not_used(store, gate, tmp_path):
    other = LocalStore(str(tmp_path / "other"))
    create_topic(store, "t", P)
    create_topic(other, "t", P)
    for _ in range(5):  # the other store's partitions are further on
        epoch(other, gate)
    theirs = GcHistory(other).get(GcHistory(other).last_seq()).pack_key
    recs = [epoch(store, gate) for _ in range(3)]
    for planted in (other.get(theirs), store.get(recs[0].pack_key)):
        corrupt(store, recs[-1].pack_key, lambda d, planted=planted: planted)
        rec = epoch(store, gate)
        assert rec.partitions_read == P and rec.m == true_m(store)
        recs.append(rec)


def test_a_placeholder_written_after_the_pack_is_never_passed_by_m(store, gate):
    """The pack's state of an idle partition does not know a producer's placeholder
    that came after it (nothing hints it until a reconcile reports it): M from the older
    state is below the placeholder's epoch, and its L0 object stays."""
    create_topic(store, "t", P)
    for _ in range(4):
        epoch(store, gate)
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([(("t", 0), [Record(b"late")])])[0]
    assert got.accepted
    placeholder_epoch = layout.parse_l0_key(got.l0_key)[1]
    for _ in range(3):  # C moves, no reconcile: nothing hints the placeholder, and the GC does not look for it
        ClusterEpoch(store).advance()
        rec = run_gc(store, gate=gate)
        assert rec.status == "ok" and rec.partitions_read == 0
        assert rec.m < placeholder_epoch
        assert store.head(got.l0_key) is not None
    # the next reconcile reports the partition reconciled: it is read from its log
    rec = epoch(store, gate)
    assert rec.partitions_read >= 1 and rec.m == true_m(store)
    assert_exactly_once(store, "t", {0: [Record(b"late")], 1: [], 2: [], 3: []}, all_in_l1=True)


def test_a_hole_after_the_packs_state_never_lets_m_pass_the_placeholders_around_it(store, gate):
    """Held under review (the GC does not look past a pack's state): the store loses a
    log's newest entry (B) and B's producer appends C from its cached state past it: a
    hole between A and C. Runs from the pack keep M below both placeholders' epochs and
    their L0 objects; reconciles stop on the gap and write nothing; a full read stops."""
    create_topic(store, "t", 1)
    for _ in range(4):
        epoch(store, gate)
    log = plog(store, "t", 0, write_snapshots=False)
    k = log.read_state().applied_offset
    ClusterEpoch(store).advance()
    with Producer(store, epoch_ttl_s=0) as x, Producer(store, epoch_ttl_s=0) as y:
        a = x.write([(("t", 0), [Record(b"a")])])[0]
        assert a.accepted and y.write([(("t", 0), [Record(b"b")])])[0].accepted
        assert log.read_state().applied_offset == k + 2
        store.delete_many([log.key(k + 2), layout.snapshot("t", 0, log.topic_id)])  # B lost
        c = y.write([(("t", 0), [Record(b"c")])])[0]  # from Y's cached state: at k+3
        assert c.accepted, c.error
    assert store.head(log.key(k + 3)) is not None and store.head(log.key(k + 2)) is None
    lowest = min(layout.parse_l0_key(v.l0_key)[1] for v in (a, c))
    cfg = GcSettings(grace_s=0, full_read_every=6)
    outcomes = []
    for i in range(8):
        ClusterEpoch(store).advance()
        if i >= 4:
            s = reconcile(store)
            assert not s.ok and "state log is not dense" in s.partitions[0].reason, s.partitions
        try:
            rec = run_gc(store, gate=gate, config=cfg)
        except StateUnreadable:
            outcomes.append("unreadable")
        else:
            assert rec.status == "ok" and rec.m < lowest, (rec.m, lowest)
            outcomes.append("ok")
        assert store.head(a.l0_key) is not None and store.head(c.l0_key) is not None
    assert "ok" in outcomes and "unreadable" in outcomes, outcomes  # from the pack, then the full read


def forged_summary(store, reports) -> None:
    reconcile_summaries(store).append(
        lambda seq: ReconcileSummary(
            run_id="forged", started_ms=0, finished_ms=0, seconds=0, cluster_epoch=0, idle_lag=2, partitions=reports
        )
    )


def report(p: int, status: str, log_end: int) -> PartitionReport:
    return PartitionReport(
        topic="t",
        partition=p,
        status=status,
        state=PartitionFacts(topic="t", partition=p, initialized=True, log_end_offset=log_end),
    )


def test_a_forged_or_wrong_hint_costs_a_read_and_nothing_else(store, gate):
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate)
    end = plog(store, "t", 0).read_state().applied_offset + 1
    # entries that are not there; a claim that is not a tick; a hint of the past
    forged_summary(store, (report(0, "advanced", end + 5), report(1, "reconciled", end + 1), report(2, "advanced", 1)))
    plog(store, "t", 3).claim(plog(store, "t", 3).read_state(), "someone", AccessMode.EXCLUSIVE, lease_ms=0)
    forged_summary(store, (report(3, "advanced", end + 1),))
    rec = run_gc(store, gate=gate)
    # 0, 1 and 3 from their logs; 2 too: a reconcile that saw a shorter log than the
    # pack's is the sign of a log that went back (tests below)
    assert rec.status == "ok" and rec.partitions_read == 4
    assert rec.m == true_m(store)
    forged_summary(store, (report(2, "advanced", 1),))  # the pack read it now: still the log
    assert run_gc(store, gate=gate).partitions_read == 1


def test_a_compaction_the_pack_does_not_know_is_never_taken_for_an_orphan(store, gate):
    """The compactor's commit is no reconcile's: nothing hints it until the next
    reconcile reports the partition (here none runs), and the pack's state does not name
    its file. The L1 sweep collects orphans only from states read from the logs, so the
    compacted file stays until a run reads the log -- the next full read at the latest
    -- which then retires the files it replaced."""
    sent = many_small_files(store)
    now = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, full_read_every=4)
    first = run_gc(store, gate=gate, config=now)
    assert first.status == "ok" and first.partitions_read == 2
    run_compaction(store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20))
    compacted = {f.key for p in range(2) for f in plog(store, "t", p).read_state().committed_l1_files()}
    runs = []
    while not runs or runs[-1].partitions_read == 0:
        runs.append(run_gc(store, gate=gate, config=now))
        assert runs[-1].status == "ok" and runs[-1].l1_orphans == 0
        assert all(store.head(k) is not None for k in compacted)
        assert_exactly_once(store, "t", sent)
    # no reconcile reported the compactor's entries: the full read (every 4th run) reads the logs
    assert len(runs) <= now.full_read_every and runs[-1].l1_retired_deleted == 12
    assert {o.key for o in store.list(layout.L1_ROOT)} == compacted
    assert_exactly_once(store, "t", sent)


def test_a_compaction_is_read_from_the_log_by_the_gc_after_the_next_reconcile(store, gate):
    """In the DAGs' order (reconcile, then GC), the reconcile after a compaction reports
    the partition with entries past the pack that are not ticks: the GC reads its log
    and retires the replaced files in that run."""
    sent = many_small_files(store)
    now = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)
    assert run_gc(store, gate=gate, config=now).status == "ok"
    run_compaction(store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20))
    ClusterEpoch(store).advance()
    assert reconcile(store).ok
    rec = run_gc(store, gate=gate, config=now)
    assert rec.status == "ok" and rec.partitions_read == 2 and rec.l1_retired_deleted == 12, rec
    assert_exactly_once(store, "t", sent)


@pytest.mark.parametrize("full_read_every", [12, 1])
def test_a_pack_ahead_of_a_log_that_lost_its_tail_is_not_trusted(store, gate, full_read_every):
    """Found by review: the store loses a partition's newest entry (a tick the pack
    folded) and its snapshot, and a producer with an epoch the shorter log accepts
    appends a placeholder where the tick was. A pack state is then *ahead* of the log;
    M from it would pass the placeholder. The pack's last entry must still be there, with
    the bytes the pack folded (its CRC32C), or the partition is read from its
    log -- where the GC sees M would go back and stops, as it always did."""
    cfg = GcSettings(full_read_every=full_read_every)
    create_topic(store, "t", 1)
    log = plog(store, "t", 0, write_snapshots=False)
    for _ in range(6):
        epoch(store, gate, cfg)
    while not isinstance(list(log.entries())[-1][1], Tick):
        epoch(store, gate, cfg)
    last_off, last = list(log.entries())[-1]
    assert run_gc(store, gate=gate, config=cfg).status == "ok"  # the tick is in the pack
    store.delete_many([log.key(last_off), layout.snapshot("t", 0, log.topic_id)])
    short = plog(store, "t", 0, write_snapshots=False).read_state()
    assert short.max_applied_epoch < last.epoch
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([(("t", 0), [Record(b"victim")])], epoch=short.max_applied_epoch)[0]
    assert got.accepted, got.error
    with pytest.raises(GateFailed, match="I3"):
        run_gc(store, gate=gate, config=cfg)
    assert store.head(got.l0_key) is not None


def test_a_table_that_holds_what_the_pack_does_not_commit_reads_the_log(fstore, config, gate, tmp_path):
    """Found by review: a compaction nobody reports, then a publish of it. The pack's
    (older) states do not commit the compacted files the table now holds, and the gate's
    table checks refused every run until the next full read. Such a partition is read
    from its log."""
    store = fstore
    cfg = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)
    create_topic(store, "t", 2)
    for r in range(4):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
        do_publish(store, config, tmp_path)
    assert run_gc(store, gate=gate, config=cfg, tables=hook(store, config, tmp_path)).status == "ok"
    run_compaction(store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20))
    do_publish(store, config, tmp_path)
    recs = [run_gc(store, gate=gate, config=cfg, tables=hook(store, config, tmp_path)) for _ in range(3)]
    assert [r.status for r in recs] == ["ok"] * 3
    assert recs[0].partitions_read == 2
