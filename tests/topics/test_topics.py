"""Creating a topic against real stores: the epoch its inits carry, a crashed creation
finished by running it again, and its progress."""

from __future__ import annotations

import pytest

from ctp_state import layout
from ctp_state.entries import Init, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import TopicExists
from ctp_state.topics import create_topic, list_topics
from tests.support import key_id, plog


def test_partition_inits_carry_the_epoch_current_at_creation(store):
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()
    create_topic(store, "t", 3)
    for p in range(3):
        s = plog(store, "t", p).read_state()
        assert (s.max_applied_epoch, s.previous_applied_epoch, s.min_epoch_lower_bound, s.m) == (4, 4, 4, 3)
        assert s.window == (4, 4)


def test_a_crashed_topic_creation_is_finished_by_running_it_again(store):
    # The crash left the metadata and the init of partition 0 only.
    store.put_if_absent(layout.topic_meta("t"), b'{"v":1,"name":"t","partitions":3,"created_ms":1}')
    store.put_if_absent(layout.log_entry("t", 0, 0), encode(Init(1)))
    ClusterEpoch(store).advance()
    assert not plog(store, "t", 2).read_state().initialized
    create_topic(store, "t", 3)  # resumes
    assert plog(store, "t", 0).read_state().max_applied_epoch == 1
    assert plog(store, "t", 2).read_state().max_applied_epoch == 2
    with pytest.raises(TopicExists):
        create_topic(store, "t", 3)  # complete now: a plain re-create is an error
    with pytest.raises(TopicExists):
        create_topic(store, "t", 5)
    assert [t.name for t in list_topics(store)] == ["t"]


def test_topic_create_reports_progress_as_the_inits_land(store):
    seen: list[tuple[int, int]] = []
    create_topic(store, "big", 1001, on_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 1001), (1000, 1001), (1001, 1001)]
    assert len(list(store.list(layout.log_prefix("big", 1000, key_id(store, "big"))))) == 1  # the last init is there
