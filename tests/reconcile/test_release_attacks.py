"""The claim released in the partition's last entry (``release_owner`` on a reconcile or
advance), attacked where the reconciler's choice of that entry can be wrong.

The reconciler decides once, from the state at its claim, whether an advance will be
due after its reconcile: if so, the reconcile does not release and the advance does.
Every scenario below must end with no claim left held, nothing lost or doubled, and
the GC keeping what pending records need:

* a producer appends while the run builds, so the advance it planned is not due: the
  reconcile landed without releasing, no advance is written, a separate release is;
* the run's lease runs out while it builds and another reconciler takes the partition
  over: the late releasing reconcile is fenced as a whole (it releases nothing, the new
  holder keeps its claim), and the separate release is refused too;
* the releasing entry names an owner other than the claim's: refused whole by the
  state machine, so neither the commit nor the release takes effect.
"""

from __future__ import annotations

from ctp_state import entries as en, reconcile as rc
from ctp_state.entries import AccessMode
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import plog, produce_rounds, reconcile
from tests.support.snapshot import advance, converges


def _entries(store, topic="t", p=0) -> list[en.Entry]:
    return [e for _, e in plog(store, topic, p, write_snapshots=False).entries()]


def test_a_planned_advance_refused_after_a_producer_wrote_leaves_no_claim_held(fstore, gate):
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=2, per=5)
    advance(store, 3)  # the reconcile will leave the partition caught up and behind C
    late = Record(b"written-while-the-run-builds")

    def build_then_produce(files):
        out = rc.build_files_locally(store, files)
        with Producer(store, epoch_ttl_s=0) as prod:
            assert prod.write([(("t", 0), [late])])[0].accepted
        sent[0].append(late)
        return out

    s = reconcile(store, config=ReconcileSettings(idle_lag=2, threads=1), map_files=build_then_produce)
    assert s.partitions_reconciled == 1, s
    tail = _entries(store)[-4:]
    assert [type(e).__name__ for e in tail] == ["Claim", "Placeholder", "Reconcile", "Release"], tail
    assert tail[2].release_owner is None  # it planned the advance ...
    assert plog(store, "t", 0).read_state().holders == ()  # ... and released without it
    converges(store, gate, sent, 1)


def test_a_fenced_releasing_reconcile_releases_nothing_and_the_new_holder_keeps_its_claim(fstore, gate):
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=2, per=5)  # no advance due after: it releases
    taken: dict[str, int] = {}

    def build_then_lose_the_claim(files):
        out = rc.build_files_locally(store, files)
        log = plog(store, "t", 0)
        st = log.read_state()
        (mine,) = st.holders
        # The run's lease is judged over (as if it had run past it): another reconciler
        # names it lapsed and takes the partition.
        got = log.append(
            st,
            lambda s: en.Claim(
                s.writer_epoch + 1,
                "reconciler:other",
                AccessMode.EXCLUSIVE,
                mine.lease_until_ms + 60_000,
                mine.lease_until_ms + 1,
            ),
        ).outcome
        assert got.accepted, got.rejected
        taken["we"] = got.state.writer_epoch
        return out

    s = reconcile(store, config=ReconcileSettings(idle_lag=2, threads=1), map_files=build_then_lose_the_claim)
    assert s.partitions_fenced == 1 and s.partitions_reconciled == 0, s
    st = plog(store, "t", 0).read_state()
    assert [(h.owner, h.writer_epoch) for h in st.holders] == [("reconciler:other", taken["we"])]
    assert st.pending and st.l1_ends == ()  # the late commit took no effect
    tail = _entries(store)[-3:]
    assert [type(e).__name__ for e in tail] == ["Claim", "Reconcile", "Release"], tail
    assert tail[1].release_owner is not None  # it tried to release in the reconcile: fenced whole
    # The other reconciler releases (or its lease runs out); then everything converges.
    log = plog(store, "t", 0)
    assert log.release(log.read_state(), "reconciler:other", taken["we"]).outcome.accepted
    converges(store, gate, sent, 1)


def test_a_releasing_entry_naming_another_owner_changes_nothing(fstore, gate):
    store = fstore
    create_topic(store, "t", 1)
    c = advance(store, 3)  # idle and behind C: an advance is due
    log = plog(store, "t", 0)
    st = log.claim(log.read_state(), "reconciler:a", AccessMode.EXCLUSIVE, lease_ms=60_000).outcome.state
    we, bound = st.writer_epoch, st.min_epoch_lower_bound
    out = log.append(st, lambda s: en.Advance(c, we, "reconciler:b")).outcome
    assert out.rejected is not None and "which it does not hold" in str(out.rejected)
    after = plog(store, "t", 0).read_state()
    assert [(h.owner, h.writer_epoch) for h in after.holders] == [("reconciler:a", we)]
    assert after.min_epoch_lower_bound == bound  # the advance took no effect either
    assert log.append(after, lambda s: en.Advance(c, we, "reconciler:a")).outcome.accepted
    done = plog(store, "t", 0).read_state()
    assert done.holders == () and done.min_epoch_lower_bound == c
    converges(store, gate, {0: []}, 1)
