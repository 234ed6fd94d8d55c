"""Whole GC runs behind the real Great Expectations gate, on both backends: M, what is
deleted and what is kept, the history, the gate stopping a run before any delete,
stale inputs, failing deletes, temporary files, and the offline report. (The L1 sweep's
orphans and watermark: test_l1_sweep.py.)"""

from __future__ import annotations

import os
import re

import msgspec
import pyarrow as pa
import pytest

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData, GateFailed, StoreError
from ctp_state.gc import prepare, run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.gc.prepare import GateResult
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.settings import GcSettings
from ctp_state.storage import LocalStore
from ctp_state.topics import create_topic
from expectations.job import gc_job
from tests.support import assert_exactly_once, produce_rounds, reconcile
from tests.support.gc import FlakyStore, l0_epochs, reconciled


def test_m_with_no_partitions_is_c_minus_1_and_is_recorded(store, gate):
    for _ in range(3):
        ClusterEpoch(store).advance()
    rec = run_gc(store, gate=gate)
    assert (rec.status, rec.m, rec.cluster_epoch, rec.partitions) == ("ok", 3, 4, 0)
    assert rec.gate.success and rec.gate.statistics["unsuccessful"] == 0
    assert GcHistory(store).get(0) == rec


def test_dry_run_then_gc_deletes_exactly_the_l0_objects_at_or_below_m(store, gate):
    sent = reconciled(store)
    with Producer(store, epoch_ttl_s=0) as prod:  # live data above M: written after the last reconcile
        live = prod.write([(("t", 0), [Record(b"not reconciled yet")])])[0]
    sent[0].append(Record(b"not reconciled yet"))
    before = l0_epochs(store)

    dry = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    m = dry.m
    garbage = {k for k, e in before.items() if e <= m}
    assert garbage and live.l0_key not in garbage
    assert dry.status == "dry_run" and dry.would_delete == len(garbage) and dry.deleted == 0
    assert l0_epochs(store) == before  # nothing deleted

    rec = run_gc(store, gate=gate)
    assert rec.m == m and rec.deleted == len(garbage)
    assert rec.deleted_bytes == dry.would_delete_bytes > 0
    assert set(l0_epochs(store)) == set(before) - garbage
    assert_exactly_once(store, "t", sent, all_in_l1=False)  # I1: nothing a reader needs is gone
    assert [r.status for r in GcHistory(store).tail(10)] == ["dry_run", "ok"]


def test_every_deleted_key_is_on_record_with_its_epoch_size_and_outcome(store, gate):
    """The audit trail: a run's record names the epoch range and a sample of what it
    deleted (a dry run: would delete), and ``gc/deleted/<seq>-<run id>.parquet`` lists
    every key with its epoch, size and outcome; keys that still fail are ``failed``."""
    reconciled(store, rounds=4)
    before = l0_epochs(store)
    sizes = {o.key: o.size for o in store.list(layout.L0_ROOT)}
    h = GcHistory(store)

    dry = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    garbage = {k: e for k, e in before.items() if e <= dry.m}
    assert len(garbage) >= 2
    rows = h.read_deletes(dry.deletes_key).to_pylist()
    assert dry.deletes_key == layout.gc_deletes_key(dry.seq, dry.run_id)
    assert {r["key"]: (r["epoch"], r["size"], r["outcome"], r["kind"]) for r in rows} == {
        k: (e, sizes[k], "would_delete", "l0") for k, e in garbage.items()
    }
    assert dry.delete_epochs == (min(garbage.values()), max(garbage.values()))
    assert dry.delete_sample == tuple(sorted(garbage)[: len(dry.delete_sample)]) and dry.delete_sample

    broken = sorted(garbage)[0]
    rec = run_gc(FlakyStore(store, throttle=0, broken=frozenset([broken])), gate=gate)
    assert rec.status == "partial" and rec.deletes_key and rec.deletes_key != dry.deletes_key
    outcomes = {r["key"]: r["outcome"] for r in h.read_deletes(rec.deletes_key).to_pylist()}
    assert outcomes == {k: "failed" if k == broken else "deleted" for k in garbage}
    assert all((store.head(k) is None) == (v == "deleted") for k, v in outcomes.items())
    assert h.get(rec.seq).deletes_key == rec.deletes_key  # the record as stored points at it


def test_an_m_decrease_stops_the_gc_before_any_delete(store, gate):
    reconciled(store)
    first = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    # A history that says M was higher than it can be now: a state restored from an
    # older backup, or a bug. The candidate M would decrease.
    GcHistory(store).append(
        lambda seq: msgspec.structs.replace(first, status="ok", m=first.m + 5, m_high_water=first.m + 5)
    )
    before = l0_epochs(store)
    with pytest.raises(GateFailed) as err:
        run_gc(store, gate=gate)
    assert l0_epochs(store) == before
    text = " ".join(err.value.failures)
    assert "expect_column_values_to_be_increasing(column=m" in text
    assert "m_high_water_before" in text
    assert str(err.value).startswith("GC gate failed, nothing deleted:")
    last = GcHistory(store).tail(1)[0]
    assert last.status == "gate_failed" and list(last.gate.failures) == err.value.failures


def test_a_lower_bound_decrease_fails_the_partition_state_suite(store, gate):
    reconciled(store)
    first = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    h = GcHistory(store)
    view = h.read_partition_table(first.partitions_key)
    raised = view.set_column(
        view.schema.get_field_index("min_epoch_lower_bound"),
        "min_epoch_lower_bound",
        [[v + 10 for v in view.column("min_epoch_lower_bound").to_pylist()]],
    )
    h.append(lambda seq: msgspec.structs.replace(first, partitions_key=h.write_partitions(seq, raised, "edited")))
    before = l0_epochs(store)
    with pytest.raises(GateFailed, match="partition_state"):
        run_gc(store, gate=gate)
    assert l0_epochs(store) == before


def test_a_gate_failed_runs_view_is_never_the_reference(store, gate):
    """R9/I3: a run the gate refused keeps its partition view for the report, but the
    next run checks lower bounds against the newest *passing* run. Were the refused
    view the reference, a view it read from damaged state (here: lower bounds raised
    by 10) would fail every later run on a "decrease" and wedge the GC for good."""
    reconciled(store)
    first = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    h = GcHistory(store)
    first_lb = {(r.topic, r.partition): r.min_epoch_lower_bound for r in h.read_partitions(first.partitions_key)}
    ce = ClusterEpoch(store)
    ce.advance()
    ce.advance()
    reconcile(store)  # R6: every idle partition's lower bound moves up

    refused = GateResult(False, ["refused for the test"])
    with pytest.raises(GateFailed, match="refused for the test"):
        run_gc(store, gate=lambda frames: refused)
    failed = h.tail(1)[0]
    assert failed.status == "gate_failed" and failed.partitions_key  # its view is on record
    view = h.read_partition_table(failed.partitions_key)
    now_lb = dict(
        zip(
            zip(view.column("topic").to_pylist(), view.column("partition").to_pylist()),
            view.column("min_epoch_lower_bound").to_pylist(),
            strict=True,
        )
    )
    assert all(now_lb[k] > first_lb[k] for k in first_lb)  # the two views differ
    # What the refused run saw was damaged: raise its bounds beyond anything real.
    store.put(
        failed.partitions_key,
        _parquet(
            view.set_column(
                view.schema.get_field_index("min_epoch_lower_bound"),
                "min_epoch_lower_bound",
                [[v + 10 for v in view.column("min_epoch_lower_bound").to_pylist()]],
            )
        ),
    )

    p = prepare(store)
    state = p.frames["partition_state"]
    previous = dict(
        zip(
            zip(state.column("topic").to_pylist(), state.column("partition").to_pylist()),
            state.column("previous_min_epoch_lower_bound").to_pylist(),
            strict=True,
        )
    )
    assert previous == first_lb
    rec = run_gc(store, gate=gate)
    assert rec.status == "ok" and rec.deleted > 0


def _parquet(table: pa.Table) -> bytes:
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_a_partition_created_while_the_gc_runs_keeps_its_data(store, gate):
    reconciled(store)

    class CreatingStore(FlakyStore):
        fired = False

        def list(self, prefix="", start_after=None, end_before=None):
            listed = list(self.inner.list(prefix, start_after, end_before))
            if prefix == "meta/topics/" and not CreatingStore.fired:
                # After C was read and the topics were listed: this GC never sees it.
                CreatingStore.fired = True
                create_topic(self.inner, "late", 2)
                with Producer(self.inner, epoch_ttl_s=0) as prod:
                    assert prod.write([(("late", 1), [Record(b"keep me")])])[0].accepted
            return iter(listed)

    rec = run_gc(CreatingStore(store), gate=gate)
    assert CreatingStore.fired and rec.m < rec.cluster_epoch
    assert [r["value"] for r in read_partition(store, "late", 1).to_pylist()] == [b"keep me"]
    rec2 = run_gc(store, gate=gate)  # and the next run sees it, with M still monotonic
    assert rec2.partitions == rec.partitions + 2 and rec2.m >= rec.m
    assert [r["value"] for r in read_partition(store, "late", 1).to_pylist()] == [b"keep me"]


def test_m_comes_from_the_logs_and_the_newest_summary_only_annotates(store, gate):
    produce_rounds(store, partitions=4, rounds=2, per=5)
    first = reconcile(store)
    rec = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    assert rec.summary_run_id == first.run_id  # the newest by the store's sequence
    assert rec.partitions == 4 and rec.m is not None
    second = reconcile(store)
    rec2 = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    assert rec2.summary_run_id == second.run_id and rec2.m_digest == rec.m_digest


def test_temporary_files_killed_writes_left_are_swept_once_old(store, gate, tmp_path):
    reconciled(store, rounds=1)
    if not isinstance(store, LocalStore):  # S3 puts are whole or absent: nothing is left behind
        assert store.sweep_temporary(0) == 0
        return
    tmp = os.path.join(store.root, ".ctp-tmp")
    old, fresh = os.path.join(tmp, "killed-an-hour-ago"), os.path.join(tmp, "being-written")
    for path in (old, fresh):
        with open(path, "wb") as f:
            f.write(b"x" * 100)
    os.utime(old, (os.path.getmtime(old) - 7200,) * 2)
    rec = run_gc(store, gate=gate)
    assert rec.tmp_deleted == 1
    assert not os.path.exists(old) and os.path.exists(fresh)
    assert not [o for o in store.list("") if ".ctp-tmp" in o.key]  # never listed as a key
    # a write whose temporary file a sweep took fails, naming the key; nothing is written
    real_write = store._write_tmp

    def write_then_swept(data: bytes) -> str:
        path = real_write(data)
        os.unlink(path)
        return path

    store._write_tmp = write_then_swept  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="'probe/x'.*temporary file was removed"):
        store.put_if_absent("probe/x", b"data")
    assert store.head("probe/x") is None


class EndpointDown(FlakyStore):
    """Every request fails once the L0 listing started: the endpoint went down."""

    down = False

    def _check(self, what: str) -> None:
        if self.down:
            raise StoreError(f"{what}: could not connect to the endpoint")

    def get(self, k):
        self._check(f"reading {k}")
        return self.inner.get(k)

    def put_if_absent(self, k, d):
        self._check(f"writing {k}")
        return self.inner.put_if_absent(k, d)

    def list(self, prefix="", start_after=None, end_before=None):
        if prefix.startswith(layout.L0_ROOT):
            self.down = True
        self._check(f"listing {prefix}")
        return self.inner.list(prefix, start_after, end_before)

    def list_level(self, prefix):
        if prefix.startswith(layout.L0_ROOT):
            self.down = True
        self._check(f"listing {prefix}")
        return self.inner.list_level(prefix)


def test_an_endpoint_that_goes_down_while_listing_is_reported_as_the_listing(store, gate):
    reconciled(store)
    before = l0_epochs(store)
    with pytest.raises(StoreError) as e:
        run_gc(EndpointDown(store), gate=gate)
    assert "listing l0/" in str(e.value) and "gc/history" not in str(e.value)  # not the failed record's write
    assert l0_epochs(store) == before


class LostDeleteResponse(FlakyStore):
    """The endpoint deletes the batch, then the connection drops before the answer."""

    def _delete_batch(self, keys):
        self.inner._delete_batch(keys)
        raise StoreError("deleting a batch: connection reset before the response")


def test_a_run_that_fails_while_deleting_puts_every_planned_key_on_record_as_unknown(store, gate):
    """The audit trail of a run cut off part way: its record points at a deletes table
    naming every key it planned, each ``unknown`` (deleted, in flight or never sent)."""
    reconciled(store)
    garbage = {
        k for k, e in l0_epochs(store).items() if e <= run_gc(store, gate=gate, config=GcSettings(dry_run=True)).m
    }
    assert garbage
    with pytest.raises(StoreError, match="connection reset"):
        run_gc(LostDeleteResponse(store), gate=gate)
    rec = GcHistory(store).tail(1)[0]
    assert rec.status == "failed" and rec.deletes_key
    rows = GcHistory(store).read_deletes(rec.deletes_key).to_pylist()
    assert {r["key"]: r["outcome"] for r in rows} == dict.fromkeys(garbage, "unknown")


def test_unparseable_l0_keys_stop_the_run_and_are_recorded(store, gate):
    reconciled(store)
    store.put("l0/005/not-an-epoch/x.l0", b"?")
    before = l0_keys_safe = {o.key for o in store.list(layout.L0_ROOT)}
    with pytest.raises(CorruptData, match="l0/005/not-an-epoch/x.l0"):
        run_gc(store, gate=gate)
    assert {o.key for o in store.list(layout.L0_ROOT)} == before == l0_keys_safe
    assert GcHistory(store).tail(1)[0].status == "failed"


def test_throttled_and_failing_deletes_make_a_partial_run_that_the_next_run_finishes(store, gate):
    reconciled(store, rounds=4)
    garbage = sorted(l0_epochs(store))[:2]
    flaky = FlakyStore(store, throttle=1, broken=frozenset(garbage[:1]))
    rec = run_gc(flaky, gate=gate)
    assert rec.status == "partial" and rec.delete_errors == 1 and list(rec.failed_keys) == garbage[:1]
    assert rec.delete_retries > 0 and store.head(garbage[0]) is not None
    rec2 = run_gc(store, gate=gate)
    assert rec2.status == "ok" and rec2.deleted == 1 and store.head(garbage[0]) is None


def test_max_deletes_takes_the_lowest_epochs_first(store, gate):
    reconciled(store, rounds=4)
    keys = sorted(l0_epochs(store).items(), key=lambda kv: (kv[1], kv[0]))
    rec = run_gc(store, gate=gate, config=GcSettings(max_deletes=2))
    assert rec.deleted == 2 and rec.skipped_max_deletes > 0
    assert all(store.head(k) is None for k, _ in keys[:2])


def test_the_report_reads_offline(store, tmp_path):
    reconciled(store)
    out = gc_job(store, GcSettings(), str(tmp_path / "report"))
    assert out.error is None and out.record.status == "ok"
    page = open(out.report, encoding="utf-8").read()
    assert f"M = {out.record.m}" in page and "<svg" in page
    pages = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "report") for n in ns if n.endswith(".html")]
    assert len(pages) >= 5  # summary + Data Docs index + 3 validation results + suites
    remote = re.compile(r"<(?:link|script|img)\b[^>]*(?:src|href)=\"(?:https?:)?//", re.I)
    for p in pages:
        assert not remote.search(open(p, encoding="utf-8").read()), p
    assert os.path.exists(out.docs)
    # published into the store on request, same layout
    out2 = gc_job(store, GcSettings(dry_run=True), str(tmp_path / "report"), publish_to_store=True)
    assert out2.published >= len(pages) and b"ctp GC report" in store.get("reports/gc/index.html")


def test_history_records_are_append_only_and_versioned(store, gate):
    run_gc(store, gate=gate)
    run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    h = GcHistory(store)
    assert h.last_seq() == 1 and [r.seq for r in h.records()] == [0, 1]
    assert store.head(h.get(1).partitions_key) is not None
    from ctp_state.errors import KeyExists

    with pytest.raises(KeyExists):
        store.put_if_absent("gc/history/00000000000000000001.json", b"{}")
    from ctp_state import codec

    store.put("gc/history/00000000000000000002.json", codec.seal({"v": 99}))
    with pytest.raises(CorruptData, match="version 99 is not supported"):
        list(h.records())
    # A flipped digit in a record (M 3 -> 9 would wedge every later run) is caught.
    key = "gc/history/00000000000000000000.json"
    store.put(key, store.get(key).replace(b'"seq":0', b'"seq":5'))
    with pytest.raises(CorruptData, match="fails its CRC32C check"):
        h.get(0)


def test_a_concurrent_gc_that_saw_a_higher_m_supersedes_a_slower_one(store, gate):
    reconciled(store)
    ce = ClusterEpoch(store)
    inner: list[dict] = []

    def slow_gate(frames):
        # While this run sits at its gate, the cluster moves on and another GC records
        # a higher M first.
        ce.advance()
        ce.advance()
        reconcile(store)
        inner.append(run_gc(store, gate=gate))
        return gate(frames)

    slow = run_gc(store, gate=slow_gate)
    assert inner[0].m > slow.m and inner[0].seq < slow.seq
    assert slow.status == "superseded" and slow.m_high_water == inner[0].m_high_water
    nxt = run_gc(store, gate=gate)  # the history stays monotonic: the next run passes
    assert nxt.status == "ok" and nxt.m >= inner[0].m


def test_a_pending_placeholder_at_or_below_m_fails_the_partition_state_suite(gate):
    from tests.support.gc import gate_frames

    frames = gate_frames()
    state = frames["partition_state"]
    m = [5] * state.num_rows
    for pending, ok in (([6, None, 9], True), ([6, 5, None], False), ([4, None, None], False)):
        t = state.set_column(
            state.schema.get_field_index("min_pending_epoch"), "min_pending_epoch", pa.array(pending, pa.int64())
        )
        t = t.set_column(t.schema.get_field_index("candidate_m"), "candidate_m", pa.array(m, pa.int64()))
        result = gate({**frames, "partition_state": t})
        assert result.success is ok, result.failures
        if not ok:
            (f,) = result.failures
            assert f.startswith(
                "partition_state: expect_column_pair_values_a_to_be_greater_than_b("
                "column_A=min_pending_epoch, column_B=candidate_m, or_equal=False) 1 unexpected"
            )
            assert f.endswith("[I1: no pending placeholder may point at an L0 object at or below M]")


def test_the_partition_state_table_carries_pending_epochs_from_the_logs_and_m(store, gate):
    reconciled(store)
    with Producer(store, epoch_ttl_s=0) as prod:  # pending: written after the last reconcile
        assert prod.write([(("t", 2), [Record(b"pending")])])[0].accepted
    c = ClusterEpoch(store).current()
    logs = prepare(store, GcSettings())
    rows = {r["partition"]: r for r in logs.frames["partition_state"].to_pylist()}
    assert [rows[p]["min_pending_epoch"] for p in range(3)] == [None, None, c]
    assert {r["source"] for r in rows.values()} == {"log"}  # every partition read from its log
    assert {r["candidate_m"] for r in rows.values()} == {logs.decision.m} and logs.decision.m < c
    assert gate(logs.frames).success
    assert run_gc(store, gate=gate).status == "ok"


def test_a_gc_run_that_loses_the_race_for_a_seq_leaves_the_winners_partition_view_alone(store):
    """Each run writes its view before it tries to own the record: two runs that both
    aim at seq n must not leave record n (the winner's) pointing at the loser's rows,
    which the next run would take as its reference for lower bounds and watermarks."""
    from ctp_state import codec, records
    from ctp_state.gc.history import PARTITION_SCHEMA
    from ctp_state.records import GcRecord
    from ctp_state.sequence import create_next

    h = GcHistory(store)

    def view(topic: str) -> pa.Table:
        row = {f.name: None if pa.types.is_string(f.type) else 0 for f in PARTITION_SCHEMA} | {
            "topic": topic,
            "source": "log",
        }
        return pa.Table.from_pylist([row], schema=PARTITION_SCHEMA)

    def record(run: str, key: str, seq: int = -1) -> GcRecord:
        return GcRecord(
            run_id=run,
            status="ok",
            started_ms=0,
            finished_ms=0,
            seconds=0.0,
            m=5,
            partitions_key=key,
            seq=seq,
            v=GcRecord.VERSION,
        )

    h.append(lambda seq: record("run-a", h.write_partitions(seq, view("a"), "run-a")))
    # run B read the history before A's record landed: it also builds for seq 0, and loses
    got = create_next(
        store,
        0,
        lambda seq: (
            h.seq.key(seq),
            codec.seal(records.encode(record("run-b", h.write_partitions(seq, view("b"), "run-b"), seq))),
        ),
        after_loss=lambda _n: h.last_seq() + 1,
        what="b",
        attempts=3,
    )
    assert got == 1
    won = h.get(0)
    assert won.run_id == "run-a" and [r.topic for r in h.read_partitions(won.partitions_key)] == ["a"]
