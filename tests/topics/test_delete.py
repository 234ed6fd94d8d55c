"""Deleting a topic (R10, I6): a tombstone, sealed logs, and the GC's removal of what is
left -- with nothing an old incarnation writes, however late, changing what the new one
reads or what the GC deletes. On both stores; the S3 cases put the delay on the wire.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from ctp_state import layout
from ctp_state.deletion import delete_topic
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import TopicDeleted, TopicNotFound
from ctp_state.gc import run_gc
from ctp_state.incarnations import all_names, read_name
from ctp_state.l0 import Record
from ctp_state.partition_log import SNAPSHOTS_SET_ASIDE
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings
from ctp_state.topics import create_topic, get_topic, list_topics
from tests.support import Wrapped, ctp_on_path as ctp, plog, values
from tests.support.topics import NOW, load, settle, space_keys

# --- scenario 1: a snapshot that lands late ------------------------------------------------


class SlowSnapshots(Wrapped):
    """A store whose snapshot PUTs wait on ``release`` (a reader's slow request)."""

    def __init__(self, inner):
        self.inner, self.url = inner, inner.url
        self.release, self.waiting = threading.Event(), threading.Event()

    def put(self, key, data):
        if key.startswith(layout.SNAPSHOTS_ROOT):
            self.waiting.set()
            assert self.release.wait(60)
        return self.inner.put(key, data)


def test_a_snapshot_that_lands_after_delete_and_recreate_changes_nothing(store, gate):
    """Scenario 1: a reader's snapshot PUT of the old ``t`` lands after ``t`` was deleted
    and created again. Before incarnation-keyed state it replaced the new ``t``'s
    snapshot: reads served the old records and the GC deleted the new ones' L0 object."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    load(store, "old-", 70)  # a tail long enough that a reader writes a snapshot
    slow = SlowSnapshots(store)
    reader = threading.Thread(target=lambda: plog(slow, "t", 0, snapshot_every=1).read_state())
    reader.start()
    assert slow.waiting.wait(30)  # the reader's snapshot PUT is on its way
    old, _ = delete_topic(store, "t")
    new = create_topic(store, "t", 1)
    load(store, "new-", 3)
    slow.release.set()
    reader.join(30)
    assert store.head(layout.snapshot("t", 0, old.key_id)) is not None  # it landed, in its own space
    assert values(store, "t", 0) == [b"new-0", b"new-1", b"new-2"]
    settle(store)
    run_gc(store, gate=gate, config=NOW)
    assert values(store, "t", 0) == [b"new-0", b"new-1", b"new-2"]
    assert get_topic(store, "t").id == new.id


def test_a_snapshot_the_log_does_not_reach_is_set_aside_and_counted(store):
    """A snapshot is trusted only as far as its log vouches for it: one that claims
    entries the log does not hold (copied from another log, or left by a deleted
    incarnation under a reused key) is set aside, counted, and the state rebuilt."""
    create_topic(store, "t", 1)
    load(store, "a", 70)
    log = plog(store, "t", 0, snapshot_every=1)
    ahead = log.read_state()
    key = layout.snapshot("t", 0, get_topic(store, "t").key_id)
    stale = store.get(key)  # covers offset 1 (init + one placeholder)
    store.delete_many([layout.log_entry("t", 0, 1, get_topic(store, "t").key_id)])
    before = SNAPSHOTS_SET_ASIDE.value
    store.put(key, stale)
    fresh = plog(store, "t", 0, write_snapshots=False)
    got = fresh.read_state()
    assert SNAPSHOTS_SET_ASIDE.value == before + 1
    assert "the log holds no entry at 1" in (fresh.snapshot_problem or "")
    assert got.applied_offset == 0 and got.pending == () and ahead.applied_offset == 1


# --- delete, the GC, re-create -------------------------------------------------------------


def test_delete_stops_counting_for_m_and_the_gc_removes_only_the_old_incarnation(store, gate):
    """Scenario 4 too: a GC run after the delete neither wedges on the partitions its
    last run saw nor counts them for M; the old incarnation's L0 object goes once M
    passes it; its logs, snapshots and L1 files go; the new incarnation keeps all."""
    create_topic(store, "t", 2)
    ce = ClusterEpoch(store)
    ce.advance()
    load(store, "old-", 5)
    settle(store)
    assert run_gc(store, gate=gate).status == "ok"  # its view names t/0 and t/1
    load(store, "pending-", 5, partition=1)  # never reconciled: it holds M back
    old_l0 = {p.l0_key for p in plog(store, "t", 1).read_state().pending}
    old, seals = delete_topic(store, "t")
    assert seals.sealed == 2 and not seals.errors
    with pytest.raises(TopicDeleted, match="was deleted"):
        get_topic(store, "t")
    new = create_topic(store, "t", 1)  # at once: the old state is still there
    assert new.id != old.id and new.key_id not in layout.space("t", old.key_id)
    load(store, "new-", 4)
    settle(store)
    kept = space_keys(store, new)
    assert space_keys(store, old)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok", rec
    assert rec.topic_incarnations_removed == 1 and rec.topic_objects_deleted >= len(space_keys(store, new)) - 0
    assert space_keys(store, old) == []
    assert space_keys(store, new) == kept
    assert all(store.head(k) is None for k in old_l0), "M still counted the deleted partitions"
    assert values(store, "t", 0) == [f"new-{i}".encode() for i in range(4)]
    st = read_name(store, "t")
    assert st.current == new and [x.id for x in st.removed] == [old.id] and st.deleting == ()
    rec2 = run_gc(store, gate=gate, config=NOW)  # and the next run has nothing to do
    assert rec2.status == "ok" and rec2.topic_incarnations_removed == 0


def test_the_gc_waits_out_the_grace_period_before_removing_anything(store, gate):
    create_topic(store, "t", 1)
    load(store, "a", 3)
    old, _ = delete_topic(store, "t")
    before = space_keys(store, old)
    rec = run_gc(store, gate=gate, config=GcSettings(topic_removal_grace_s=3600))
    assert rec.status == "ok" and rec.topic_incarnations_removed == 0 and rec.topic_incarnations_waiting == 1
    assert space_keys(store, old) == before


def test_a_producer_that_missed_the_delete_is_rejected_by_the_sealed_log(store):
    """A producer holding the topic from before the delete: its next append meets the
    seal and is rejected, never acknowledged into a deleted topic."""
    create_topic(store, "t", 1)
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"before")])])[0].accepted
        delete_topic(store, "t")
        v = prod.write([(("t", 0), [Record(b"after")])])[0]
    assert not v.accepted and v.error is not None and "deleted" in str(v.error), v


def test_producers_racing_a_delete_never_hear_accepted_after_it_returned(store):
    """Real threads append while the delete runs: every append the log took before its
    seal is acknowledged, every one after is rejected; none is acknowledged once the
    delete has returned."""
    create_topic(store, "t", 2)
    stop, done_at, verdicts = threading.Event(), [0.0], []

    def produce(p: int) -> None:
        with Producer(store, epoch_ttl_s=0, producer_id=f"racer-{p}") as prod:
            i = 0
            while not stop.is_set():
                try:
                    v = prod.write([(("t", p), [Record(f"{p}-{i}".encode())])])[0]
                    verdicts.append((time.monotonic(), v.accepted, str(v.error or "")))
                except TopicNotFound as e:  # the producer looked the topic up again: it is gone
                    verdicts.append((time.monotonic(), False, str(e)))
                i += 1

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(2)]
    for th in threads:
        th.start()
    time.sleep(0.5)
    delete_topic(store, "t")
    done_at[0] = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for th in threads:
        th.join(30)
    after = [v for v in verdicts if v[0] > done_at[0] + 0.001]
    assert after and not any(ok for _, ok, _ in after), after[:3]
    assert any(ok for _, ok, _ in verdicts)
    # each producer heard of the delete from the sealed log, then looked the topic up again
    assert any("sealed" in why for _, _, why in verdicts) and any("was deleted" in why for _, _, why in after)


# --- the operator's view -------------------------------------------------------------------


def test_the_cli_deletes_lists_deleting_and_refuses_what_does_not_exist(store, subprocess_env, gate):
    create_topic(store, "t", 2)
    create_topic(store, "u", 1)
    gone = ctp(subprocess_env, "topic", "delete", "nope")
    assert gone.returncode != 0 and gone.stderr.strip().count("\n") == 0
    assert "topic 'nope' does not exist" in gone.stderr
    r = ctp(subprocess_env, "topic", "delete", "t", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["topic"] == "t" and out["sealed"] == 2 and out["id"]
    again = ctp(subprocess_env, "topic", "delete", "t")  # a rerun (after a kill, say) finishes it
    assert again.returncode == 0 and "was deleted already" in again.stdout, again.stderr
    listed = json.loads(ctp(subprocess_env, "topic", "list", "--json").stdout)
    assert {(x["topic"], x["state"]) for x in listed} == {("t", "deleting"), ("u", "live")}
    human = ctp(subprocess_env, "topic", "list").stdout
    assert "deleting" in human
    status = ctp(subprocess_env, "status", "--topic", "t")
    assert status.returncode != 0 and "was deleted" in status.stderr
    run_gc(store, gate=gate, config=NOW)
    listed = json.loads(ctp(subprocess_env, "topic", "list", "--json").stdout)
    assert {(x["topic"], x["state"]) for x in listed} == {("u", "live")}
    assert [t.name for t in list_topics(store)] == ["u"]
    assert [st.name for st in all_names(store)] == ["t", "u"]


def test_delete_with_an_id_deletes_only_that_incarnation_and_can_be_repeated(store, subprocess_env):
    old = create_topic(store, "t", 1)
    delete_topic(store, "t")
    new = create_topic(store, "t", 1)
    r = ctp(subprocess_env, "topic", "delete", "t", "--id", old.id, "--json")  # a rerun for the old one
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["id"] == old.id and get_topic(store, "t") == new  # the new one untouched
    r = ctp(subprocess_env, "topic", "delete", "t", "--id", "0" * 32)
    assert r.returncode != 0 and "live one is" in r.stderr
    assert get_topic(store, "t") == new


# --- kill -9 at every step -----------------------------------------------------------------


@pytest.mark.parametrize("point", ["delete_after_tombstone", "delete_after_seal:0", "delete_after_seal:1"])
def test_a_delete_killed_at_any_step_is_finished_by_the_gc(store, subprocess_env, gate, point):
    create_topic(store, "t", 3)
    load(store, "a", 3)
    old = get_topic(store, "t")
    env = {**subprocess_env, "CTP_FAULT": point}
    r = subprocess.run(["setsid", "ctp", "topic", "delete", "t"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9 or r.returncode == 137, (r.returncode, r.stderr)
    with pytest.raises(TopicDeleted):
        get_topic(store, "t")  # the tombstone went first
    new = create_topic(store, "t", 1)
    load(store, "new-", 2)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and rec.topic_incarnations_removed == 1
    assert space_keys(store, old) == []
    assert values(store, "t", 0) == [b"new-0", b"new-1"] and get_topic(store, "t") == new


@pytest.mark.parametrize(
    "point", ["gc_remove_after_tables", "gc_remove_after_l1", "gc_remove_after_snapshots", "gc_remove_after_logs"]
)
def test_a_gc_killed_while_removing_is_finished_by_the_next_run(store, subprocess_env, gate, point):
    create_topic(store, "t", 2)
    load(store, "a", 3)
    settle(store)
    old, _ = delete_topic(store, "t")
    new = create_topic(store, "t", 2)
    load(store, "new-", 2)
    env = {**subprocess_env, "CTP_FAULT": point, "CTP_GC_TOPIC_REMOVAL_GRACE_S": "0"}
    r = subprocess.run(
        ["setsid", "ctp", "gc", "--topic-removal-grace-seconds", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (-9, 137), (r.returncode, r.stderr[-2000:])
    assert read_name(store, "t").deleting  # not marked removed
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok" and rec.topic_incarnations_removed == 1
    assert space_keys(store, old) == []
    assert values(store, "t", 0) == [b"new-0", b"new-1"] and get_topic(store, "t") == new
