"""Issue 9.5: the cluster epoch is believed only as far as the store vouches for it.

The hint is a cache of the newest marker an advancer created; a hint whose marker does
not exist (a hand edit, a flipped digit, a bug) must not move C. Epochs are bounded to
what an L0 key's 18 digits can hold, and ``advance`` refuses to pass that bound.
"""

from __future__ import annotations

import json

import pytest

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import InvalidEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from ctp_state.validate import MAX_EPOCH

HUGE = 999_999_999_999_999_999


def test_a_hint_without_its_marker_is_not_believed_and_is_repaired(store):
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()
    assert ce.current() == 4
    store.put(layout.EPOCH_HINT, json.dumps({"epoch": HUGE}).encode())  # no marker vouches for it

    assert ce.current() == 4
    assert ce.advance() == 5
    assert json.loads(store.get(layout.EPOCH_HINT))["epoch"] == 5  # the next advance rewrote it

    # Producers write keys that every GC can parse, and records are accepted.
    create_topic(store, "t", 1)
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 0), [Record(b"x")])])[0]
    assert v.accepted, v.error
    assert layout.parse_l0_key(v.l0_key)[1] == 5


def test_a_hint_below_the_newest_marker_only_costs_probes(store):
    ce = ClusterEpoch(store)
    for _ in range(4):
        ce.advance()
    store.put(layout.EPOCH_HINT, json.dumps({"epoch": 2}).encode())
    assert ce.current() == 5


def test_a_garbage_hint_falls_back_to_the_markers(store):
    ce = ClusterEpoch(store)
    ce.advance()
    store.put(layout.EPOCH_HINT, b"\x00not json")
    assert ce.current() == 2 and ce.advance() == 3


def test_epochs_are_bounded_by_the_key_format_and_advance_refuses_to_pass_it(store):
    assert MAX_EPOCH == 10**18 - 1 and len(f"{MAX_EPOCH:018d}") == 18
    with pytest.raises(InvalidEpoch, match="18 digits"):
        layout.l0_key(0, MAX_EPOCH + 1, "x")
    # A store whose markers legitimately reached the bound (vouched hint).
    store.put_if_absent(layout.epoch_marker(MAX_EPOCH), json.dumps({"epoch": MAX_EPOCH}).encode())
    store.put(layout.EPOCH_HINT, json.dumps({"epoch": MAX_EPOCH}).encode())
    ce = ClusterEpoch(store)
    assert ce.current() == MAX_EPOCH
    with pytest.raises(InvalidEpoch, match="maximum"):
        ce.advance()
    assert ce.current() == MAX_EPOCH  # nothing moved


def test_an_advance_whose_response_was_lost_moves_c_exactly_once(store):
    """The marker was created but the reply never came: the advance sends the same
    bytes again, finds them, and knows the epoch is its own -- it neither fails (a DAG
    retry would advance twice) nor skips ahead."""
    from tests.support import LostResponses

    ce = ClusterEpoch(store)
    before = ce.current()
    lossy = LostResponses(store, r"^cluster/epoch/markers/", times=1)
    assert ClusterEpoch(lossy).advance() == before + 1
    assert lossy.lost == [layout.epoch_marker(before + 1)]
    assert ce.current() == before + 1


def test_two_advancers_never_own_the_same_epoch(store):
    """Racing advances each get their own epoch: the markers name the advance."""
    from concurrent.futures import ThreadPoolExecutor

    before = ClusterEpoch(store).current()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: ClusterEpoch(store).advance(), range(16)))
    assert sorted(got) == list(range(before + 1, before + 17))


def test_an_advance_whose_hint_write_fails_still_reports_the_epoch_it_took(store):
    """The marker is the fact; the hint only saves readers a listing. Failing the
    advance after C moved would make a retry (Airflow's) advance twice."""
    from ctp_state.errors import StoreError
    from tests.support import Wrapped

    class HintDown(Wrapped):
        def put(self, key, data):
            if key == layout.EPOCH_HINT:
                raise StoreError("connection reset while writing the hint")
            return self.inner.put(key, data)

    before = ClusterEpoch(store).current()
    assert ClusterEpoch(HintDown(store)).advance() == before + 1
    assert ClusterEpoch(store).current() == before + 1
