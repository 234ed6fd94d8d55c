"""The simulation's pure parts: the seeded schedule, the records, the ledger of what
producers were told, and the end checks. Nothing here touches a store or a process,
so the same seed gives the same schedule and the same records on every machine.

A schedule is a list of :class:`Step` — one action for one actor, with the faults
that go with it (a SIGKILL after some milliseconds, a named crash point, an S3 fault
rule) — serialised as JSON lines, so a failing run can be replayed step for step.
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from ctp_state.l0 import Record
from ctp_state.records import GcRecord

TOPIC = "sim"

#: Crash points the product marks (:mod:`ctp_state.crashpoints`, armed by
#: ``tests/hooks``): the schedule puts each of them into every run long enough to hold them.
CRASH_POINTS = {
    "reconcile": ("after_claim", "after_l1_write", "before_commit", "after_commit"),
    "gc": ("gc_after_delete_batch", "gc_before_record"),
    "delete_cli": ("delete_after_tombstone", "delete_after_seal"),
    "produce_cli": ("produce_after_flush",),  # the re-run then resumes from the progress record
    "publish_cli": ("publish_before_commit", "table_commit_before_update", "publish_after_commit"),  # ctp table publish
    "compact_cli": ("compact_after_claim", "compact_after_write", "compact_before_commit", "compact_after_commit"),
    "retention_cli": ("trim_before_commit",),  # ctp retention (the topic keeps about RETENTION_BYTES a partition)
}
#: The sim topic's retention.bytes (``ctp topic create --retention-bytes``): small enough
#: that ``ctp retention`` steps drop files.
RETENTION_BYTES = 12_000
#: Crash points only a GC that removes a deleted incarnation reaches: drawn at random
#: (a GC step may have nothing to remove, so they cannot be promised).
REMOVAL_CRASH_POINTS = (
    "gc_remove_after_tables",
    "gc_remove_after_l1",
    "gc_remove_after_snapshots",
    "gc_remove_after_logs",
)
#: Fault kinds of the S3 proxy (tests/support/s3_fault_proxy.py), each in every S3 run's mix.
FAULT_KINDS = (
    "slowdown_503",
    "error_500",
    "reset_before",
    "reset_after",
    "error_500_after",
    "slow",
    "delete_key_errors",
)
#: Where a fault rule aims: any request, state-log entries, L0 objects, the epoch, GC records.
FAULT_TARGETS = (None, r"^logs/", r"^l0/", r"^cluster/epoch/", r"^gc/", r"^l1/", r"^snapshots/")

#: Actors. Producers keep their process (and their epoch cache) between steps, so a
#: ``stale`` producer really holds an old epoch; ``cli`` runs are one process each.
PRODUCERS = ("api0", "api1", "stale")
#: ``cli_paused`` runs the paused CLI steps, so that the steps after them (a delete and
#: re-create, a GC sweep) overlap their pause.
ACTORS = PRODUCERS + (
    "cli",
    "cli_paused",
    "advancer",
    "reconciler0",
    "reconciler1",
    "spark",
    "gc",
    "reader",
    "cli_reader",
)
#: Where the paused steps wait, and for how long (seconds): longer than the steps meant
#: to overlap them take (a delete and a re-create; a whole GC run, whose table sweep
#: comes last).
PAUSES = {
    "produce_cli": "produce_after_flush:0=4",
    "publish_cli": ("publish_before_commit=9", "table_commit_before_update=9"),
}


@dataclass
class Step:
    n: int
    actor: str
    op: str  # produce | resend | produce_cli | rerun_cli | advance | reconcile | gc | read | delete_cli | create_cli
    #          | publish_cli | compact_cli | retention_cli | delete_records_cli
    args: dict[str, Any] = field(default_factory=dict)
    kill_after_ms: int | None = None  # SIGKILL the actor's process group this long after the start
    crash: str | None = None  # CTP_FAULT for this step ("point" or "point:n")
    pause: str | None = None  # CTP_PAUSE for this step ("point[:n]=seconds"): it waits there
    fault: dict[str, Any] | None = None  # an S3 proxy rule armed when the step starts
    gap_ms: int = 0  # wait this long before the next step starts (steps overlap)

    def to_json(self) -> str:
        # kill_after_ms 0 is a kill at once, not "no kill": only None and empty values go
        return json.dumps(
            {k: v for k, v in asdict(self).items() if k == "n" or (v is not None and v != {} and (v or k != "gap_ms"))}
        )

    @classmethod
    def from_json(cls, line: str) -> Step:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class Params:
    steps: int = 60
    partitions: int = 3
    s3: bool = False  # arm S3 proxy faults
    spark: int = 0  # spark-submit reconciles in the run (each costs ~15 s)
    kill_rate: float = 0.12
    fault_rate: float = 0.3


def schedule(seed: int, p: Params) -> list[Step]:
    """The steps of a run, from ``seed`` alone."""
    rng = random.Random(seed)
    steps: list[Step] = []
    batch = 0
    produced: dict[str, list[int]] = defaultdict(list)  # producer -> its batches (for resends)
    cli_files: list[int] = []
    # Every crash point and every fault kind at least once, at seeded places.
    crash_due = [(a, c) for a, cs in CRASH_POINTS.items() for c in cs]
    faults_due = list(FAULT_KINDS) if p.s3 else []
    rng.shuffle(crash_due)
    rng.shuffle(faults_due)
    spark_at = set(rng.sample(range(p.steps // 4, p.steps), min(p.spark, p.steps - p.steps // 4)))
    # Two topic deletes in every run long enough (each with one of its crash points), on
    # top of the drawn ones; a ``create_cli`` follows each within a few steps.
    free = [n for n in range(p.steps // 4, p.steps - 4) if n not in spark_at]
    delete_at = set(rng.sample(free, 2)) if p.steps >= 40 else set()
    create_at = {n + rng.randint(1, 4) for n in delete_at} - spark_at - delete_at
    # Two table publishes too (each with one of its crash points), on top of drawn ones.
    publish_at = set(rng.sample([n for n in free if n not in delete_at | create_at], 2)) if p.steps >= 40 else set()
    # A produce run paused after its first flush right before each delete (the delete
    # and the re-create overlap its pause), and a publish paused before its commit right
    # before a GC whose table sweep has no grace (round-four review, defects 1 and 2).
    taken = spark_at | delete_at | create_at | publish_at
    paused_produce_at = {n - 1 for n in delete_at} - taken
    # (the publish comes right after a produce and a reconcile, so it has files to commit)
    busy = taken | paused_produce_at
    runs = [n for n in free if n >= p.steps // 2 and not {n - 2, n - 1, n, n + 1} & busy]
    paused_publish_at = {rng.choice(runs)} if p.steps >= 40 and runs else set()
    sweep_at = {n + 1 for n in paused_publish_at}
    fill_at = {n - 1 for n in paused_publish_at}  # a reconcile
    feed_at = {n - 2 for n in paused_publish_at}  # a produce
    weights = {
        "produce": 30,
        "resend": 4,
        "produce_cli": 5,
        "rerun_cli": 3,
        "advance": 10,
        "reconcile": 14,
        "gc": 10,
        "read": 6,
        "read_cli": 2,
        "delete_cli": 1.5,  # ctp topic delete (the GC removes the incarnation later)
        "create_cli": 2.5,  # ctp topic create --exist-ok: a new incarnation after a delete
        "publish_cli": 3,  # ctp table publish: the topic's Iceberg table follows the commits
        "compact_cli": 6,  # ctp compact: a partition's small files merged (R11)
        "retention_cli": 1.5,  # ctp retention: the start offset moves (retention.bytes)
        "delete_records_cli": 1,  # ctp delete-records: an operator moves one partition's start offset
    }
    ops, w = zip(*weights.items())
    for n in range(p.steps):
        op = (
            "spark"
            if n in spark_at
            else "delete_cli"
            if n in delete_at
            else "create_cli"
            if n in create_at
            else "publish_cli"
            if n in publish_at | paused_publish_at
            else "produce_cli"
            if n in paused_produce_at
            else "gc"
            if n in sweep_at
            else "reconcile"
            if n in fill_at
            else "produce"
            if n in feed_at
            else rng.choices(ops, w)[0]
        )
        if op == "resend" and not any(produced.values()):
            op = "produce"
        if op == "rerun_cli" and not cli_files:
            op = "produce_cli"
        step = Step(n, "", op, gap_ms=rng.choice((0, 0, 20, 50, 100, 200, 400)))
        if op == "produce":
            step.actor = rng.choice(PRODUCERS)
            parts = rng.sample(range(p.partitions), rng.randint(1, p.partitions))
            step.args = {
                "batch": batch,
                "parts": [[q, rng.randint(1, 5)] for q in sorted(parts)],
                "retry": rng.random() < 0.3,
            }
            produced[step.actor].append(batch)
            batch += 1
        elif op == "resend":
            step.actor = rng.choice([a for a in PRODUCERS if produced[a]])
            step.args = {"batch": rng.choice(produced[step.actor][-4:])}
        elif op == "produce_cli":
            step.actor = "cli"
            parts = rng.sample(range(p.partitions), rng.randint(1, p.partitions))
            step.args = {
                "batch": batch,
                "parts": [[q, rng.randint(1, 6)] for q in sorted(parts)],
                "batch_records": rng.choice((1, 2, 5000)),
            }
            cli_files.append(batch)
            batch += 1
        elif op == "rerun_cli":
            step.actor = "cli"
            step.args = {"batch": rng.choice(cli_files[-3:])}
        elif op == "advance":
            step.actor = "advancer"
            if rng.random() < 0.15:
                step.actor, step.op = "cli", "advance_cli"
        elif op == "reconcile":
            step.actor = rng.choice(("reconciler0", "reconciler1"))
            step.args = {
                "lease_ms": rng.choice((1500, 3000, 8000)),
                "target_file_bytes": rng.choice((300, 2000, 1 << 20)),
            }
        elif op == "spark":
            step.actor, step.op = "spark", "reconcile_spark"
        elif op == "gc":
            step.actor = "gc"
            step.args = {"l1_grace_s": rng.choice((0.0, 0.0, 1.0, 5.0)), "max_deletes": rng.choice((None, None, 1, 3))}
        elif op == "read":
            step.actor = "reader"
            step.args = {"partition": rng.randrange(p.partitions)}
        elif op == "read_cli":
            step.actor, step.op = "cli_reader", "read_cli"
            step.args = {"partition": rng.randrange(p.partitions)}
        elif op in ("delete_cli", "create_cli", "publish_cli", "compact_cli", "retention_cli"):
            step.actor = "cli"
        elif op == "delete_records_cli":
            step.actor = "cli"
            step.args = {"partition": rng.randrange(p.partitions), "offset": rng.randint(1, 40)}
        if n in paused_produce_at:
            step.actor, step.pause, step.gap_ms = "cli_paused", str(PAUSES["produce_cli"]), 0
            step.args["batch_records"] = 1  # a flush per record: most of the run is after the pause
        elif n in paused_publish_at:
            step.actor, step.pause, step.gap_ms = "cli_paused", rng.choice(PAUSES["publish_cli"]), 0
        elif n in sweep_at:
            step.args = {"l1_grace_s": 0.0, "max_deletes": None}
        if step.pause:
            steps.append(step)  # (no kill, no crash: it must live through its pause)
            continue
        # Kills and crash points: at random moments, and each named point at least once.
        group = "reconcile" if step.op in ("reconcile", "reconcile_spark") else step.op
        due = next((i for i, (a, _) in enumerate(crash_due) if a == group), None)
        if group == "gc" and n < p.steps // 2:
            due = None  # a GC deletes something only once epochs moved and data was reconciled
        # (at random in the first half; from then on, or for the rarer steps with several
        # points, at the first chance, so that every run holds every point; random ones
        # follow below all the same)
        first_chance = 2 * n > p.steps or group in ("produce_cli", "reconcile", "publish_cli", "compact_cli")
        if due is not None and (rng.random() < 0.5 or n in delete_at or first_chance):
            step.crash = _crash_spec(crash_due.pop(due)[1], rng)
        elif group in CRASH_POINTS and rng.random() < 0.08:
            step.crash = _crash_spec(rng.choice(CRASH_POINTS[group]), rng)
        elif group == "gc" and rng.random() < 0.1:
            step.crash = rng.choice(REMOVAL_CRASH_POINTS)
        elif op not in ("read", "read_cli") and rng.random() < p.kill_rate:
            step.kill_after_ms = rng.choice((0, 5, 20, 50, 100, 250, 600, 1200))
        if p.s3 and (faults_due or rng.random() < p.fault_rate):
            # DeleteObjects happen once a GC has garbage: that kind is armed in the second half.
            due = [k for k in faults_due if k != "delete_key_errors" or n >= p.steps // 2]
            due_kind = bool(due)
            if due_kind:
                faults_due.remove(due[-1])
            kind = due[-1] if due_kind else rng.choice(FAULT_KINDS)
            # A kind's first rule matches any request, so every kind fires in every run.
            target = None if kind == "delete_key_errors" or due_kind else rng.choice(FAULT_TARGETS)
            step.fault = {"kind": kind, "key_regex": target, "times": rng.randint(1, 3)}
            if kind == "slow":
                step.fault["delay_s"] = rng.choice((0.2, 0.5, 1.5))
        steps.append(step)
    return steps


def _crash_spec(point: str, rng: random.Random) -> str:
    """``point`` or ``point:n``: per-item points die at item 0 or 1 (file, batch)."""
    if point in (
        "after_claim",
        "before_commit",
        "delete_after_tombstone",
        "produce_after_flush",
        "publish_before_commit",
        "table_commit_before_update",
        "publish_after_commit",
        "compact_after_claim",
        "compact_after_write",
        "compact_before_commit",
        "compact_after_commit",
        "trim_before_commit",
    ):
        return point  # (a produce with --batch-records 5000 flushes once here)
    return f"{point}:0" if point == "gc_after_delete_batch" else f"{point}:{rng.randint(0, 1)}"


# --- records --------------------------------------------------------------------------------


def records(seed: int, batch: int, partition: int, n: int) -> list[Record]:
    """The records of one chunk. Each value starts with its id ``b<batch>.p<partition>.r<j>|``
    (so a read maps a row back to what was sent); keys, headers and timestamps vary,
    including the edges a producer may send (no key, empty value, the last valid ms)."""
    rng = random.Random(f"{seed}/{batch}/{partition}")
    out = []
    for j in range(n):
        rid = f"b{batch}.p{partition}.r{j}|".encode()
        value = rid + rng.randbytes(rng.choice((0, 1, 17, 200)))
        key = rng.choice((None, b"", rng.randbytes(8), f"k{j}".encode()))
        ts = rng.choice((0, 1_700_000_000_000 + j, 253402300799999, rng.randrange(1 << 40)))
        headers = tuple((f"h{i}", rng.randbytes(rng.randint(0, 6))) for i in range(rng.choice((0, 0, 1, 3))))
        out.append(Record(value, key, ts, headers))
    return out


def record_id(value: bytes) -> str | None:
    head, sep, _ = value.partition(b"|")
    return head.decode("ascii", "replace") if sep else None


def to_jsonl(rs: list[Record], partition: int) -> str:
    lines = []
    for r in rs:
        d: dict[str, Any] = {
            "topic": TOPIC,
            "partition": partition,
            "value_b64": base64.b64encode(r.value).decode(),
            "timestamp": r.timestamp_ms,
        }
        if r.key is not None:
            d["key_b64"] = base64.b64encode(r.key).decode()
        if r.headers:
            d["headers_b64"] = {k: base64.b64encode(v).decode() for k, v in r.headers}
        lines.append(json.dumps(d))
    return "\n".join(lines) + "\n"


def row_of(r: Record) -> tuple[bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]:
    return (r.value, r.key, r.timestamp_ms, tuple(r.headers))


# --- the ledger -------------------------------------------------------------------------------


@dataclass
class Chunk:
    batch: int
    partition: int
    records: list[Record]
    told: list[dict[str, Any]] = field(default_factory=list)  # every answer a producer got
    #: (incarnation, record index) -> acknowledged offset
    offsets: dict[tuple[str | None, int], int] = field(default_factory=dict)

    def status(self, j: int, incarnation: str | None = None) -> str:
        """What the producers were told of record ``j`` in topic incarnation
        ``incarnation``, all sends together: ``accepted`` (exactly once), ``unknown`` (at
        most once) or ``rejected`` (never there). An answer names the incarnation it was
        about; one that cannot (the producer died) is unknown for every incarnation, and
        a record acknowledged in another incarnation is never in this one (it went with
        that one's delete)."""
        outcomes = []
        for t in self.told:
            if t.get("incarnation") not in (incarnation, None):
                continue
            o = t["outcome"]
            if o == "partial":
                o = "accepted" if j < t.get("already_written", 0) else "rejected"
            if o in ("accepted", "duplicate") and t.get("incarnation") is None and incarnation is not None:
                o = "unknown"  # acknowledged, but into which incarnation nobody said
            outcomes.append(o)
        if any(o in ("accepted", "duplicate") for o in outcomes):
            return "accepted"
        if any(o == "unknown" for o in outcomes) or not self.told:
            return "unknown"
        return "rejected"


class Ledger:
    """What each producer was told, chunk by chunk."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.chunks: dict[tuple[int, int], Chunk] = {}
        self.by_id: dict[str, tuple[Chunk, int]] = {}

    def sent(self, batch: int, partition: int, n: int) -> Chunk:
        key = (batch, partition)
        if key not in self.chunks:
            c = self.chunks[key] = Chunk(batch, partition, records(self.seed, batch, partition, n))
            for j, r in enumerate(c.records):
                self.by_id[record_id(r.value)] = (c, j)  # type: ignore[index]
        return self.chunks[key]

    def told(self, batch: int, partition: int, answer: dict[str, Any]) -> None:
        c = self.chunks[(batch, partition)]
        c.told.append(answer)
        if answer["outcome"] == "accepted" and answer.get("base_offset") is not None:
            for j in range(len(c.records)):
                c.offsets[(answer.get("incarnation"), j)] = answer["base_offset"] + j

    def unknown(self, batch: int, partition: int, why: str) -> None:
        self.chunks[(batch, partition)].told.append({"outcome": "unknown", "why": why})

    def counts(self) -> Counter[str]:
        """Records by what their producers were told (in any incarnation)."""
        out: Counter[str] = Counter()
        for c in self.chunks.values():
            incs = {t.get("incarnation") for t in c.told} or {None}
            for j in range(len(c.records)):
                st = {c.status(j, i) for i in incs}
                out["accepted" if "accepted" in st else "unknown" if "unknown" in st else "rejected"] += 1
        return out


# --- checks ------------------------------------------------------------------------------------

Row = tuple[int, bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]  # offset, value, key, ts, headers


def check_read(
    ledger: Ledger,
    partition: int,
    rows: list[Row],
    *,
    final: bool,
    acknowledged_before: set[tuple[int, int, int]] | None = None,
    incarnation: str | None = None,
    start: int = 0,
) -> list[str]:
    """Violations in one partition's records of topic incarnation ``incarnation``, read
    from its start offset ``start`` (retention and DeleteRecords move it; records before
    it are gone by design, I7). ``final``: after quiesce, when every accepted record at or
    after the start must be there. Mid-run, ``acknowledged_before`` lists the (batch,
    partition, j) acknowledged in this incarnation with an offset before the read
    started, and ``start`` is the start offset read after it (start offsets only grow:
    the read began at or before it)."""
    out: list[str] = []
    offsets = [r[0] for r in rows]
    first = offsets[0] if offsets and not final else start
    if offsets != list(range(first, first + len(rows))) or (not final and first > start):
        first_bad = next((i for i, o in enumerate(offsets) if o != first + i), 0)
        out.append(
            f"p{partition}: offsets are not contiguous from the start offset {first} (position {first_bad} holds "
            f"offset {offsets[first_bad] if offsets else None})"
        )
    seen: Counter[str] = Counter()
    at: dict[tuple[int, int], int] = {}
    for off, value, key, ts, headers in rows:
        rid = record_id(value)
        if rid is None or rid not in ledger.by_id:
            out.append(f"p{partition}@{off}: a record nobody sent ({value[:40]!r})")
            continue
        chunk, j = ledger.by_id[rid]
        seen[rid] += 1
        at[(chunk.batch, j)] = off
        if chunk.partition != partition:
            out.append(f"p{partition}@{off}: record {rid} belongs to partition {chunk.partition}")
        if (value, key, ts, headers) != row_of(chunk.records[j]):
            out.append(f"p{partition}@{off}: record {rid} is not byte-identical to what was sent")
        want = chunk.offsets.get((incarnation, j))
        if want is not None and want != off:
            out.append(f"p{partition}@{off}: record {rid} was acknowledged at offset {want}")
    for rid, n in seen.items():
        if n > 1:
            out.append(f"p{partition}: record {rid} is readable {n} times")
    # Accepted records missing before the start offset are gone by design; one whose
    # offset nobody was told may be among them, up to the start offset's count of records.
    below = start - sum(
        1
        for c in ledger.chunks.values()
        if c.partition == partition
        for j in range(len(c.records))
        if c.status(j, incarnation) == "accepted" and c.offsets.get((incarnation, j), start) < start
    )
    for c in ledger.chunks.values():
        if c.partition != partition:
            continue
        for j, r in enumerate(c.records):
            rid = record_id(r.value)
            st = c.status(j, incarnation)
            at_off = c.offsets.get((incarnation, j))
            trimmed = at_off is not None and at_off < start
            if final and st == "accepted" and not seen[rid] and not trimmed:
                if at_off is None and below > 0:
                    below -= 1  # (its offset unknown: counted among the records before the start)
                    continue
                out.append(
                    f"p{partition}: accepted record {rid} is not readable"
                    + (f" (acknowledged at offset {at_off})" if at_off is not None else "")
                )
            if final and st == "rejected" and seen[rid]:
                out.append(f"p{partition}: rejected record {rid} is readable (told {c.told})")
            if (
                acknowledged_before
                and (c.batch, partition, j) in acknowledged_before
                and not seen[rid]
                and not trimmed
                and c.offsets.get((incarnation, j), first + len(rows)) < first + len(rows)
            ):
                out.append(
                    f"p{partition}: record {rid} acknowledged at offset {at_off} before the read is missing from it"
                )
    return out


def check_history_monotonic(records_: list[GcRecord]) -> list[str]:
    """M never decreases over the GC runs that passed (a ``superseded`` run may hold a
    lower M: it finished after a run with a higher one, and deleted only below its own)."""
    out, top, top_seq = [], None, None
    for rec in records_:
        m = rec.m
        if m is None or not rec.passed:
            continue
        if top is not None and m < top:
            out.append(f"GC history: M decreased from {top} (run #{top_seq}) to {m} (run #{rec.seq})")
        if top is None or m > top:
            top, top_seq = m, rec.seq
    return out
