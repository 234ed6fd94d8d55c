"""The end-to-end flow that ``ctp demo`` (and the README's first command) runs.

A topic, epochs advancing while producers write, a producer with a stale cached epoch
being told it was rejected, the Spark reconciler lifting everything into L1 (when given
one), a check that every record reads back exactly once, then the GC behind its Great
Expectations gate (a dry run, then the real one), the read-back again, and the report;
the committed L1 files are published to the topic's Iceberg table after the reconcile.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from click import UsageError

from ctp_state.codec import JsonObject
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer, write_with_retry
from ctp_state.records import GcRecord, ReconcileSummary, encode
from ctp_state.status import facts, read_states
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic

if TYPE_CHECKING:
    from ctp_state.table.publish import Published


def run_demo(
    store: ObjectStore,
    *,
    topic: str = "demo",
    partitions: int = 8,
    rounds: int = 4,
    records_per_round: int = 20_000,
    value_size: int = 200,
    say: Callable[[str], None] = print,
    seed: int = 7,
    reconcile: Callable[[], ReconcileSummary] | None = None,
    publish: Callable[[], Published] | None = None,
    gc: Callable[[bool], tuple[GcRecord, str]] | None = None,
) -> JsonObject:
    rng = random.Random(seed)
    epochs = ClusterEpoch(store)
    t = create_topic(store, topic, partitions, exist_ok=True)
    say(f"topic {t.name}: {t.partitions} partitions in {store.url}")
    produced = 0
    started = time.monotonic()
    with Producer(store, epoch_ttl_s=0) as producer:
        for r in range(rounds):
            c = epochs.advance()
            chunks: dict[tuple[str, int], list[Record]] = {}
            now = int(time.time() * 1000)
            for i in range(records_per_round):
                chunks.setdefault((t.name, i % partitions), []).append(
                    Record(rng.randbytes(value_size), f"user-{rng.randrange(10_000)}".encode(), now)
                )
            accepted, rejected = write_with_retry(producer, sorted(chunks.items()))
            n = sum(v.records for v in accepted)
            produced += n
            say(f"round {r + 1}: cluster epoch {c}, {n} records accepted in {len(accepted)} chunks, one L0 object")
            if rejected:
                raise RuntimeError(f"demo writes were rejected: {rejected[0].error}")
        # A producer whose cached epoch is two advances old is refused, and told so (I4).
        stale = epochs.current() - 2
        verdict = producer.write([((t.name, 0), [Record(b"late")])], epoch=max(1, stale))[0]
        say(
            f"a producer with stale epoch {stale}: "
            + ("accepted" if verdict.accepted else f"rejected ({verdict.reason}): {verdict.error}")
        )
    reconciled: ReconcileSummary | None = None
    if reconcile is not None:
        say("running the Spark reconciler ...")
        reconciled = reconcile()
        say(
            f"reconciled {reconciled.records} records into {reconciled.l1_files} L1 files "
            f"({reconciled.l0_bytes} L0 bytes -> {reconciled.l1_bytes} Parquet bytes) in "
            f"{reconciled.seconds}s; quarantined: {reconciled.partitions_quarantined}"
        )
        if not reconciled.ok:
            raise RuntimeError("the demo's reconcile did not succeed; see the run summary under runs/reconcile/")
        from ctp_state.read import read_partition

        total = sum(read_partition(store, t.name, p).num_rows for p in range(t.partitions))
        expected = sum(s.next_offset for s in read_states(store, [t]))
        say(
            f"read back {total} records across L1 and L0 (expected {expected}): "
            + ("every record exactly once" if total == expected else "MISMATCH")
        )
        if total != expected:
            raise RuntimeError(f"read back {total} records, the logs hold {expected}")
    table: Published | None = None
    if publish is not None:
        table = publish()
        say(
            f"table {table.table}: {table.files_added} L1 files ({table.records_added} records) published, "
            f"snapshot {table.snapshot_id}"
        )
    collected: GcRecord | None = None
    report: str | None = None
    if gc is not None:
        dry, _ = gc(True)
        stats = dry.gate.statistics if dry.gate else {}
        say(
            f"GC dry run: M = {dry.m} (C = {dry.cluster_epoch}); would delete {dry.would_delete} L0 "
            f"objects ({dry.would_delete_bytes} bytes); Great Expectations gate: "
            f"{stats.get('successful')}/{stats.get('evaluated')} passed"
        )
        collected, report = gc(False)
        say(
            f"GC: deleted {collected.deleted} L0 objects ({collected.deleted_bytes} bytes) at or below "
            f"M = {collected.m}; {collected.l1_orphans_deleted} L1 orphans"
        )
        if reconcile is not None:
            from ctp_state.read import read_partition

            total = sum(read_partition(store, t.name, p).num_rows for p in range(t.partitions))
            expected = sum(s.next_offset for s in read_states(store, [t]))
            say(f"after the GC, read back {total} records (expected {expected})")
            if total != expected:
                raise RuntimeError(f"after the GC, read back {total} records, the logs hold {expected}")
        say(f"report: {report}")
    states = [facts(s) for s in read_states(store, [t])]
    c = epochs.current()
    m = min([c - 1] + [s.m for s in states if s.m is not None])
    summary = {
        "store": store.url,
        "topic": t.name,
        "cluster_epoch": c,
        "records_produced": produced,
        "stale_write_rejected": not verdict.accepted,
        "reconcile": None if reconciled is None else {k: v for k, v in encode(reconciled).items() if k != "partitions"},
        "m_if_gc_ran_now": m,
        "table": None if table is None else table.as_dict(),
        "gc": None
        if collected is None
        else {
            "m": collected.m,
            "cluster_epoch": collected.cluster_epoch,
            "deleted": collected.deleted,
            "deleted_bytes": collected.deleted_bytes,
            "l1_orphans_deleted": collected.l1_orphans_deleted,
            "report": report,
            "status": collected.status,
        },
        "lag_records": sum(s.lag_records for s in states),
        "seconds": round(time.monotonic() - started, 2),
        "partitions": [encode(s) for s in states],
    }
    say(
        f"cluster epoch {c}; {summary['lag_records']} records await the reconciler; "
        f"M = min(C-1, M(p)) = {m}: L0 objects with epoch <= {m} are garbage"
    )
    return summary


def generate(
    store: ObjectStore, topic_name: str | None, n: int, value_size: int, batch: int, seed: int | None
) -> Iterator[list[tuple[tuple[str, int], list[Record]]]]:
    """Synthetic records for ``ctp produce --generate``: ``n`` values of ``value_size``
    random bytes spread round-robin over the topic's partitions, ``batch`` at a time."""
    from ctp_state.topics import get_topic

    if not topic_name:
        raise UsageError("--generate needs --topic")
    if n < 0 or value_size < 0:
        raise UsageError("--records and --value-size must be >= 0")
    t = get_topic(store, topic_name)
    rng = random.Random(seed)
    i = 0
    while i < n:
        chunks: dict[tuple[str, int], list[Record]] = defaultdict(list)
        now = int(time.time() * 1000)
        for j in range(i, min(n, i + batch)):
            value = rng.randbytes(value_size)
            chunks[(t.name, j % t.partitions)].append(
                Record(value, f"key-{j}".encode(), now, (("source", b"ctp-generate"),))
            )
        i = min(n, i + batch)
        yield sorted(chunks.items())
