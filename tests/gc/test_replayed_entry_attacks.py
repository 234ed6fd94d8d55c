"""Found by review: the same entry written twice, by another run or by the same one.

A reconcile entry that does not release its claim names no run of
its own -- its bytes follow from the state before it -- so two reconcilers that claim
the same writer epoch (the first one's claim lost by the store) can write it byte for
byte. Reconciler R1 claims at J, placeholder A lands at J+1, R1 commits at K = J+2 and
stalls before its advance; the GC packs the state at K; the store loses J..K; R2 claims
at J with the same writer epoch, placeholder B lands at J+1, and R2's commit at K is
R1's, byte for byte. A reconciler starting from the pack took A for pending and B for
nothing: B's L0 object was deleted and A's record read at B's offset. Such an entry
vouches for a stored state only while its writer epoch's claim is the claim of the
owner the state holds."""

from __future__ import annotations

import time

import pytest

from ctp_state import codec, crashpoints, entries as en
from ctp_state.entries import Placeholder, Reconcile, Release
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import StoreError
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.gc.test_state_identity_attacks import epoch, gc
from tests.support import Wrapped, assert_exactly_once, plog, reconcile

# each scenario on both of the reconciler's read paths (docs/design.md 14: quiet partitions)
pytestmark = pytest.mark.usefixtures("both_read_paths")


class Crash(BaseException):
    pass


class Dies(Wrapped):
    dead = False

    def _chk(self):
        if self.dead:
            raise Crash("process is gone")

    def get(self, k):
        self._chk()
        return super().get(k)

    def get_range(self, k, s, n):
        self._chk()
        return super().get_range(k, s, n)

    def put(self, k, d):
        self._chk()
        return super().put(k, d)

    def put_if_absent(self, k, d):
        self._chk()
        return super().put_if_absent(k, d)

    def head(self, k):
        self._chk()
        return super().head(k)

    def list(self, prefix="", start_after=None, end_before=None):
        self._chk()
        return super().list(prefix, start_after, end_before)


def produce(store, value):
    with Producer(store, epoch_ttl_s=0) as p:
        v = p.write([(("t", 0), [Record(value)])])[0]
    assert v.accepted, v.error
    return v


def x_written(store, gate):
    """Topic ``t`` (one partition) two epochs on, the cluster epoch advanced and ``x``
    written to it: its log."""
    create_topic(store, "t", 1)
    for _ in range(2):
        epoch(store, gate)
    ClusterEpoch(store).advance()
    produce(store, b"x")
    return plog(store, "t", 0)


@pytest.mark.parametrize("writers", ["chained", "unchained"])
def test_an_identical_commit_by_another_run_does_not_vouch_for_a_stale_pack(store, gate, writers, monkeypatch):
    """``chained``: entries name the CRC32C of the entry before them (version 6), so the
    second commit differs in its bytes. ``unchained``: written as a ctp before version 6
    writes them, the commits are identical, and the claim check catches it."""
    if writers == "unchained":
        encode = en.encode
        monkeypatch.setattr(en, "encode", lambda entry, prev=None: encode(entry))
    cfg = ReconcileSettings(idle_lag=2, lease_ms=300)
    log = x_written(store, gate)
    ClusterEpoch(store).advance()
    ClusterEpoch(store).advance()
    j = log.read_state().applied_offset + 1  # where R1's claim lands
    k = j + 2
    r1store = Dies(store)
    seen = {}

    def hook(point, index):
        if point == "after_claim" and "a" not in seen:
            seen["a"] = produce(store, b"a")  # lands at j+1 during R1's build
        elif point == "after_commit" and "gc" not in seen:
            seen["gc"] = gc(store, gate, full=True)  # G1 packs the state at k (R1 stalls here)
            pack = newest_pack(store)
            st, crc = pack.states[("t", 0)]
            seen["pack"] = (st.applied_offset, crc, [p.l0_key for p in st.pending])
            seen["old_k"] = store.get(log.key(k))
            store.delete_many([log.key(o) for o in range(j, k + 1)])  # the store loses R1's claim, A, commit
            r1store.dead = True
            raise Crash("R1 dies")
        elif point == "after_claim" and "b" not in seen:
            seen["b"] = produce(store, b"b")  # lands at j+1 during R2's build

    crashpoints.install(hook)
    try:
        with pytest.raises(Crash):
            reconcile(r1store, config=cfg)
        assert seen["pack"][0] == k, seen["pack"]
        old = en.decode(seen["old_k"], "k")
        assert isinstance(old, Reconcile) and old.release_owner is None, old
        reconcile(store, config=cfg)  # R2: claims at j, B lands at j+1, commits at k
    finally:
        crashpoints.install(None)
    assert isinstance(dict(log.entries())[j + 1], Placeholder)
    identical = codec.crc32c(store.get(log.key(k))) == seen["pack"][1]
    assert identical == (writers == "unchained"), "R2's commit is byte-identical only when unchained"
    time.sleep(0.5)  # R1's lease (in the pack's state) runs out
    for _ in range(4):
        reconcile(store, config=cfg)
        ClusterEpoch(store).advance()
        gc(store, gate)
    # (A's entry was lost by the store; B is the record at its offset now)
    assert_exactly_once(store, "t", {0: [Record(b"x"), Record(b"b")]}, all_in_l1=True)


class Flaky(Wrapped):
    """R's view of the store: the create of ``slot`` fails without landing while it
    holds a Reconcile (the store is unreachable for a few seconds), and the first
    Release created there lands, ``meanwhile()`` runs, and its response is lost."""

    def __init__(self, inner, slot, meanwhile):
        super().__init__(inner)
        self.slot, self.meanwhile, self.fired = slot, meanwhile, False

    def put_if_absent(self, k, d):
        if k == self.slot:
            e = en.decode(d, k)
            if isinstance(e, Reconcile):
                raise StoreError(f"503 for {k!r}")
            if isinstance(e, Release) and not self.fired:
                self.inner.put_if_absent(k, d)
                self.fired = True
                self.meanwhile()
                raise StoreError(f"connection reset after the request for {k!r} was sent")
        return self.inner.put_if_absent(k, d)


def test_a_second_release_by_the_same_run_does_not_vouch_for_a_stale_pack(store, gate):
    """Found by the second review: a release entry is (owner, writer epoch), so a run
    that releases twice writes it twice -- the reconciler's commit releases, and when
    that release's outcome is unknown the run's cleanup (``release_held``) releases
    again, a *new* append from a fresh read, which no re-send check covers. R claims at
    J; A lands at J+1; R's commit at K = J+2 never lands (the store unreachable); its
    release at K lands and the response is lost; meanwhile the GC packs the state at K
    (A pending), the store loses J+1 and K, and B lands at J+1; R's cleanup releases at
    K again. Unchained, that release was the first one byte for byte: the next reconcile
    from the pack lifted A into B's offset and the GC deleted B's L0 object. Chained
    (the entry names the CRC32C of the one before it: B's, not A's), the bytes differ."""
    cfg = ReconcileSettings(idle_lag=2, lease_ms=300)
    log = x_written(store, gate)
    ClusterEpoch(store).advance()
    j = log.read_state().applied_offset + 1  # R's claim
    k = j + 2  # A at j+1, R's release at j+2
    seen = {}

    def meanwhile():
        seen["gc"] = gc(store, gate, full=True)  # the GC packs the state at k (A pending, R's release)
        st, crc = newest_pack(store).states[("t", 0)]
        seen["pack"] = (st.applied_offset, crc, [p.l0_key for p in st.pending])
        seen["old_k"] = store.get(log.key(k))
        store.delete_many([log.key(j + 1), log.key(k)])  # the store loses its two newest entries
        seen["b"] = produce(store, b"b")  # B lands at j+1

    def hook(point, index):
        if point == "after_claim" and "a" not in seen:
            seen["a"] = produce(store, b"a")  # lands at j+1 during R's build

    crashpoints.install(hook)
    try:
        reconcile(Flaky(store, log.key(k), meanwhile), config=cfg)
    finally:
        crashpoints.install(None)
    assert seen["pack"][0] == k, seen["pack"]
    assert seen["a"].l0_key in seen["pack"][2]
    entries = dict(log.entries())
    assert isinstance(entries[j + 1], Placeholder) and entries[j + 1].l0_key == seen["b"].l0_key
    assert isinstance(entries[k], Release)  # the cleanup's release
    for _ in range(4):
        reconcile(store, config=cfg)
        ClusterEpoch(store).advance()
        gc(store, gate)
    # (A's entry was lost by the store; B is the record at its offset now)
    assert_exactly_once(store, "t", {0: [Record(b"x"), Record(b"b")]}, all_in_l1=True)
    assert store.get(log.key(k)) != seen["old_k"]  # the two releases differ in their bytes


def test_a_stale_commit_under_a_reissued_writer_epoch_has_no_effect(store, gate):
    """Found by the fourth review: no identical bytes at all. Reconciler R1 claimed at
    J+1 (writer epoch w) and built A's file; before its commit the store loses J (A's
    placeholder) and J+1 (R1's claim); B lands at J and another claimer takes the same
    writer epoch w at J+1; R1 commits (no release: an advance is due) at J+2 from its own
    state -- and was accepted under the other's claim: B marked lifted into the file of
    A's records, its L0 object deleted. The commit names (``prev``) R1's lost claim, not
    the entry before it: it is forked, and a claim holder's forked entry has no effect."""
    from ctp_state.entries import AccessMode
    from ctp_state.errors import EntryForked

    log = x_written(store, gate)
    epoch(store, gate)
    produce(store, b"a")
    ClusterEpoch(store).advance()
    ClusterEpoch(store).advance()
    j = log.read_state().applied_offset  # A's placeholder
    seen = {}

    def hook(point, index):
        if point == "before_commit" and "b" not in seen:
            store.delete_many([log.key(j), log.key(j + 1)])  # A and R1's claim: the suffix
            seen["b"] = produce(store, b"b")  # lands at J
            other = plog(store, "t", 0)
            got = other.claim(other.read_state(), "compactor:other", AccessMode.EXCLUSIVE, lease_ms=60_000)
            assert got.offset == j + 1 and got.outcome.accepted, got
            seen["other"] = (other, got.outcome.state)

    crashpoints.install(hook)
    try:
        reconcile(store)  # R1
    finally:
        crashpoints.install(None)
    other, st = seen["other"]
    assert isinstance(dict(log.entries())[j + 2], Reconcile)
    st = plog(store, "t", 0).read_state()
    assert [p.l0_key for p in st.pending] == [seen["b"].l0_key]  # R1's commit did not lift B
    other.release(st, "compactor:other", seen["other"][1].writer_epoch)
    # R1's file (A's records at B's offsets) is committed by nothing: the next reconcile
    # finds it in the way and quarantines the partition, naming it (it never replaces a
    # file that could be committed; nothing is lost), and the operator deletes it as the
    # message says. (A liveness cost of this store fault, in docs/design.md section 14.)
    ClusterEpoch(store).advance()
    s = reconcile(store)
    (part,) = s.partitions
    assert part.status == "quarantined" and "an L1 file in the way holds other records" in part.reason, part
    assert store.head(seen["b"].l0_key) is not None
    in_way = part.reason.split("'")[1]
    assert in_way.startswith("l1/") and in_way not in plog(store, "t", 0).read_state().committed_l1_keys()
    store.delete_many([in_way])
    for _ in range(4):
        epoch(store, gate)
    # (A's entry was lost by the store; B is the record at its offset now)
    assert_exactly_once(store, "t", {0: [Record(b"x"), Record(b"b")]}, all_in_l1=True)
    from ctp_state import state as sm

    s = plog(store, "t", 0, write_snapshots=False).empty_state()
    verdicts = {}
    prev_crc = None
    for o in range(j + 3):
        data = store.get(log.key(o))
        e, prev = en.decode_chained(data, log.key(o))
        out = sm.apply(s, o, e, forked=prev is not None and prev_crc is not None and prev != prev_crc)
        verdicts[o], s, prev_crc = out.rejected, out.state, codec.crc32c(data)
    assert isinstance(verdicts[j + 2], EntryForked)
