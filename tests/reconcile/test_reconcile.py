"""The reconciler: planning, Spark runs on both stores, I2, idempotency, races, R6,
quarantine, and the run summary."""

from __future__ import annotations

import argparse
import threading

from ctp_state import layout, state as sm
from ctp_state.entries import Reconcile
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.l1 import SCHEMA, read_l1
from ctp_state.producer import Producer
from ctp_state.reconcile import build_files_locally, plan_files, run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.status import read_states, select_topics
from ctp_state.topics import create_topic
from spark_apps import reconcile as app
from tests.support import assert_exactly_once, corrupt_chunk, plog, produce_rounds, space


def spark_args(store, **kw) -> argparse.Namespace:
    base = {
        "store": store.url,
        "topics": None,
        "target_file_mb": 128.0,
        "max_mb_per_partition": None,
        "idle_lag": 2,
        "lease_seconds": 900.0,
        "claim_wait_seconds": 0.0,
        "compression": "zstd",
        "master": None,
    }
    base.update(kw)
    return argparse.Namespace(**base)


# --- pure planning --------------------------------------------------------------------------


def pending(sizes: list[int]) -> sm.PartitionState:
    sm.PartitionState("t", 0)
    ps, base = [], 0
    for i, n in enumerate(sizes):
        ps.append(sm.Pending(i + 1, 1, f"l0/{i}", 8, n, 10, 0, base))
        base += 10
    return sm.PartitionState(
        "t", 0, pending=tuple(ps), max_applied_epoch=1, previous_applied_epoch=1, min_epoch_lower_bound=1
    )


def test_plan_groups_chunks_in_order_to_the_target_size():
    files = plan_files(pending([40, 40, 40, 10, 100, 5]), target_file_bytes=80)
    assert [[c.log_offset for c in f.chunks] for f in files] == [[1, 2], [3, 4, 5], [6]]
    assert [(f.first_offset, f.last_offset) for f in files] == [(0, 19), (20, 49), (50, 59)]
    assert files[0].key == layout.l1_key("t", 0, 0, 19)
    # deterministic: the same state plans the same keys
    assert [f.key for f in plan_files(pending([40, 40, 40, 10, 100, 5]), 80)] == [f.key for f in files]


def test_plan_respects_the_per_run_cap_but_always_makes_progress():
    assert [len(f.chunks) for f in plan_files(pending([40, 40, 40]), 1000, max_bytes=85)] == [2]
    assert [len(f.chunks) for f in plan_files(pending([500, 40]), 1000, max_bytes=100)] == [1]
    assert plan_files(pending([]), 100) == []


# --- Spark end to end, both backends ----------------------------------------------------------


def test_spark_reconcile_lifts_everything_exactly_once(spark, store):
    sent = produce_rounds(store, partitions=3, rounds=3, per=40)
    summary = app.run(spark, spark_args(store, target_file_mb=0.002))
    assert summary.ok and summary.partitions_reconciled == 3
    assert summary.records == 360 and summary.lag_entries_left == 0
    assert summary.l1_files >= 3
    assert_exactly_once(store, "t", sent)
    for st in read_states(store, select_topics(store)):
        # C = 4 after three advances; the last flush was at 4, so lower bound = prev = 3
        assert (st.max_applied_epoch, st.previous_applied_epoch, st.min_epoch_lower_bound, st.m) == (4, 3, 3, 2)
    # The summary is in the store for the GC.
    from ctp_state.status import reconcile_summaries as summaries

    seq = summaries(store)
    assert seq.last() == 0 and seq.get(0).run_id == summary.run_id == seq.newest().run_id


def test_l1_files_are_plain_parquet_with_metadata(spark, store):
    produce_rounds(store, partitions=1, rounds=2, per=25)
    summary = app.run(spark, spark_args(store))
    (key,) = summary.partitions[0].l1_files
    table = read_l1(store, key)
    assert table.schema.remove_metadata() == SCHEMA
    meta = table.schema.metadata
    assert meta[b"ctp.topic"] == b"t" and meta[b"ctp.partition"] == b"0"
    assert (meta[b"ctp.first_offset"], meta[b"ctp.last_offset"]) == (b"0", b"49")


def test_spark_reads_the_l1_files_back(spark, tmp_path):
    from ctp_state.storage import open_store

    store = open_store(f"file://{tmp_path}/s", {})
    produce_rounds(store, partitions=2, rounds=2, per=30)
    app.run(spark, spark_args(store))
    df = spark.read.parquet(f"{tmp_path}/s/l1/{space(store)}/000001")
    rows = sorted(df.select("offset", "value").collect())
    assert [r.offset for r in rows] == list(range(60))


def test_rerun_is_idempotent_and_new_data_appends(spark, store):
    sent = produce_rounds(store, partitions=2, rounds=2, per=10)
    app.run(spark, spark_args(store))
    again = app.run(spark, spark_args(store))
    assert again.records == 0 and again.l1_files == 0 and again.ok
    more = produce_rounds(store, partitions=2, rounds=1, per=7)
    third = app.run(spark, spark_args(store))
    assert third.records == 14
    assert_exactly_once(store, "t", {p: sent[p] + more[p] for p in sent})


def test_topics_param_limits_the_run(spark, store):
    a = produce_rounds(store, topic="a", partitions=1, rounds=1, per=5)
    produce_rounds(store, topic="b", partitions=1, rounds=1, per=5)
    summary = app.run(spark, spark_args(store, topics=["a"]))
    assert {(p.topic, p.status) for p in summary.partitions} == {("a", "reconciled")}
    assert_exactly_once(store, "a", a)
    assert plog(store, "b", 0).read_state().lag_entries == 1


# --- races: a second reconciler is fenced, never double-commits --------------------------------


def test_a_racing_reconciler_is_fenced_and_never_double_commits(store):
    sent = produce_rounds(store, partitions=2, rounds=2, per=20)
    a_built = threading.Event()
    b_done = threading.Event()
    results = {}

    def slow_map(files):  # reconciler A stalls after building, past its lease
        out = build_files_locally(store, files)
        a_built.set()
        b_done.wait(60)
        return out

    def run_a():
        results["a"] = run_reconcile(store, config=ReconcileSettings(lease_ms=300), map_files=slow_map)

    ta = threading.Thread(target=run_a)
    ta.start()
    assert a_built.wait(60)
    # B waits out A's short lease, claims (bumping the writer epoch) and commits.
    results["b"] = run_reconcile(store, config=ReconcileSettings(claim_wait_s=30))
    b_done.set()
    ta.join(60)
    assert results["b"].partitions_reconciled == 2
    assert results["a"].partitions_fenced == 2 and not results["a"].ok
    for p in range(2):
        accepted = []
        log = plog(store, "t", p)
        st = log.empty_state()
        for off, e in log.entries():
            out = sm.apply(st, off, e)
            if isinstance(e, Reconcile):
                accepted.append(out.accepted)
            st = out.state
        assert accepted == [True, False]  # B's commit; A's was rejected (fenced)
    assert_exactly_once(store, "t", sent)


def test_a_held_claim_skips_the_partition_and_says_who_holds_it(store):
    produce_rounds(store, partitions=1, rounds=1, per=3)
    log = plog(store, "t", 0)
    from ctp_state.entries import AccessMode

    log.claim(log.read_state(), "someone-else", AccessMode.EXCLUSIVE, lease_ms=600_000)
    summary = run_reconcile(store)
    (p,) = summary.partitions
    assert p.status == "claim_held" and "someone-else" in p.reason
    assert summary.partitions_claim_held == 1 and p.lag_entries_left == 1


# --- R6: idle partitions do not pin M ---------------------------------------------------------


def test_one_busy_and_99_idle_partitions_m_follows_c(store):
    create_topic(store, "many", 100)
    ce = ClusterEpoch(store)
    idle_lag = 2
    with Producer(store, epoch_ttl_s=0) as prod:
        for _ in range(4):
            ce.advance()
            ce.advance()
            assert prod.write([(("many", 0), [Record(b"x")])])[0].accepted
            summary = run_reconcile(store, config=ReconcileSettings(idle_lag=idle_lag, threads=32))
            assert summary.ok
            c = ce.current()
            states = read_states(store, select_topics(store))
            m = min([c - 1] + [s.m for s in states])
            # The documented lag: after a run at C, M >= C - idle_lag.
            assert m >= c - idle_lag, (m, c)
            assert all(s.m >= c - idle_lag for s in states)
    assert summary.partitions_advanced >= 99


def test_without_the_advance_idle_partitions_would_pin_m(store):
    create_topic(store, "many", 5)
    ce = ClusterEpoch(store)
    for _ in range(6):
        ce.advance()
    before = min(s.m for s in read_states(store, select_topics(store)))
    assert before == 0  # created at C=1: M(p) = 0 until something moves it
    run_reconcile(store)
    after = min(s.m for s in read_states(store, select_topics(store)))
    assert after == ce.current() - 1


# --- bad data: quarantine ------------------------------------------------------------------------


def test_corrupt_and_missing_chunks_quarantine_only_their_partitions(spark, store):
    # Separate flushes so each partition's chunks live in their own L0 objects.
    create_topic(store, "t", 3)
    ClusterEpoch(store).advance()
    with Producer(store) as prod:
        for p in range(3):
            assert prod.write([(("t", p), [Record(b"r%d" % i) for i in range(5)])])[0].accepted
    bad_key = corrupt_chunk(store, "t", 1)
    missing_key = plog(store, "t", 2).read_state().pending[0].l0_key
    store.delete_many([missing_key])
    m_before = {s.partition: s.m for s in read_states(store, select_topics(store))}

    summary = app.run(spark, spark_args(store))
    parts = {p.partition: p for p in summary.partitions}
    assert not summary.ok and summary.partitions_quarantined == 2
    assert parts[0].status == "reconciled"
    assert parts[1].status == "quarantined" and parts[1].key == bad_key and "CRC32C" in parts[1].reason
    assert parts[2].status == "quarantined" and parts[2].key == missing_key and "not found" in parts[2].reason
    after = {s.partition: s for s in read_states(store, select_topics(store))}
    for p in (1, 2):
        assert after[p].m == m_before[p] and after[p].lag_entries == 1  # held, nothing committed
        assert after[p].holders == ()  # and the claim was released


def test_to_l1_table_assigns_offsets_from_each_chunks_base():
    from ctp_state import l0
    from ctp_state.l1 import to_l1_table

    def batch(values):
        data, (ref,) = l0.build_object(1, [("t", 0, [Record(v, None, 5) for v in values])])
        chunk = data[ref.byte_offset : ref.byte_offset + ref.byte_length]
        return l0.decode_chunk(chunk, "k", expected_crc=ref.crc32c, expected_records=len(values))

    table = to_l1_table([(10, batch([b"a", b"b"])), (12, batch([b"c"]))])
    assert table.schema == SCHEMA
    assert table.column("offset").to_pylist() == [10, 11, 12]
    assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
    assert [t.timestamp() for t in table.column("timestamp").to_pylist()] == [0.005] * 3
    assert to_l1_table([]).num_rows == 0
