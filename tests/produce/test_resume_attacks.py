"""Adversarial review of the "progress record + trace" resume of ``ctp produce FILE``
(``ctp_state/produce_trace.py``, ``ctp_state/ingest.py``: ``resume``, ``Progress``).

The property under attack: a re-run of the same input, however long after and however
many producers wrote since (the partition may have FORGOTTEN the producer id), writes no
input record twice, never reports a record accepted/duplicate that is not in the
partition, and accounts for every record (I4).

The partitions' producer memory is made small (4 producers, 2 epochs) as in
``tests/produce/test_rerun.py`` so forgetting takes a few appends.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
from collections import Counter

import pytest

from ctp_state import codec, layout, producer_memory, state as sm
from ctp_state.deletion import delete_topic
from ctp_state.entries import AccessMode, Advance, Claim, Init, Placeholder, Reconcile, Release, Seal, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError, StoreError
from ctp_state.ingest import input_digest, input_producer_id
from ctp_state.l0 import Record
from ctp_state.produce_trace import follow, of_state
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import Wrapped, plog, values
from tests.support.produce import LoseAfter, NeverLands, assert_true_of, produce

MEMORY = (4, 2)  # MAX_PRODUCERS, PRODUCER_RETENTION_EPOCHS


@pytest.fixture(autouse=True)
def small_memory(monkeypatch):
    monkeypatch.setattr(producer_memory, "MAX_PRODUCERS", MEMORY[0])
    monkeypatch.setattr(producer_memory, "PRODUCER_RETENTION_EPOCHS", MEMORY[1])


# --- helpers ------------------------------------------------------------------------------


def the_input(n: int = 12, topics=("t",), partitions: int = 2) -> tuple[bytes, list[tuple[str, int, Record]]]:
    lines = [
        {"topic": topics[i % len(topics)], "partition": (i // len(topics)) % partitions, "value": f"v{i}"}
        for i in range(n)
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return data, [(x["topic"], x["partition"], Record(x["value"].encode())) for x in lines]


def forget(store, producer_id: str, topic="t", partitions=(0, 1), tag="o") -> None:
    """Advance past the retention and have more than MAX_PRODUCERS others write: every
    listed partition forgets ``producer_id``."""
    ce = ClusterEpoch(store)
    for _ in range(MEMORY[1] + 1):
        ce.advance()
    for i in range(MEMORY[0] + 1):
        with Producer(store, epoch_ttl_s=0, append_threads=1, producer_id=f"{tag}-{i}") as other:
            verdicts = other.write([((topic, p), [Record(f"noise-{tag}-{i}".encode())]) for p in partitions])
            assert all(v.accepted for v in verdicts), verdicts
    for p in partitions:
        st = plog(store, topic, p).read_state()
        assert producer_id not in {x.producer_id for x in st.producers}, f"{topic}/{p} still remembers it"


def mine(store, p: int, topic="t") -> list[bytes]:
    return [v for v in values(store, topic, p) if v.startswith(b"v")]


def expected_of(records, topic: str, p: int) -> list[bytes]:
    return [r.value for t, pp, r in records if (t, pp) == (topic, p)]


def assert_exactly_once(store, records, report=None) -> None:
    for t, p in sorted({(t, p) for t, p, _ in records}):
        got, want = mine(store, p, t), expected_of(records, t, p)
        dup = [v for v, c in Counter(got).items() if c > 1]
        lost = [v for v in want if v not in got]
        assert got == want, (
            f"{t}/{p}: duplicated {dup}, lost {lost}, log holds {got}",
            report.as_dict() if report is not None and hasattr(report, "as_dict") else report,
        )


def accounted(r) -> int:
    return r.accepted + r.duplicates + r.rejected + r.unknown + r.not_sent


class FailPuts(Wrapped):
    """Every plain PUT of a key matching ``prefix`` fails (the request errors out)."""

    def __init__(self, inner, prefix: str):
        super().__init__(inner)
        self.prefix, self.failed = prefix, 0

    def put(self, k, d):
        if k.startswith(self.prefix):
            self.failed += 1
            raise StoreError(f"503 Slow Down for {k!r}")
        return self.inner.put(k, d)


# --- 1. a trace taken of a partition whose init had not landed yet ---------------------------


class RepairDuringFirstFlush(Wrapped):
    """The first L0 PUT of the run: meanwhile the cluster epoch moves on and an operator
    finishes the crashed ``ctp topic create t`` (t/0's init lands with the new epoch).
    The retry of the batch the init made stale then cannot write its L0 object."""

    def __init__(self, inner):
        super().__init__(inner)
        self.l0_puts = 0

    def put(self, k, d):
        if k.startswith(layout.L0_ROOT):
            self.l0_puts += 1
            if self.l0_puts == 1:
                ClusterEpoch(self.inner).advance()
                create_topic(self.inner, "t", 2)  # finishes the crashed create: t/0's init
            elif self.l0_puts == 2:
                raise StoreError(f"503 Slow Down for {k!r}")
        return self.inner.put(k, d)


class CrashT0Init(Wrapped):
    def put_if_absent(self, k, d):
        if re.search(r"^logs/t/(?:[0-9a-f]{32}/)?000000/0{20}\.json$", k):
            raise StoreError("killed before t/0's init was written")
        return self.inner.put_if_absent(k, d)


def test_trace_of_an_uninitialized_partition_is_followed_over_its_init(store):
    """Attack: ``ctp topic create t`` crashed before t/0's init. Run 1 of the input
    resumes t/0 (uninitialized: its trace has epoch bounds -1) and saves that trace.
    While its first flush is on the wire the epoch moves on and the operator finishes
    the create (init at the new epoch), so run 1's t/0 placeholder is stale: the fold
    rejects it; its retry fails to write (503). Run 1 ends incomplete, t/0 holding none
    of the input. Run 2 follows the saved trace over the init (which ``follow`` treats
    as leaving the epoch bounds at -1) and over the stale placeholder, which it then
    decides *applied*: it skips t/0's first two records, reports them duplicates, and
    writes a completion marker while t/0 lacks them (loss)."""
    try:
        create_topic(CrashT0Init(store), "t", 2)
    except CtpError:
        pass
    t1 = plog(store, "t", 1)
    if not t1.read_state().initialized:  # the crash hit t/0 only: t/1's init had landed
        store.put_if_absent(t1.key(0), encode(Init(ClusterEpoch(store).current())))
    assert not plog(store, "t", 0).read_state().initialized and plog(store, "t", 1).read_state().initialized
    data, records = the_input()
    first = produce(RepairDuringFirstFlush(store), data, records)
    assert accounted(first) == 12 and not first.complete, first.as_dict()
    assert mine(store, 0) == [] and mine(store, 1) == expected_of(records, "t", 1)
    st0 = plog(store, "t", 0).read_state()
    assert st0.initialized and first.producer_id not in {p.producer_id for p in st0.producers}

    second = produce(store, data, records)
    assert accounted(second) == 12
    assert_exactly_once(store, records, second)
    assert second.complete and (second.duplicates, second.accepted) == (6, 6), second.as_dict()


# --- 2. the trace-vs-fold comparison, with entries the core test does not generate ---------

P = "p"


def _ph(rng, epoch, producer, seq, n=2, writer_epoch=None, key_epoch=None):
    k = epoch if key_epoch is None else key_epoch
    return Placeholder(
        epoch, f"l0/000/{k:018d}/{rng.getrandbits(64):016x}.l0", 0, 1, n, 0, writer_epoch, producer, seq, 7
    )


def _adaptive_log(rng: random.Random, n: int, uninitialized_prefix: bool):
    """A log built against its own fold, so that claims, reconciles and advances are
    really applied (the core test's advances are always rejected), and placeholders
    carry writer epochs, both current and fenced. With ``uninitialized_prefix`` the log
    starts without its init (a crashed ``ctp topic create``), which lands later."""
    st = sm.PartitionState("t", 0)
    entries: list = []
    states: list = []
    applied: list = []
    epoch = rng.randrange(1, 4)
    sent = 0

    def add(e):
        nonlocal st
        out = sm.apply(st, len(entries), e)
        entries.append(e)
        st = out.state
        states.append(st)
        applied.append(out.accepted and not out.duplicate and isinstance(e, Placeholder))

    init_at = 0
    quiet = range(n // 3, 2 * n // 3) if rng.random() < 0.5 else range(0)
    for i in range(n):
        if len(entries) == init_at and not st.initialized:
            add(Init(epoch))
            continue
        r = rng.random()
        if r < (0.35 if i in quiet else 0.12):
            epoch += 1
        owner_live = any(h.owner == "rc" and h.writer_epoch == st.writer_epoch for h in st.holders)
        if st.initialized and r < 0.06 and not owner_live:
            add(Claim(st.writer_epoch + 1, "rc", AccessMode.EXCLUSIVE, 10**15, 1))
            continue
        if st.initialized and owner_live and r < 0.14:
            if st.pending:
                first = st.last_reconciled_offset + 1
                last = st.next_offset - 1
                add(
                    Reconcile(
                        st.applied_offset,
                        last,
                        (layout.l1_key("t", 0, first, last),),
                        sm.allowed_lower_bound(st, st.applied_offset),
                        st.writer_epoch,
                    )
                )
            else:
                up = max(st.max_applied_epoch, epoch) + rng.choice([0, 1, 2])
                epoch = max(epoch, up)
                add(Advance(up, st.writer_epoch, release_owner="rc" if rng.random() < 0.3 else None))
            continue
        if st.initialized and owner_live and r < 0.16:
            add(Release("rc", st.writer_epoch))
            continue
        if 0.16 <= r < 0.163:
            add(Seal(0))
            continue
        e = max(1, epoch - rng.choice([0, 0, 0, 0, 1, 2, 3]))
        we = None
        if rng.random() < 0.1:
            we = max(1, st.writer_epoch - rng.choice([0, 0, 1]))
        if i not in quiet and rng.random() < 0.4:
            seq = rng.choice([sent, sent, sent, max(0, sent - 2), sent + 2, 0])
            key_epoch = e if rng.random() > 0.03 else e + 1
            add(_ph(rng, e, P, seq, writer_epoch=we, key_epoch=key_epoch))
            sent = max(sent, seq + 2)
        else:
            who = rng.choice([None, "a", "b", "c", "d", "e", "f"])
            add(_ph(rng, e, who, rng.randrange(0, 50) if who else None, n=1, writer_epoch=we))
    return entries, states, applied


def _check_follow_against_fold(seed: int, uninitialized_prefix: bool) -> None:
    rng = random.Random(seed)
    entries, states, applied = _adaptive_log(rng, rng.randrange(6, 60), uninitialized_prefix)
    if uninitialized_prefix:
        cut = -1  # the trace a run saves when it resumes a partition with no init yet
        start = of_state(sm.PartitionState("t", 0), P)
    else:
        cut = rng.randrange(0, len(entries))
        start = of_state(states[cut], P, held_if_forgotten=rng.randrange(0, 6) if cut >= 0 else 0)
        if next((p for p in states[cut].producers if p.producer_id == P), None) is None:
            # a forgotten P: held must be what the log really holds (the max applied end)
            held = 0
            for off in range(cut + 1):
                e = entries[off]
                if applied[off] and isinstance(e, Placeholder) and e.producer_id == P:
                    held = max(held, e.sequence + e.record_count)
            start = of_state(states[cut], P, held_if_forgotten=held)
    cur = start
    for off in range(cut + 1, len(entries)):
        nxt, doubt = follow(cur, P, [(off, entries[off])])
        if doubt is not None:
            assert isinstance(entries[off], Placeholder) and entries[off].producer_id == P
            break
        e = entries[off]
        if isinstance(e, Placeholder) and e.producer_id == P:
            said = nxt.held != cur.held or nxt.last_epoch != cur.last_epoch or nxt.known != cur.known
            assert said == applied[off], (seed, off, e, "follow said applied" if said else "follow said not", cur)
        cur = nxt
    if cur.offset < 0:
        return
    assert_true_of(states[cur.offset], cur, seed)


@pytest.mark.parametrize("seed", range(1500))
def test_follow_agrees_with_the_fold_over_claims_reconciles_and_applied_advances(seed):
    """Attack: a randomized comparison of ``follow`` against the real fold on logs built
    against their own fold, so that exclusive claims, valid reconciles, *applied*
    advances (the core test's advances are always rejected), releases, and placeholders
    under current and fenced writer epochs all occur. Whatever ``follow`` decides about
    one of P's entries, the fold decided the same; its bounds hold where it stops."""
    _check_follow_against_fold(seed, uninitialized_prefix=False)


@pytest.mark.parametrize("seed", range(200))
def test_follow_agrees_with_the_fold_from_a_trace_of_an_uninitialized_partition(seed):
    """Attack: the same comparison from the trace ``resume`` records for a partition
    whose init has not landed (``of_state`` of an uninitialized state: every epoch bound
    -1). ``follow`` passes over the init without raising the bounds to the init's
    epoch, so later decisions and the final bounds can be wrong."""
    _check_follow_against_fold(seed, uninitialized_prefix=True)


# --- 3. a topic deleted while the run is under way ----------------------------------------


def test_a_topic_deleted_between_flushes_still_gets_every_record_an_outcome(store):
    """Attack: ``ctp topic delete t`` between two flushes of a run producing to topics t
    and u. The next flush's t placeholders meet the seal (rejected, topic_deleted) and
    the Producer forgets t; then the per-flush progress update asks the producer for t's
    writers again. The run must still return a report that gives every record an
    outcome (I4), and u's records must all be written."""
    create_topic(store, "t", 2)
    create_topic(store, "u", 2)
    data, records = the_input(24, topics=("t", "u"))
    calls = []

    def on_progress(n):
        calls.append(n)
        if len(calls) == 2:  # after flush 0
            delete_topic(store, "t")

    try:
        report = produce(store, data, records, on_progress=on_progress)
    except CtpError as e:
        pytest.fail(f"produce raised {type(e).__name__}: {e} -- no report, u's later records never sent")
    assert accounted(report) == 24 and not report.complete, report.as_dict()
    for p in (0, 1):
        assert mine(store, p, "u") == expected_of(records, "u", p)


# --- 4. no usable progress record ---------------------------------------------------------


def test_a_run_whose_progress_writes_all_failed_is_not_duplicated_by_its_rerun(store):
    """Attack: every progress PUT of run 1 fails (runs/ throttled: 503). A run that
    cannot record its progress before sending would leave a re-run after the partitions
    forgot the producer nothing to resume from: the run must refuse to send, saying why."""
    create_topic(store, "t", 2)
    data, records = the_input()
    failing = FailPuts(store, "runs/produce-progress/")
    with pytest.raises(StoreError, match="nothing was sent"):
        produce(failing, data, records)
    assert failing.failed == 1 and mine(store, 0) == [] and mine(store, 1) == []


def test_a_run_whose_later_progress_writes_failed_is_not_duplicated_by_its_rerun(store):
    """Attack: run 1 records its progress before sending, then every later progress PUT
    fails (503) and one t/0 batch's response is lost (unknown). After the partitions
    forget the producer, the re-run follows the first (oldest) trace over the whole run."""
    create_topic(store, "t", 2)
    data, records = the_input()

    class FailLater(FailPuts):
        def put(self, k, d):
            if k.startswith(self.prefix) and not getattr(self, "first_done", False):
                self.first_done = True
                return self.inner.put(k, d)
            return super().put(k, d)

    lossy = LoseAfter(FailLater(store, "runs/produce-progress/"), r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2)
    first = produce(lossy, data, records)
    assert not first.complete and first.accepted == 10, first.as_dict()
    assert lossy.inner.failed >= 1
    forget(store, first.producer_id)

    second = produce(store, data, records)
    assert_exactly_once(store, records, second)
    assert second.complete and second.accepted == 0, second.as_dict()


def test_a_damaged_progress_record_does_not_make_the_rerun_resend_everything(store):
    """Attack: run 1 incomplete (a lost response), its progress record then damaged (a
    flipped byte: the checksum fails, ``Progress._read`` ignores it). After forgetting,
    the re-run cannot ask the partitions and resends from sequence 0."""
    create_topic(store, "t", 2)
    data, records = the_input()
    first = produce(LoseAfter(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2), data, records)
    assert not first.complete
    key = layout.produce_progress(first.producer_id)
    body = bytearray(store.get(key))
    body[len(body) // 2] ^= 0x01
    store.put(key, bytes(body))
    forget(store, first.producer_id)

    second = produce(store, data, records)
    assert_exactly_once(store, records, second)


# --- 5. kill -9 at every flush, the partitions forgetting between runs -------------------


def test_kill_at_every_flush_with_forgetting_between_runs(store, subprocess_env, tmp_path):
    """Attack: ``ctp produce`` is SIGKILLed after flush 0 (before its progress write);
    the partitions forget; the next run is killed after its own flush 0 again; and so on
    until one finishes. Each re-run must resume from the previous (stale) progress plus
    the log, writing each record exactly once and reporting the right counts."""
    create_topic(store, "t", 2)
    data, records = the_input(16)
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    pid = input_producer_id(input_digest(data))
    env = {**subprocess_env, "CTP_TEST_PRODUCER_MEMORY": ",".join(map(str, MEMORY))}
    cmd = ["setsid", "ctp", "produce", str(path), "--batch-records", "4", "--json"]
    for rnd in range(3):
        r = subprocess.run(cmd, env={**env, "CTP_FAULT": "produce_after_flush:0"}, capture_output=True, text=True)
        assert r.returncode in (-9, 137), (rnd, r.returncode, r.stderr[-2000:])
        assert len(mine(store, 0)) == 2 * (rnd + 1), (rnd, mine(store, 0))
        forget(store, pid, tag=f"k{rnd}")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["duplicates"], out["accepted"]) == (12, 4), out
    assert_exactly_once(store, records, out)


# --- 6. two concurrent re-runs of the same input, both resuming from the trace -----------


def test_two_concurrent_reruns_after_forgetting(store):
    """Attack: run 1 incomplete (lost response on t/0's third batch); the partitions
    forget; then two re-runs of the same input start together (threads), each resuming
    from the same progress trace and racing to write the rest and to overwrite the
    progress record. Then the partitions forget again and a third run resumes from
    whichever progress version survived. Nothing is written twice or lost."""
    create_topic(store, "t", 2)
    data, records = the_input(20)
    first = produce(NeverLands(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=1), data, records, batch_records=4)
    assert not first.complete
    forget(store, first.producer_id)
    go = threading.Barrier(2)
    reports: list = [None, None]

    def run(i):
        go.wait()
        reports[i] = produce(store, data, records, batch_records=2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in reports:
        assert r is not None and accounted(r) == 20 and r.rejected == 0, r and r.as_dict()
    assert_exactly_once(store, records, [r.as_dict() for r in reports])
    forget(store, first.producer_id, tag="again")
    third = produce(store, data, records)
    assert third.complete and third.accepted == 0, third.as_dict()
    assert_exactly_once(store, records, third)


# --- 7. a progress record from a run that had already re-learned the producer -------------


def test_progress_overwritten_by_an_older_run_is_still_followed_correctly(store):
    """Attack: a stale progress version overwriting a newer one. Run A (incomplete,
    t/0 unreachable after its first batch) saves progress; run B completes t/0 and t/1
    but its marker write fails, so no completion marker; then A's *older* progress is
    put back (a delayed PUT landing last). After forgetting, the re-run follows the
    older trace over everything B wrote."""
    create_topic(store, "t", 2)
    data, records = the_input()
    a = produce(NeverLands(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=1), data, records)
    assert not a.complete
    key = layout.produce_progress(a.producer_id)
    old = store.get(key)
    b = produce(FailMarker(store), data, records)
    assert b.complete, b.as_dict()
    assert store.head(layout.produce_marker(a.producer_id)) is None
    store.put(key, old)
    forget(store, a.producer_id)
    c = produce(store, data, records)
    assert c.complete and (c.duplicates, c.accepted) == (12, 0), c.as_dict()
    assert_exactly_once(store, records, c)


class FailMarker(Wrapped):
    def put_if_absent(self, k, d):
        if k.startswith("runs/produce/"):
            raise StoreError("503 for the marker")
        return self.inner.put_if_absent(k, d)

    def put(self, k, d):
        if k.startswith("runs/produce/"):
            raise StoreError("503 for the marker")
        return self.inner.put(k, d)


# --- 8. only some partitions forgot; replay limit 0 --------------------------------------


def test_only_one_partition_forgot_and_replay_limit_zero(store):
    """Attack: t/0 forgot the producer, t/1 still remembers it; t/0's last batch landed
    with its response lost. A re-run with ``--replay-limit 0`` must settle t/0 from the
    trace alone (no doubt in this case) and t/1 from memory."""
    create_topic(store, "t", 2)
    data, records = the_input()
    first = produce(LoseAfter(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2), data, records)
    assert (first.accepted, first.unknown) == (10, 2), first.as_dict()
    forget(store, first.producer_id, partitions=(0,))
    assert first.producer_id in {p.producer_id for p in plog(store, "t", 1).read_state().producers}
    second = produce(store, data, records, replay_limit=0)
    assert second.complete and (second.duplicates, second.accepted) == (12, 0), second.as_dict()
    assert_exactly_once(store, records, second)


# --- 9. the progress record is of another input's bytes ----------------------------------


def test_progress_of_another_input_is_not_believed(store):
    """Attack: a progress record under this input's producer id but recording another
    digest (a forged/foreign record) is ignored, and the run (a first run of the input)
    writes everything once."""
    create_topic(store, "t", 2)
    data, records = the_input()
    pid = input_producer_id(input_digest(data))
    tid = plog(store, "t", 0).topic_id
    body = {
        "v": 1,
        "producer_id": pid,
        "digest": "0" * 64,
        "records": 12,
        "topics": {"t": tid},
        "partitions": {"t/0": [6, 0, "no", -1, 1, 1, 1, 0, False], "t/1": [6, 0, "no", -1, 1, 1, 1, 0, False]},
    }
    store.put(layout.produce_progress(pid), codec.seal(body))
    r = produce(store, data, records)
    assert r.complete and r.accepted == 12, r.as_dict()
    assert_exactly_once(store, records, r)


# --- 10. lost responses on the progress PUT itself ----------------------------------------


class ProgressResponsesLost(Wrapped):
    """Every progress PUT is carried out but its response is lost (the run is told it
    failed); the log stays reachable except that t/0's third batch's response is lost."""

    def put(self, k, d):
        self.inner.put(k, d)
        if k.startswith("runs/produce-progress/"):
            raise StoreError(f"connection reset after the request for {k!r} was sent")


def test_lost_responses_on_every_progress_put(store):
    """Attack: every progress write lands but the run is told it failed (it only logs
    that); run 1's third t/0 batch lands with its response lost; the partitions forget;
    the re-run must still resume from the progress that did land."""
    create_topic(store, "t", 2)
    data, records = the_input()
    first = produce(LoseAfter(ProgressResponsesLost(store), r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2), data, records)
    assert (first.accepted, first.unknown) == (10, 2), first.as_dict()
    forget(store, first.producer_id)
    second = produce(store, data, records)
    assert second.complete and (second.duplicates, second.accepted) == (12, 0), second.as_dict()
    assert_exactly_once(store, records, second)
