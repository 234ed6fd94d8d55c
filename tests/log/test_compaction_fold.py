"""The fold of the entries that change a partition's committed L1 files after the fact
(R11): ``compact`` (a run of adjacent files replaced by one) and ``trim`` (the start
offset moves forward; files wholly before it leave the committed set)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ctp_state import codec, entries as en, layout, snapshot, state as sm
from ctp_state.entries import AccessMode, Claim, Compact, Init, Placeholder, Reconcile, Release, Trim, TrimReason
from ctp_state.errors import CorruptData, InvalidTransition, WriterFenced

T, P = "t", 0


class Log:
    def __init__(self):
        self.state = sm.PartitionState(T, P)
        self.n = 0
        self.add(Init(1))

    def add(self, entry) -> sm.Outcome:
        out = sm.apply(self.state, self.n, entry)
        self.n += 1
        self.state = out.state
        return out

    def ok(self, entry) -> sm.PartitionState:
        out = self.add(entry)
        assert out.accepted, out.rejected
        return out.state

    def claim(self, owner="w", now=0) -> int:
        we = self.state.writer_epoch + 1
        self.ok(Claim(we, owner, AccessMode.EXCLUSIVE, now + 10**6, now))
        return we

    def reconcile(self, *sizes: int) -> None:
        """Records in files of ``sizes`` records each, reconciled in one entry."""
        for n in sizes:
            self.ok(Placeholder(1, "l0/000/000000000000000001/x.l0", 0, 10, n, 0))
        first = self.state.last_reconciled_offset + 1
        keys, crcs = [], []
        for n in sizes:
            keys.append(layout.l1_key(T, P, first, first + n - 1))
            crcs.append(first)  # any CRC32C; the fold only carries it
            first += n
        we = self.claim("r")
        self.ok(Reconcile(self.n - 1, first - 1, tuple(keys), 1, we, tuple(crcs), release_owner="r"))

    def compact(self, i: int, j: int, *, we: int | None = None, **over) -> sm.Outcome:
        """Compact committed files i..j (inclusive) under a fresh claim (or ``we``)."""
        files = self.state.committed_l1_files()[i : j + 1]
        we = we if we is not None else self.claim("c")
        first, last = files[0].first, files[-1].last
        fields = {
            "first_offset": first,
            "last_offset": last,
            "replaced": tuple(f.key for f in files),
            "replaced_crc32c": tuple(f.crc32c for f in files),
            "l1_key": layout.l1_key(T, P, first, last, None, we),
            "l1_crc32c": 7,
            "record_count": last - first + 1,
            "writer_epoch": we,
            "release_owner": "c",
        }
        fields.update(over)
        return self._released(self.add(Compact(**fields)), we)

    def _released(self, out: sm.Outcome, we: int) -> sm.Outcome:
        """A writer whose entry was rejected gives its claim up, as ctp's do."""
        if not out.accepted and any(h.writer_epoch == we for h in self.state.holders):
            self.ok(Release("c", we))
        return out

    def trim(self, start: int, *, we: int | None = None) -> sm.Outcome:
        we = we if we is not None else self.claim("c")
        return self._released(self.add(Trim(start, TrimReason.DELETE_RECORDS, we, release_owner="c")), we)


def ranges(s: sm.PartitionState) -> list[tuple[int, int]]:
    return [(f.first, f.last) for f in s.committed_l1_files()]


def roundtrip(s: sm.PartitionState) -> sm.PartitionState:
    return snapshot.decode_snapshot(snapshot.encode_snapshot(s), "snap")


def test_a_compaction_replaces_a_run_of_adjacent_files_by_one_keyed_by_its_writer_epoch():
    log = Log()
    log.reconcile(3, 4, 5, 6)
    out = log.compact(1, 2)
    assert out.accepted, out.rejected
    s = out.state
    assert ranges(s) == [(0, 2), (3, 11), (12, 17)]
    files = s.committed_l1_files()
    assert files[1].key == layout.l1_key(T, P, 3, 11, None, s.writer_epoch)
    assert files[1].key.endswith(f".w{s.writer_epoch:020d}.parquet")
    assert files[1].crc32c == 7 and files[0].crc32c == 0 and files[2].crc32c == 12
    assert s.l1_changed_log_offset == log.n - 1
    assert layout.parse_l1_key(files[1].key).compacted_by == s.writer_epoch
    # A reconcile after it appends as before; the snapshot holds it all (version 3).
    log.reconcile(2)
    assert ranges(log.state)[-1] == (18, 19)
    assert roundtrip(log.state) == log.state.persisted
    assert codec.unseal(snapshot.encode_snapshot(log.state), "s", "snapshot")["v"] == 3


def test_a_partition_never_compacted_keeps_writing_version_2_snapshots_and_entries():
    log = Log()
    log.reconcile(3, 4)
    assert codec.unseal(snapshot.encode_snapshot(log.state), "s", "snapshot")["v"] == 2
    assert log.state.l1_tags == ()


@pytest.mark.parametrize(
    "over, why",
    [
        ({"replaced_crc32c": (3, 99)}, "names files or CRC32Cs"),
        ({"l1_crc32c": 1, "l1_key": layout.l1_key(T, P, 3, 11)}, "expected"),  # a reconcile's key
        ({"first_offset": 4}, "does not match"),
        ({"last_offset": 12, "record_count": 10}, "does not match"),
    ],
)
def test_a_compaction_that_does_not_name_the_run_as_committed_is_rejected(over, why):
    log = Log()
    log.reconcile(3, 4, 5)
    before = ranges(log.state)
    out = log.compact(1, 2, **over)
    assert not out.accepted and why in str(out.rejected)
    assert ranges(out.state) == before


def test_a_compaction_under_another_writer_epochs_key_is_rejected():
    log = Log()
    log.reconcile(3, 4)
    we = log.claim("c")
    out = log.compact(0, 1, we=we, l1_key=layout.l1_key(T, P, 0, 6, None, we - 1))
    assert isinstance(out.rejected, InvalidTransition)


def test_a_fenced_compactor_never_commits():
    log = Log()
    log.reconcile(3, 4)
    zombie = log.claim("c")
    log.claim("c2", now=10**7)  # the lease ran out: c2 takes over, c is fenced (R5)
    out = log.compact(0, 1, we=zombie)
    assert isinstance(out.rejected, WriterFenced)
    assert ranges(out.state) == [(0, 2), (3, 6)]


def test_a_compaction_needs_a_live_exclusive_claim():
    log = Log()
    log.reconcile(3, 4)
    we = log.state.writer_epoch  # the reconcile released its claim
    out = log.compact(0, 1, we=we, release_owner=None)
    assert isinstance(out.rejected, InvalidTransition) and "exclusive claim" in str(out.rejected)


def test_a_trim_moves_the_start_offset_and_drops_whole_files_only():
    log = Log()
    log.reconcile(3, 4, 5)
    s = log.trim(5).state
    assert (s.start_offset, s.l1_first) == (5, 3)  # inside the second file: it stays
    assert ranges(s) == [(3, 6), (7, 11)]
    s = log.trim(12).state  # everything in L1
    assert (s.start_offset, s.l1_first, ranges(s)) == (12, 12, [])
    assert roundtrip(s) == s.persisted
    log.reconcile(2)
    assert ranges(log.state) == [(12, 13)]
    assert roundtrip(log.state) == log.state.persisted


@pytest.mark.parametrize("start, why", [(2, "does not move it forward"), (3, "does not move it forward")])
def test_start_offsets_only_grow(start, why):
    log = Log()
    log.reconcile(3, 4)
    log.trim(3)
    out = log.trim(start)
    assert not out.accepted and why in str(out.rejected)
    assert out.state.start_offset == 3


def test_a_trim_never_passes_what_is_in_l1():
    log = Log()
    log.reconcile(3)
    log.ok(Placeholder(1, "l0/000/000000000000000001/x.l0", 0, 10, 4, 0))  # pending, not in L1
    out = log.trim(4)
    assert not out.accepted and "passes what is in L1" in str(out.rejected)


def test_the_entries_are_version_4_and_a_version_4_of_another_kind_is_refused():
    c = Compact(0, 5, ("a", "b"), (1, None), "k", 3, 6, 2)
    t = Trim(9, TrimReason.RETENTION_MS, 2, release_owner="c")
    for e in (c, t):
        raw = en.encode(e)
        assert codec.unseal(raw, "k", "entry")["v"] == 4
        assert en.decode(raw, "k") == e
    body = codec.unseal(en.encode(Init(3)), "k", "entry")
    body["v"] = 4
    with pytest.raises(CorruptData, match="compact and trim entries are version 4"):
        en.decode(codec.seal(body), "k")
    body = codec.unseal(en.encode(c), "k", "entry")
    body["v"] = 2
    with pytest.raises(CorruptData, match="version 4"):
        en.decode(codec.seal(body), "k")
    body = codec.unseal(en.encode(c), "k", "entry")
    body["record_count"] = 5
    with pytest.raises(CorruptData, match="record_count"):
        en.decode(codec.seal(body), "k")
    body = codec.unseal(en.encode(c), "k", "entry")
    body["replaced"], body["replaced_crc32c"] = ["a"], [1]
    with pytest.raises(CorruptData, match="two files or more"):
        en.decode(codec.seal(body), "k")


def test_a_version_2_snapshot_holding_a_compactions_fields_is_refused():
    log = Log()
    log.reconcile(3, 4)
    log.compact(0, 1)
    body = codec.unseal(snapshot.encode_snapshot(log.state), "s", "snapshot")
    body["v"] = 2
    with pytest.raises(CorruptData, match="version 2 snapshot"):
        snapshot.decode_snapshot(codec.seal(body), "s")


@pytest.mark.parametrize(
    "field, value",
    [("start_offset", 99), ("l1_first", 5), ("l1_tags", [3]), ("l1_changed_log_offset", 10**6)],
)
def test_a_snapshot_whose_files_or_start_do_not_add_up_is_refused(field, value):
    log = Log()
    log.reconcile(3, 4)
    log.compact(0, 1)
    log.reconcile(2)
    body = codec.unseal(snapshot.encode_snapshot(log.state), "s", "snapshot")
    body[field] = value
    with pytest.raises(CorruptData, match="not self-consistent"):
        snapshot.decode_snapshot(codec.seal(body), "s")


# --- any mix: the committed files always tile [l1_first, last reconciled] -------------

step = st.one_of(
    st.tuples(st.just("reconcile"), st.lists(st.integers(1, 5), min_size=1, max_size=3)),
    st.tuples(st.just("compact"), st.integers(0, 6), st.integers(1, 4)),
    st.tuples(st.just("trim"), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=25))
def test_any_mix_of_reconciles_compactions_and_trims_keeps_every_retained_record_once(steps):
    log = Log()
    for s in steps:
        if s[0] == "reconcile":
            log.reconcile(*s[1])
        elif s[0] == "compact":
            n = len(log.state.l1_ends)
            i, width = s[1], s[2]
            if n >= 2:
                i = i % (n - 1)
                j = min(n - 1, i + width)
                assert log.compact(i, j).accepted
        else:
            start = s[1]
            expect = log.state.start_offset < start <= log.state.last_reconciled_offset + 1
            out = log.trim(start)
            assert out.accepted == expect, out.rejected
        st_ = log.state
        covered = [o for f in st_.committed_l1_files() for o in range(f.first, f.last + 1)]
        assert covered == list(range(st_.l1_first, st_.last_reconciled_offset + 1))  # each once, in order
        assert st_.l1_first <= st_.start_offset <= st_.last_reconciled_offset + 1
        assert not st_.l1_ends or st_.l1_ends[0] >= st_.start_offset  # no file wholly before the start
        assert snapshot.inconsistencies(st_) == []
        assert roundtrip(st_) == st_.persisted
        assert len({f.key for f in st_.committed_l1_files()}) == len(st_.l1_ends)
