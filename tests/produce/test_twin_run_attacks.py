"""Review: two ``ctp produce`` runs of one file (one producer id) whose batches are cut
differently, so that one run's placeholder partly overlaps what the other already wrote.

Found by the flake of
``test_edge_attacks.py::test_two_runs_of_one_file_one_seeing_an_unknown_outcome``
(exit codes ``[1, 3]``, reason ``out_of_order_sequence``). The interleaving, pinned here
with events instead of luck:

1. Run L (loses responses on t/1, then cannot reach it) resumes both partitions at 0 and
   flushes its first batch: t/0 seq [0-1] and t/1 seq [0-1], appended in parallel.
2. Run B resumes t/0 *before* L's t/0 placeholder lands (0 held) and t/1 *after* L's t/1
   placeholder landed (2 held; its response was lost, L reports it unknown). B therefore
   skips v1, v3 and cuts its batches of 4 from ``v0 v2 v4 v5 ...``: t/0 [0-2], t/1 [2], ...
   while L cuts t/0 [0-1], [2-3], ...
3. B's t/0 [0-2] is applied after L's t/0 [0-1]: ``OutOfOrderSequence(0, expected 2)``, a
   *partial* verdict (2 already in, seq 2 = v4 "not written"). ``ctp produce`` counted v4
   as **rejected** and exited 1, and stopped sending t/0.
4. L goes on with t/0 [2-3], ... and writes v4. Every record is in the log exactly once,
   yet B said v4 was refused, not written (I4: "a rejected record never appears").

The mirror interleaving (B's partial on t/1, the partition L cannot reach) leaves t/1
unfinished after both runs; each run's "rejected" record is then written by the re-run
that the other run's exit 3 asks for. So in ``ctp produce`` the rest of a partial batch
is never refused: a run of the same input (the only other writer of the id) has written
or can write it. It is counted *unknown* (exit 3, run again), never *rejected* (exit 1).
"""

from __future__ import annotations

import json
import re
import threading

from ctp_state.cli.cmd_produce import _read_input
from ctp_state.ingest import ProduceReport, input_producer_id, produce_input
from ctp_state.topics import create_topic
from tests.support import LostResponses, Wrapped, values

WAIT_S = 30.0
T0, T1 = r"^logs/t/(?:[0-9a-f]{32}/)?000000/", r"^logs/t/(?:[0-9a-f]{32}/)?000001/"


class Gated(Wrapped):
    """Passes every request through, running ``before``/``after`` hooks on matching
    keys: ``rules`` is a list of ``(op, pattern, when, action)``; ``action(n)`` gets how
    many times the rule matched before (0 the first time). ``after`` runs only when the
    request returned normally."""

    def __init__(self, inner, rules):
        super().__init__(inner)
        self.rules = [(op, re.compile(p), when, act, [0]) for op, p, when, act in rules]

    def _hooks(self, op, key, when):
        for rop, pat, rwhen, act, n in self.rules:
            if rop == op and rwhen == when and pat.search(key):
                act(n[0])
                n[0] += 1

    def put(self, k, d):
        self._hooks("put", k, "before")
        r = self.inner.put(k, d)
        self._hooks("put", k, "after")
        return r

    def put_if_absent(self, k, d):
        self._hooks("put_if_absent", k, "before")
        r = self.inner.put_if_absent(k, d)
        self._hooks("put_if_absent", k, "after")
        return r

    def list(self, prefix="", start_after=None, end_before=None):
        self._hooks("list", prefix, "before")
        return self.inner.list(prefix, start_after, end_before)


def _wait(ev: threading.Event, what: str):
    def act(_n: int) -> None:
        assert ev.wait(WAIT_S), f"the interleaving did not happen: waited for {what}"

    return act


def _wait_after_first(ev: threading.Event, what: str):
    def act(n: int) -> None:
        if n:
            assert ev.wait(WAIT_S), f"the interleaving did not happen: waited for {what}"

    return act


def _set(ev: threading.Event):
    return lambda _n: ev.set()


def _setup(store, tmp_path):
    create_topic(store, "t", 2)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": i % 2, "value": f"v{i}"}) + "\n" for i in range(40)))
    return _read_input(store, str(path))


def _run_twins(l_store, b_store, records, digest) -> tuple[ProduceReport, ProduceReport]:
    pid = input_producer_id(digest)
    reports: dict[str, ProduceReport] = {}
    errors: list[BaseException] = []

    def run(name, store):
        try:
            reports[name] = produce_input(store, records, producer_id=pid, digest=digest, batch_records=4)
        except BaseException as e:  # surfaced below, never swallowed
            errors.append(e)

    threads = [threading.Thread(target=run, args=a) for a in (("L", l_store), ("B", b_store))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    return reports["L"], reports["B"]


def _exit_code(r: ProduceReport) -> int:  # as `ctp produce` decides it
    return 1 if r.rejected else 3 if (r.unknown or r.not_sent) else 0


def _all(p: int) -> list[bytes]:
    return [f"v{i}".encode() for i in range(p, 40, 2)]


def test_a_partial_overlap_with_a_twin_run_is_not_reported_rejected(fstore, tmp_path):
    """The CI flake: B's t/0 [0-2] lands after L's t/0 [0-1]; L then writes v4."""
    store = fstore
    records, digest = _setup(store, tmp_path)
    l_t0_landed, l_t1_landed, b_resumed, b_t0_written = (threading.Event() for _ in range(4))
    l_store = LostResponses(
        Gated(
            store,
            [
                # L's first t/0 placeholder waits until B has read t/0 (B holds 0 there) ...
                ("put_if_absent", T0, "before", _wait(b_resumed, "B to resume")),
                ("put_if_absent", T0, "after", _set(l_t0_landed)),
                # ... and L's next t/0 placeholders wait for B's overlapping one.
                ("put_if_absent", T0, "before", _wait_after_first(b_t0_written, "B's t/0 placeholder")),
                ("put_if_absent", T1, "after", _set(l_t1_landed)),
            ],
        ),
        T1,
        then_unreachable=True,
    )
    b_store = Gated(
        store,
        [
            # B reads t/1 only once L's (lost) t/1 placeholder is in: B holds 2 there.
            ("list", T1, "before", _wait(l_t1_landed, "L's t/1 placeholder")),
            ("put", r"^l0/", "before", _set(b_resumed)),
            ("put_if_absent", T0, "before", _wait(l_t0_landed, "L's t/0 placeholder")),
            ("put_if_absent", T0, "after", _set(b_t0_written)),
        ],
    )
    rl, rb = _run_twins(l_store, b_store, records, digest)
    assert l_store.lost, "L never lost a response"
    # The interleaving happened: B's t/0 batch partly overlapped L's.
    assert dict(rb.rejected_by_reason).get("out_of_order_sequence") == 1, rb.as_dict()
    assert rl.unknown == 2, rl.as_dict()
    # Every record is in exactly once: B's "not written" v4 was written by L.
    assert values(store, "t", 0) == _all(0) and values(store, "t", 1) == _all(1)
    assert rb.rejected == 0 and rl.rejected == 0, (rb.as_dict(), rl.as_dict())
    assert sorted([_exit_code(rl), _exit_code(rb)]) == [3, 3]
    for r in (rl, rb):
        assert r.accepted + r.duplicates + r.unknown + r.not_sent == 40


def test_the_mirror_interleaving_leaves_a_partition_for_the_rerun(fstore, tmp_path):
    """B resumes t/0 after L's first t/0 placeholder (2 held) and t/1 before L's (0
    held), so its batches are t/0 [2], t/1 [0-2], ...; its t/1 [0-2] lands after L's lost
    t/1 [0-1]: partial, and B stops t/1, the partition L cannot reach. After both runs t/1
    holds L's first two records only (both runs must say so: exit 3, not 1), and the
    re-run writes the rest, including v5, which B's partial verdict was counted as
    rejected. (L's t/0 [2-3], held until B's t/0 [2] is in, is partial or unverifiable
    depending on how far B got: unknown either way.)"""
    store = fstore
    records, digest = _setup(store, tmp_path)
    l_t0_landed, l_t1_landed, b_resumed, b_t0_written = (threading.Event() for _ in range(4))
    l_store = LostResponses(
        Gated(
            store,
            [
                ("put_if_absent", T0, "after", _set(l_t0_landed)),
                ("put_if_absent", T0, "before", _wait_after_first(b_t0_written, "B's t/0 placeholder")),
                ("put_if_absent", T1, "before", _wait(b_resumed, "B to resume")),
                ("put_if_absent", T1, "after", _set(l_t1_landed)),
            ],
        ),
        T1,
        then_unreachable=True,
    )
    b_store = Gated(
        store,
        [
            ("list", T0, "before", _wait(l_t0_landed, "L's t/0 placeholder")),
            ("put", r"^l0/", "before", _set(b_resumed)),
            ("put_if_absent", T1, "before", _wait(l_t1_landed, "L's t/1 placeholder")),
            ("put_if_absent", T0, "after", _set(b_t0_written)),
        ],
    )
    rl, rb = _run_twins(l_store, b_store, records, digest)
    assert l_store.lost, "L never lost a response"
    assert dict(rb.rejected_by_reason).get("out_of_order_sequence") == 1, rb.as_dict()
    assert values(store, "t", 0) == _all(0)
    assert values(store, "t", 1) == _all(1)[:2]  # nobody finished t/1: both runs must say so
    assert rb.rejected == 0 and rl.rejected == 0, (rb.as_dict(), rl.as_dict())
    assert [_exit_code(rl), _exit_code(rb)] == [3, 3]
    again = produce_input(store, records, producer_id=input_producer_id(digest), digest=digest, batch_records=4)
    assert _exit_code(again) == 0 and again.accepted == 18, again.as_dict()
    assert values(store, "t", 0) == _all(0) and values(store, "t", 1) == _all(1)
