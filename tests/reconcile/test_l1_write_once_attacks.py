"""Review of the L1 write-once change (``ctp_state/l1.py`` ``write_once``, ``verify --deep``
against the committed CRC32C).

Each scenario tries to make ctp lose acknowledged data, serve wrong data, or wedge a
partition for good through the change. Those that hold say HELD. Two found a wedge
(a file in the way that a reconciler may not replace, since it cannot tell it from a
committed one): those now check that the partition is held with a message naming the
file and the way out, and that the way out works.
"""

from __future__ import annotations

import io
import threading
import time

import pyarrow.parquet as pq
import pytest

from ctp_state import l0, layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData, KeyExists, ObjectNotFound, StoreError
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.l1 import L1File, build_file
from ctp_state.producer import Producer
from ctp_state.reconcile import build_files_locally
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.topics import create_topic
from ctp_state.verify import verify_partition
from tests.support import LostResponses, Wrapped, key_id, plog, reconcile, values

SWEEP_NOW = GcSettings(l1_grace_s=0, l1_full_sweep_s=0)


# --- helpers ---------------------------------------------------------------------------------


def produce(store, n=20, prefix="r", topic="t"):
    recs = [Record(f"{prefix}{i}".encode(), None, 1000 + i) for i in range(n)]
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(0, n, 5):
            assert prod.write([((topic, 0), recs[i : i + 5])])[0].accepted
    return [r.value for r in recs]


def setup(store, n=20):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    return ce, produce(store, n)


def state(store, topic="t"):
    return plog(store, topic, 0).read_state()


def l1_keys(store, topic="t"):
    return sorted(o.key for o in store.list(layout.l1_partition_prefix(topic, 0, key_id(store, topic))))


def codec_of(data: bytes) -> str:
    return pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0).compression


def committed_match_store(store, topic="t"):
    """Every committed L1 file is there and its bytes are the ones the commit recorded."""
    for ref in state(store, topic).committed_l1_files():
        assert ref.crc32c == l0.crc32c(store.get(ref.key)), ref.key


def collect_everything(store, ce, gate):
    """Advance C, reconcile (idle advance), GC with no L1 grace and a full sweep: every L0
    object the partition no longer needs goes, every orphan L1 file behind LR too."""
    for _ in range(3):
        ce.advance()
    reconcile(store)
    rec = run_gc(store, gate=gate, config=SWEEP_NOW)
    assert rec.status == "ok", rec
    return rec


def deep_clean(store, topic="t"):
    findings = verify_partition(store, topic, 0, deep=True).findings
    assert not findings, findings


def crash_after_build(store, compression="zstd"):
    """A ``map_files`` that writes the L1 files, then dies before the commit."""

    def m(files):
        build_files_locally(store, files, compression=compression)
        raise RuntimeError("killed between the L1 writes and the commit")

    return m


# --- A. zombie and live reconciler, the zombie's file first ------------------------------------


def test_live_reconciler_takes_over_a_zombies_earlier_file_and_l0_can_go(store, gate):
    """HELD. Order B of the race: a reconciler (snappy, an older deployment) writes its
    L1 file, then stalls past its lease before committing. A live reconciler (zstd)
    meets the file, takes it over (same rows), commits *its* CRC32C. The GC deletes the
    L0 source. The zombie wakes up: fenced. Reads, the gate and verify --deep agree
    with the committed CRC32C; the file on the store is the zombie's snappy one."""
    ce, want = setup(store)
    built, go_on = threading.Event(), threading.Event()

    def slow(files):
        out = build_files_locally(store, files, compression="snappy")
        built.set()
        assert go_on.wait(120)
        return out

    zombie: list = []
    t = threading.Thread(
        target=lambda: zombie.append(
            reconcile(store, config=ReconcileSettings(idle_lag=2, lease_ms=1500, compression="snappy"), map_files=slow)
        )
    )
    t.start()
    try:
        assert built.wait(60)
        (key,) = l1_keys(store)
        zombie_bytes = store.get(key)
        time.sleep(3.2)  # past the zombie's lease by the store's clock
        live = reconcile(store)
        assert live.partitions[0].status == "reconciled", live.partitions
        assert store.get(key) == zombie_bytes and codec_of(zombie_bytes) == "SNAPPY"
        committed_match_store(store)
        collect_everything(store, ce, gate)
        assert not list(store.list(layout.L0_ROOT))
    finally:
        go_on.set()
        t.join(120)
    assert zombie and zombie[0].partitions[0].status == "fenced", zombie
    assert values(store) == want
    committed_match_store(store)
    deep_clean(store)
    assert run_gc(store, gate=gate, config=SWEEP_NOW).status == "ok"
    assert values(store) == want


# --- B. a crash between the L1 writes and the commit, rerun with other settings ----------------


@pytest.mark.parametrize(
    "crashed, rerun",
    [
        # one file per chunk, then one file for everything
        ({"target_file_bytes": 1, "compression": "snappy"}, {"compression": "zstd"}),
        # one file for everything, then one file per chunk
        ({"compression": "snappy"}, {"target_file_bytes": 1, "compression": "zstd"}),
        # the crashed run got only the first chunk in (a byte cap): the rerun takes that
        # file over and writes the others
        ({"max_bytes_per_partition": 1, "compression": "snappy"}, {"target_file_bytes": 1, "compression": "gzip"}),
        # the crashed run: two chunks per file; the rerun: three (boundaries interleave)
        ({"target_file_bytes": "2c"}, {"target_file_bytes": "3c", "compression": "snappy"}),
    ],
    ids=["per-chunk-then-one", "one-then-per-chunk", "prefix-taken-over", "interleaved"],
)
def test_a_rerun_after_a_crash_before_commit_with_other_file_boundaries(store, gate, crashed, rerun):
    """HELD. A run writes its L1 files and dies before the commit; the rerun plans with
    other settings (file size, byte cap, compression). Keys that coincide are taken
    over (same rows), the others are written fresh; the commit's CRC32Cs match the
    store; the GC collects the crashed run's orphans and the L0 sources; every record
    reads once; verify --deep is clean."""
    ce, want = setup(store)
    chunk = state(store).pending[0].byte_length
    crashed = {k: (int(v[0]) * chunk if isinstance(v, str) and v.endswith("c") else v) for k, v in crashed.items()}
    rerun = {k: (int(v[0]) * chunk if isinstance(v, str) and v.endswith("c") else v) for k, v in rerun.items()}
    cfg = ReconcileSettings(idle_lag=2, **crashed)
    with pytest.raises(RuntimeError, match="killed"):
        reconcile(store, config=cfg, map_files=crash_after_build(store, cfg.compression))
    orphans = {k: store.get(k) for k in l1_keys(store)}
    assert orphans and not state(store).l1_ends
    s = reconcile(store, config=ReconcileSettings(idle_lag=2, **rerun))
    assert s.partitions[0].status == "reconciled", s.partitions
    committed_match_store(store)
    taken = set(orphans) & set(state(store).committed_l1_keys())
    for k in taken:  # taken over, never rewritten
        assert store.get(k) == orphans[k], k
    assert bool(taken) == (crashed.get("max_bytes_per_partition") == 1), taken
    assert values(store) == want
    collect_everything(store, ce, gate)
    assert not list(store.list(layout.L0_ROOT))
    assert l1_keys(store) == sorted(state(store).committed_l1_keys()), "an orphan was left behind"
    assert values(store) == want
    deep_clean(store)


# --- C. lost responses and conditional-write conflicts on the L1 write ---------------------------


def test_a_lost_response_on_the_l1_create_is_taken_over_by_the_rerun(store, gate):
    """HELD. The L1 create persisted, its response was lost (the run fails: the error
    is not a data error). The rerun meets its own file at the key, takes it over and
    commits its CRC32C; the GC and verify agree."""
    ce, want = setup(store)
    lossy = LostResponses(store, r"^l1/", times=1)
    try:
        first = reconcile(lossy)
    except StoreError:
        first = None
    assert lossy.lost, "the fault never fired"
    if first is not None:
        assert first.partitions[0].status != "reconciled"
    s = reconcile(store, config=ReconcileSettings(idle_lag=2, compression="snappy"))
    assert s.partitions[0].status == "reconciled", s.partitions
    assert codec_of(store.get(lossy.lost[0])) == "ZSTD"  # the first run's file, taken over
    committed_match_store(store)
    collect_everything(store, ce, gate)
    assert values(store) == want
    deep_clean(store)


class RetriedCreate(Wrapped):
    """What a retrying S3 client reports after a lost response on ``If-None-Match: *``:
    the first attempt landed, the retry got 412, so the caller sees ``KeyExists`` for
    its own write."""

    def __init__(self, inner):
        super().__init__(inner)
        self.fired = 0

    def put_if_absent(self, k, d):
        self.inner.put_if_absent(k, d)
        if k.startswith(layout.L1_ROOT) and not self.fired:
            self.fired += 1
            raise KeyExists(k)


def test_a_retried_create_that_sees_its_own_write_commits_in_the_same_run(store, gate):
    """HELD. The retry of a create whose first attempt landed sees 412: write_once takes
    over its own bytes and the run commits at once."""
    ce, want = setup(store)
    w = RetriedCreate(store)
    s = reconcile(w)
    assert w.fired == 1
    assert s.partitions[0].status == "reconciled", s.partitions
    committed_match_store(store)
    collect_everything(store, ce, gate)
    assert values(store) == want
    deep_clean(store)


class ConflictNoFile(Wrapped):
    """409 ConditionalRequestConflict (the store's ``KeyExists``) while another
    conditional write of the key is in flight, and that write then never lands (its
    writer died, or it was aborted): nothing is at the key when write_once GETs it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.fired = 0

    def put_if_absent(self, k, d):
        if k.startswith(layout.L1_ROOT) and not self.fired:
            self.fired += 1
            raise KeyExists(k)
        return self.inner.put_if_absent(k, d)


def test_a_409_conflict_whose_other_write_never_lands_only_delays_the_partition(store, gate):
    """HELD. The first create meets KeyExists and the GET finds nothing: the create is
    tried again, the file written, the partition committed in the same run."""
    ce, want = setup(store)
    w = ConflictNoFile(store)
    first = reconcile(w)
    assert w.fired == 1
    assert first.partitions[0].status == "reconciled", first.partitions
    committed_match_store(store)
    collect_everything(store, ce, gate)
    assert values(store) == want
    deep_clean(store)


def test_two_writers_racing_on_one_key_both_report_the_bytes_at_the_key(store):
    """HELD. Two builders of the same file (a zombie and a live reconciler, or two Spark
    attempts), other compressions, released together at put_if_absent, 8 times over:
    each one reports the CRC32C of the bytes that are at the key, or a transient error
    (ObjectNotFound when the winner's write was not visible yet); never another CRC32C."""
    setup(store)
    f = L1File("t", 0, tuple(state(store).pending))
    for _ in range(8):
        store.delete_many([f.key])
        barrier = threading.Barrier(2)

        class AtOnce(Wrapped):
            def put_if_absent(self, k, d, barrier=barrier):
                barrier.wait(30)
                return self.inner.put_if_absent(k, d)

        got: dict[str, object] = {}

        def run(codec, got=got):
            try:
                got[codec] = build_file(AtOnce(store), f, compression=codec).l1_crc32c
            except (ObjectNotFound, CorruptData) as e:
                got[codec] = e

        ts = [threading.Thread(target=run, args=(c,)) for c in ("snappy", "zstd")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        there = l0.crc32c(store.get(f.key))
        for codec, r in got.items():
            assert r == there or isinstance(r, ObjectNotFound), (codec, r, there)
        assert any(r == there for r in got.values()), got


# --- D. the GC's L1 sweep against a takeover -------------------------------------------------------


def test_the_l1_sweep_leaves_a_file_a_lapsed_reconciler_took_over_and_then_commits(store, gate):
    """HELD. A crashed run leaves an orphan at the key. A second reconciler takes it over,
    then stalls past its lease before committing. A GC with no L1 grace and a full
    sweep runs meanwhile (no live claim: it collects this partition): the file is past
    the last reconciled offset, so it stays. The stalled reconciler commits (no one
    claimed after it); the gate then checks the file and the L0 goes."""
    ce, want = setup(store)
    with pytest.raises(RuntimeError, match="killed"):
        reconcile(store, map_files=crash_after_build(store, "snappy"))
    (key,) = l1_keys(store)
    built, go_on = threading.Event(), threading.Event()

    def slow(files):
        out = build_files_locally(store, files)
        built.set()
        assert go_on.wait(120)
        return out

    res: list = []
    t = threading.Thread(
        target=lambda: res.append(reconcile(store, config=ReconcileSettings(idle_lag=2, lease_ms=1500), map_files=slow))
    )
    t.start()
    try:
        assert built.wait(60)
        time.sleep(3.2)
        rec = run_gc(store, gate=gate, config=SWEEP_NOW)
        assert rec.status == "ok", rec
        assert store.head(key) is not None, "the sweep deleted the file a reconciler is about to commit"
    finally:
        go_on.set()
        t.join(120)
    assert res and res[0].partitions[0].status == "reconciled", res
    committed_match_store(store)
    collect_everything(store, ce, gate)
    assert not list(store.list(layout.L0_ROOT))
    assert values(store) == want
    deep_clean(store)


# --- E. a file at the key that is not the one the rerun would write ------------------------------


def _reconcile_and_gc_a_few_times(store, ce, gate, rounds=3):
    """What an operator's schedule does: reconcile, advance, GC, a few times over.
    Returns the last reconcile summary's partition report and the last GC record."""
    rep = rec = None
    for _ in range(rounds):
        rep = reconcile(store).partitions[0]
        ce.advance()
        rec = run_gc(store, gate=gate, config=SWEEP_NOW)
    return rep, rec


def held_until_deleted(store, ce, gate, rep, rec, key, why, want):
    """The partition is held (nothing committed, M(p) where it was, nothing lost), the
    reconciler's report and the GC's name the L1 file in the way and the way out; once
    the operator checks that no commit names it and deletes it, the next reconcile
    commits and every record reads back once."""
    assert state(store).last_reconciled_offset == -1 and rep.status == "quarantined", rep
    assert key in rep.reason and why in rep.reason and "delete it and reconcile again" in rep.reason, rep.reason
    assert rep.key is None  # not called an L0 key
    assert any(key in r for h in rec.held_by for r in h.reasons), rec.held_by
    assert not state(store).l1_ends  # no commit names it (nor any other file)
    assert not verify_partition(store, "t", 0, deep=True).findings  # verify --deep has nothing against it
    store.delete_many([key])
    assert reconcile(store).partitions[0].status == "reconciled"
    committed_match_store(store)
    collect_everything(store, ce, gate)
    assert values(store) == want
    deep_clean(store)


def test_a_damaged_uncommitted_orphan_at_the_rerun_key_holds_the_partition_until_the_operator_deletes_it(store, gate):
    """Found a wedge; now HELD with its way out. A crashed run's orphan at the key the rerun needs is damaged (bit
    rot, a bad disk: one flipped byte in a page). It was never committed and its L0
    sources are all there, so nothing is lost and a rewrite would be safe. Before the
    change the rerun's PUT replaced it. Now every rerun refuses it ("does not read ...
    left as it is"), the partition is quarantined on every run, its M(p) -- and so the
    cluster-wide M -- never moves, and the GC never collects the file (it lies past the
    last reconciled offset, where a live writer "may still commit it"). No ctp command
    gets the operator out (deleting the file by hand, or a rerun with another
    --target-file-mb when the file spans more than one chunk, does); the GC report and
    alert call the L1 key an "L0 key", pointing the operator at the wrong object."""
    ce, want = setup(store)
    with pytest.raises(RuntimeError, match="killed"):
        reconcile(store, map_files=crash_after_build(store))
    (key,) = l1_keys(store)
    data = bytearray(store.get(key))
    data[len(data) // 3] ^= 0xFF  # one flipped byte inside the data pages
    store.put(key, bytes(data))
    with pytest.raises(CorruptData):
        from ctp_state.l1 import parse_l1

        parse_l1(bytes(data), key)
    rep, rec = _reconcile_and_gc_a_few_times(store, ce, gate)
    held_until_deleted(store, ce, gate, rep, rec, key, "does not read", want)


def _remove_topic_by_hand(store, with_l1: bool) -> None:
    prefixes = ["logs/t/", "snapshots/t/"] + ([layout.L1_ROOT + "t/"] if with_l1 else [])
    keys = [o.key for pre in prefixes for o in store.list(pre)]
    store.delete_many(keys + [layout.topic_meta("t")])


@pytest.mark.parametrize("how", ["old-l1-left", "old-reconciler-late-write"])
def test_a_recreated_topic_never_meets_the_old_topics_l1_file(store, gate, how):
    """Found a wedge; now CLOSED by incarnation-keyed state (R10). Topic t's 20 records
    (4 batches of 5) go to its L1 file 0-19. The topic is removed by hand and created
    again; producers write 20 other records in the same batches.

    - old-l1-left: t was reconciled, and the removal took metadata, logs and snapshots
      but not l1/t/.
    - old-reconciler-late-write: the removal also took l1/t/, but a reconciler of the old
      t was still building: its file lands after the removal (and it dies before its commit).

    When L1 keys carried only the topic's name, the new t's reconcile planned the same
    key, found the old incarnation's file and quarantined t/0 on every run, for good
    (M pinned cluster-wide). Now each incarnation's files live under its own id: the new
    t's file has another key, its reconcile commits, and the old file stays where its
    incarnation put it (``ctp topic delete`` has the GC remove such state)."""
    ce, _ = setup(store)
    old_id = key_id(store, "t")
    if how == "old-l1-left":
        assert reconcile(store).partitions[0].status == "reconciled"
        _remove_topic_by_hand(store, with_l1=False)
        create_topic(store, "t", 1)
        want = produce(store, 20, prefix="new")
    else:
        got: dict = {}

        def recreate_while_building(files):
            _remove_topic_by_hand(store, with_l1=True)
            create_topic(store, "t", 1)
            got["want"] = produce(store, 20, prefix="new")
            build_files_locally(store, files)
            raise RuntimeError("killed between the L1 writes and the commit")

        with pytest.raises(RuntimeError, match="killed"):
            reconcile(store, map_files=recreate_while_building)
        want = got["want"]
    old_key = layout.l1_key("t", 0, 0, 19, old_id)
    new_key = layout.l1_key("t", 0, 0, 19, key_id(store, "t"))
    assert old_id != key_id(store, "t") and store.head(old_key) is not None
    assert values(store) == want  # the new topic's records, from L0
    rep, rec = _reconcile_and_gc_a_few_times(store, ce, gate)
    assert rep.status in ("reconciled", "advanced") and rec.status == "ok", (rep, rec)
    assert store.head(new_key) is not None and store.head(old_key) is not None
    assert values(store) == want


# --- F. what a fenced reconciler reports when its takeover finds the key emptied -------------------


class PauseOnKeyExists(Wrapped):
    """The zombie's view: when its L1 create meets a file, it stalls (GC pause) before
    the GET that would take the file over."""

    def __init__(self, inner):
        super().__init__(inner)
        self.start_build, self.met, self.go_on = threading.Event(), threading.Event(), threading.Event()

    def put_if_absent(self, k, d):
        try:
            return self.inner.put_if_absent(k, d)
        except KeyExists:
            if k.startswith(layout.L1_ROOT):
                self.met.set()
                assert self.go_on.wait(120)
            raise


def test_a_fenced_zombie_whose_takeover_finds_the_orphan_collected_is_reported_fenced(store, gate):
    """Found a misleading report; now HELD. A crashed run left the orphan l1/t/0/0-19.
    Zombie Z claims t/0 (lease 1.5 s), plans the same 0-19 file and stalls. A live
    reconciler (one file per chunk) claims after the lease and commits 0-4 ... 15-19;
    0-19 is now an orphan behind LR. Z's create meets 0-19 (KeyExists), Z pauses; the GC
    collects the orphan; Z's GET finds nothing. Z used to report t/0 *quarantined* (the
    L1 key as its "L0 key"), and the next GC raised a quarantine alert for a healthy
    partition. Now a file gone between the create and the GET is created again, so Z's
    build succeeds and its commit is fenced: it reports "fenced" and nobody is paged
    (the file it wrote lies behind LR: a full sweep collects it)."""
    _, want = setup(store)
    with pytest.raises(RuntimeError, match="killed"):
        reconcile(store, map_files=crash_after_build(store))
    (orphan,) = l1_keys(store)
    zv = PauseOnKeyExists(store)

    def zmap(files):
        assert zv.start_build.wait(120)
        return build_files_locally(zv, files)

    zombie: list = []
    t = threading.Thread(
        target=lambda: zombie.append(reconcile(zv, config=ReconcileSettings(idle_lag=2, lease_ms=1500), map_files=zmap))
    )
    t.start()
    try:
        deadline = time.time() + 30
        while not state(store).holders and time.time() < deadline:
            time.sleep(0.05)
        assert state(store).holders, "the zombie never claimed"
        time.sleep(3.2)
        live = reconcile(store, config=ReconcileSettings(idle_lag=2, target_file_bytes=1))
        assert live.partitions[0].status == "reconciled", live.partitions
        zv.start_build.set()
        assert zv.met.wait(60)
        assert run_gc(store, gate=gate, config=SWEEP_NOW).status == "ok"
        assert store.head(orphan) is None  # collected: behind LR, named by no commit
    finally:
        zv.start_build.set()
        zv.go_on.set()
        t.join(120)
    assert values(store) == want
    committed_match_store(store)
    rec = run_gc(store, gate=gate, config=SWEEP_NOW)
    (zp,) = zombie[0].partitions
    assert zp.status == "fenced" and rec.alert is None, (
        f"the fenced zombie reported t/0 {zp.status!r}: {zp.reason!r} (key {zp.key}); the next GC alerts: {rec.alert}"
    )
