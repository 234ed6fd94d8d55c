"""Issue 9.2: offset 0 of a partition log is its init entry and nothing else.

A producer that reaches a partition before its init entry (a topic creation still
running, or killed) must write nothing there; a log an older ctp damaged that way is
repaired by running ``ctp topic create`` again, and the GC works again afterwards.
"""

from __future__ import annotations

import threading

from click.testing import CliRunner

from ctp_state import layout
from ctp_state.cli import main
from ctp_state.entries import Init, Placeholder, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import compute_m
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.status import read_states, select_topics
from ctp_state.topics import create_topic
from tests.support import key_id, plog
from tests.support.topics import crashed_create


def m_now(store):
    return compute_m(ClusterEpoch(store).current(), read_states(store, select_topics(store)), now_ms=0)


def test_a_write_before_the_init_entry_writes_nothing_and_creation_finishes(store):
    crashed_create(store, "t", 2, with_init=(0,))
    with Producer(store, epoch_ttl_s=0) as prod:
        early, fine = prod.write([(("t", 1), [Record(b"early")]), (("t", 0), [Record(b"fine")])])
    assert fine.accepted and not early.accepted
    assert "not initialized" in str(early.error)
    assert store.head(layout.log_entry("t", 1, 0, key_id(store, "t"))) is None  # offset 0 stays free for the init
    assert m_now(store).m is None  # collection waits for the init, as R4 needs

    create_topic(store, "t", 2, exist_ok=True)  # finishing the creation
    assert plog(store, "t", 1).read_state().initialized
    assert m_now(store).m is not None
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 1), [Record(b"late")])])[0].accepted
    assert [r["value"] for r in read_partition(store, "t", 1).to_pylist()] == [b"late"]


def test_a_log_an_older_ctp_damaged_is_repaired_by_topic_create(store, store_url, monkeypatch):
    crashed_create(store, "t", 2, with_init=(0,))
    # The old producer appended its placeholder at offset 0 of the empty log, and a
    # second one after it; both were (and stay) rejected: the log has no init.
    key = layout.l0_key(0, 1, "old")
    store.put(key, b"whatever")
    store.put_if_absent(layout.log_entry("t", 1, 0, key_id(store, "t")), encode(Placeholder(1, key, 8, 10, 1, 0)))
    store.put_if_absent(layout.log_entry("t", 1, 1, key_id(store, "t")), encode(Placeholder(1, key, 18, 10, 1, 0)))
    assert m_now(store).m is None  # every GC is blocked

    url, env = store_url
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = CliRunner().invoke(main, ["topic", "create", "t", "--partitions", "2", "--exist-ok", "--store", url])
    assert out.exit_code == 0, out.output
    assert "repaired t/1" in out.output
    state = plog(store, "t", 1).read_state()
    assert state.initialized and state.next_offset == 0  # the old, rejected entries stay without effect
    assert m_now(store).m is not None
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 1), [Record(b"after repair")])])[0]
    assert v.accepted and v.base_offset == 0
    assert [r["value"] for r in read_partition(store, "t", 1).to_pylist()] == [b"after repair"]
    # Running it again changes nothing.
    again = CliRunner().invoke(main, ["topic", "create", "t", "--partitions", "2", "--exist-ok", "--store", url])
    assert again.exit_code == 0 and "repaired" not in again.output


def test_producing_while_a_topic_is_created_never_takes_offset_0(store):
    partitions = 120
    stop = threading.Event()
    seen: list[bool] = []

    def produce() -> None:
        with Producer(store, epoch_ttl_s=0) as prod:
            while not stop.is_set():
                try:
                    v = prod.write([(("race", partitions - 1), [Record(b"x")])])[0]
                except Exception:
                    continue
                seen.append(v.accepted)
                if v.accepted:
                    return

    t = threading.Thread(target=produce)
    t.start()
    try:
        create_topic(store, "race", partitions)
    finally:
        t.join(60)
        stop.set()
    entry0 = plog(store, "race", partitions - 1)
    first = next(entry0.entries())
    assert isinstance(first[1], Init)
    assert seen and seen[-1] is True
    assert m_now(store).m is not None


def test_racing_repairs_append_one_init(store):
    crashed_create(store, "t", 2, with_init=(0,))
    key = layout.l0_key(0, 1, "old")
    store.put_if_absent(layout.log_entry("t", 1, 0, key_id(store, "t")), encode(Placeholder(1, key, 8, 10, 1, 0)))
    errors: list[Exception] = []

    def repair() -> None:
        try:
            create_topic(store, "t", 2, exist_ok=True)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=repair) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    inits = [o for o, e in plog(store, "t", 1).entries() if isinstance(e, Init)]
    assert len(inits) == 1 and plog(store, "t", 1).read_state().initialized
