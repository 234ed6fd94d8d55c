"""``ctp verify``: check everything the safety of the store rests on, change nothing.

Per partition:

- every state-log entry decodes and passes its CRC32C; the log is dense; offset 0 is
  the init entry (a log an older ctp damaged, and its repair, are reported);
- entries written before checksums (version 1) are counted: they cannot be checked;
- the snapshot passes its checksum and self-consistency check, and agrees with a
  replay of the log up to the offset it covers (a snapshot covering an entry that no
  longer decodes is reported: the state still reads, a rebuild from the log would not);
- every object the state points at exists: the L0 objects of pending placeholders
  (and hold the chunk's byte range), and the committed L1 files; with ``deep``, every
  committed L1 file is read whole and checked against the CRC32C its commit recorded
  (as ``ctp read`` does), each page against its checksum, and must hold exactly its
  offsets (this reads all L1 data).

Cluster-wide: the epoch hint is vouched for by its marker, and the GC history and
reconcile summaries decode. Findings are ``error`` (something a reader or the GC
would trip on, or data at risk) or ``warning`` (worth knowing, safe). This reads every
entry of every log: it costs O(store metadata), unlike the GC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ctp_state import codec, entries as en, layout, state as sm
from ctp_state.codec import JsonObject
from ctp_state.entries import Init
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import (
    CorruptData,
    CtpError,
    EntryForked,
    LogForked,
    ObjectNotFound,
    TopicDeleted,
    TopicNotFound,
)
from ctp_state.gc.history import GcHistory
from ctp_state.incarnations import NameState, all_names
from ctp_state.l1 import parse_l1
from ctp_state.partition_log import PartitionLog
from ctp_state.status import reconcile_summaries as summaries, select_topics, unaccounted_logs
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic, get_topic

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    where: str  # "t/3", or "cluster"
    what: str  # one sentence an operator can act on
    key: str | None = None

    def line(self) -> str:
        """The finding as one log line."""
        return f"{self.severity}: {self.where}: {self.what}" + (f" [{self.key}]" if self.key else "")


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    entries: int = 0
    unchecksummed: int = 0
    snapshot_offset: int | None = None
    l0_checked: int = 0
    l1_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)


@dataclass
class VerifyReport:
    partitions: list[PartitionCheck]
    cluster: list[Finding]

    @property
    def findings(self) -> list[Finding]:
        return self.cluster + [f for p in self.partitions for f in p.findings]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def refusal(self) -> str | None:
        """Why a GC that verifies first must delete nothing (None when it may go on): the
        one sentence ``ctp gc --verify`` and the GC DAG's verify task both stop with."""
        if self.ok:
            return None
        first = self.errors[0]
        return f"verify found {len(self.errors)} problem(s), nothing deleted; first: {first.where}: {first.what}"

    def to_json(self) -> JsonObject:
        return {
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": sum(1 for f in self.findings if f.severity == WARNING),
            "cluster": [asdict(f) for f in self.cluster],
            "partitions": [
                {
                    **{k: v for k, v in asdict(p).items() if k != "findings"},
                    "ok": p.ok,
                    "findings": [asdict(f) for f in p.findings],
                }
                for p in self.partitions
            ],
        }


def verify_partition(
    store: ObjectStore, topic: Topic | str, partition: int, *, check_objects: bool = True, deep: bool = False
) -> PartitionCheck:
    if isinstance(topic, str):
        try:
            topic = get_topic(store, topic)
        except TopicDeleted:
            raise
        except TopicNotFound:
            pass  # a log without metadata: checked as keys named by the topic only
    plog = PartitionLog(store, topic, partition, write_snapshots=False)
    topic, tid = plog.topic, plog.topic_id
    res = PartitionCheck(topic, partition)
    where = f"{topic}/{partition}"

    def say(severity: str, what: str, key: str | None = None) -> None:
        res.findings.append(Finding(severity, where, what, key))

    # The snapshot, strictly: a problem here is a finding, not a silent fallback.
    snap: sm.PartitionState | None = None
    try:
        got = plog.read_snapshot(strict=True)
        snap = got if got.applied_offset >= 0 else None
    except CorruptData as e:
        say(
            ERROR,
            f"snapshot does not check out ({e.reason}); readers rebuild the state from the log",
            layout.snapshot(topic, partition, tid),
        )
    res.snapshot_offset = snap.applied_offset if snap else None

    # Every entry, in order, replayed from the start.
    state = plog.empty_state()
    replayed = True  # the replay reached the end of the log
    expected = 0
    at_snapshot: sm.PartitionState | None = None

    def listed() -> Iterator[tuple[int, str, bytes | None]]:
        """(offset, key, bytes or None when absent): the listing, with any key it skipped
        while the log grew read directly (so only a real hole is reported)."""
        nxt = 0
        for info in store.list(plog.prefix):
            try:
                offset = layout.log_offset_of(info.key, plog.prefix)
            except CorruptData as e:
                say(ERROR, e.reason, info.key)
                continue
            while nxt < offset:
                try:
                    yield nxt, plog.key(nxt), store.get(plog.key(nxt))
                except ObjectNotFound:
                    yield nxt, plog.key(nxt), None
                nxt += 1
            if offset >= nxt:
                yield offset, info.key, store.get(info.key)
                nxt = offset + 1

    before: int | None = None  # the CRC32C of the entry before (a forked entry names another)
    for offset, key, data in listed():
        if data is None:
            say(ERROR, f"state log is not dense: offset {offset} is missing", key)
            replayed = False
            break
        expected += 1
        res.entries += 1
        try:
            entry, prev = en.decode_chained(data, key)
        except CorruptData as e:
            covered = snap is not None and offset <= snap.applied_offset
            say(
                ERROR,
                f"entry does not decode ({e.reason})"
                + (
                    f"; the snapshot at offset {snap.applied_offset if snap else '?'} covers it, so the state still reads, but "
                    "the log can no longer rebuild it"
                    if covered
                    else "; the partition's state cannot be read"
                ),
                key,
            )
            replayed = False
            break
        if not codec.is_sealed(data):
            res.unchecksummed += 1
        if offset == 0 and not isinstance(entry, Init):
            say(
                WARNING,
                "offset 0 is not the init entry (written by an older ctp); "
                "`ctp topic create` repairs it by appending the init",
                key,
            )
        forked = prev is not None and before is not None and prev != before
        before = codec.crc32c(data)
        try:
            out = sm.apply(state, offset, entry, forked=forked)
        except LogForked as e:
            say(ERROR, str(e), key)
            replayed = False
            break
        state = out.state
        if isinstance(out.rejected, EntryForked):
            # no reader stops on it, and one starting from a stored state past it never
            # sees what took the lost entry's slot (docs/design.md 14, "What stays open")
            say(ERROR, f"{out.rejected}; the entry now at {offset - 1} was written in its place", key)
        if snap is not None and offset == snap.applied_offset:
            at_snapshot = state
    if res.unchecksummed:
        say(WARNING, f"{res.unchecksummed} entries were written before checksums (version 1) and cannot be checked")
    if replayed and not state.initialized and res.entries:
        say(ERROR, "the log has no init entry: run `ctp topic create` again to finish or repair the topic")

    if snap is not None and replayed:
        if at_snapshot is None:
            say(
                ERROR,
                f"snapshot covers offset {snap.applied_offset}, past the log's end {expected - 1}",
                layout.snapshot(topic, partition, tid),
            )
        elif at_snapshot.persisted != snap.persisted:
            say(
                ERROR,
                f"snapshot disagrees with a replay of the log at offset {snap.applied_offset}",
                layout.snapshot(topic, partition, tid),
            )

    # What the state points at: from the full replay if it got through, else what readers use.
    current: sm.PartitionState | None = state if replayed else None
    if current is None:
        try:
            current = plog.read_state()
        except CtpError:
            current = None
    if check_objects and current is not None:
        sizes: dict[str, int | None] = {}
        for p in current.pending:
            if p.l0_key not in sizes:
                info = store.head(p.l0_key)
                sizes[p.l0_key] = None if info is None else info.size
            size = sizes[p.l0_key]
            res.l0_checked += 1
            if size is None:
                say(
                    ERROR,
                    f"L0 object of the pending placeholder at log offset {p.log_offset} is missing "
                    f"({p.record_count} records cannot be read)",
                    p.l0_key,
                )
            elif size < p.byte_offset + p.byte_length:
                say(
                    ERROR,
                    f"L0 object is shorter ({size} bytes) than the chunk of log offset {p.log_offset} needs",
                    p.l0_key,
                )
        for ref in current.committed_l1_files():
            res.l1_checked += 1
            if not deep:
                if store.head(ref.key) is None:
                    say(ERROR, "committed L1 file is missing", ref.key)
            else:
                _check_l1(store, ref.key, ref.first, ref.last, ref.crc32c, say)
    return res


def _check_l1(
    store: ObjectStore, key: str, first: int, last: int, crc32c: int | None, say: Callable[..., None]
) -> None:
    """--deep: the whole file against the CRC32C its commit recorded (what ``ctp read``
    checks), every page against its checksum, and its offsets."""
    try:
        offsets = parse_l1(store.get(key), key, crc32c).column("offset").to_pylist()
    except ObjectNotFound:
        say(ERROR, "committed L1 file is missing", key)
        return
    except CorruptData as e:
        say(ERROR, f"committed L1 file does not read ({e.reason})", key)
        return
    if offsets != list(range(first, last + 1)):
        say(ERROR, f"committed L1 file does not hold exactly offsets {first}..{last}", key)


def verify_cluster(store: ObjectStore) -> list[Finding]:
    out: list[Finding] = []
    names: list[NameState] = []
    try:
        names = all_names(store)  # read once: the live topics and every name's history
        topics = [st.current for st in names if st.current is not None]
        for t, p, why in unaccounted_logs(store, topics, names) + _vanished(store, topics, names):
            out.append(Finding(ERROR, t if p < 0 else f"{t}/{p}", why + "; the GC will not run until this is fixed"))
    except CtpError as e:
        out.append(Finding(ERROR, "cluster", f"the topics cannot be read: {e}"))
    try:
        from ctp_state.deletion import leftovers

        late = leftovers(store, names)
        if late:
            out.append(
                Finding(
                    WARNING,
                    "cluster",
                    f"{len(late)} keys in the space of a removed topic incarnation ({late[0].key}, ...), written "
                    "after its removal "
                    "(a writer stalled past --topic-removal-grace-seconds); nothing reads them; the GC's next "
                    "full L1 sweep deletes them",
                    late[0].key,
                )
            )
    except CtpError as e:
        out.append(Finding(ERROR, "cluster", f"the topic histories cannot be read: {e}"))
    ce = ClusterEpoch(store)
    try:
        c = ce.current(repair=False)
        if ce.unvouched_hints:
            out.append(
                Finding(
                    WARNING,
                    "cluster",
                    f"the epoch hint is not vouched for by a marker; C = {c} from "
                    "the markers (the next epoch read or advance rewrites the hint)",
                    layout.EPOCH_HINT,
                )
            )
    except CtpError as e:
        out.append(Finding(ERROR, "cluster", f"the cluster epoch cannot be read: {e}"))
    for what, seq in (("GC history", GcHistory(store).seq), ("reconcile summaries", summaries(store))):
        try:
            last = seq.last()
        except CtpError as e:
            out.append(Finding(ERROR, "cluster", f"{what}: {e}"))
            continue
        for n in range(last + 1):
            try:
                seq.get(n)
            except ObjectNotFound:
                continue  # a seq an appender lost to a crash
            except CtpError as e:
                out.append(Finding(ERROR, "cluster", f"{what} record {n} does not read: {e}", seq.key(n)))
    return out


def _vanished(store: ObjectStore, topics: list[Topic], names: list[NameState]) -> list[tuple[str, int, str]]:
    """Partitions the GC remembers that vanished without a tombstone (what its run
    refuses on, :func:`ctp_state.gc.inputs.vanished`)."""
    from ctp_state.gc.history import reference_view
    from ctp_state.gc.inputs import vanished
    from ctp_state.settings import GcSettings

    history = GcHistory(store)
    ref, rows = reference_view(history, history.tail(GcSettings.history_tail, unreadable=[]))
    if ref is None:
        return []
    live = {t.name: t.id for t in topics}
    same = [r for r in rows if r.topic not in live or live[r.topic] == r.topic_id]
    now = {(t.name, p) for t in topics for p in range(t.partitions)}
    deleted = frozenset((st.name, t.incarnation) for st in names for t in st.deleted)
    return vanished(ref.seq, same, now, deleted)


def verify(
    store: ObjectStore,
    topics: Sequence[str] | None = None,
    *,
    check_objects: bool = True,
    deep: bool = False,
    threads: int = 16,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> VerifyReport:
    """Check every partition of ``topics`` (all when None) and the cluster records."""
    cluster = verify_cluster(store)
    wanted = [(t, p) for t in select_topics(store, topics) for p in range(t.partitions)]
    done = [0]

    def one(job: tuple[Topic, int]) -> PartitionCheck:
        try:
            res = verify_partition(store, *job, check_objects=check_objects, deep=deep)
        except CtpError as e:
            res = PartitionCheck(job[0].name, job[1], findings=[Finding(ERROR, f"{job[0].name}/{job[1]}", str(e))])
        done[0] += 1
        on_progress(done[0], len(wanted))
        return res

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(wanted) or 1))) as pool:
        parts = list(pool.map(one, wanted))
    return VerifyReport(parts, cluster)
