"""Run records: typed, versioned, one codec. Every type round-trips through the sealed
codec; an old version is upcast on read; a newer or malformed one is refused with the key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ctp_state import codec, records
from ctp_state.errors import CorruptData, UnsupportedVersion
from ctp_state.gc.history import GcHistory
from ctp_state.records import GateInfo, GcPartitionView, GcRecord, PartitionFacts, PartitionReport, ReconcileSummary
from ctp_state.sequence import DenseSequence

# JSON has no NaN or infinity, and the store keeps JSON: generate what can be stored.
FINITE = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=12)
SCALAR = st.none() | st.booleans() | st.integers(-(2**62), 2**62) | FINITE | TEXT


@pytest.fixture(autouse=True, scope="module")
def json_strategies():
    # A mapping field's default is a factory, which hypothesis would pass through as
    # the value: mappings are generated explicitly.
    st.register_type_strategy(float, FINITE)
    st.register_type_strategy(str, TEXT)
    st.register_type_strategy(GateInfo, st.builds(GateInfo, statistics=st.dictionaries(TEXT, SCALAR, max_size=4)))
    yield
    from hypothesis.strategies._internal import types

    for t in (float, str, GateInfo):
        types._global_type_lookup.pop(t, None)


GC_RECORDS = st.builds(
    GcRecord, config=st.dictionaries(TEXT, SCALAR, max_size=4), failed_keys=st.dictionaries(TEXT, TEXT, max_size=4)
)


def _stored(rec):
    """Through the codec and back, as the store keeps it."""
    body = codec.unseal(codec.seal(records.encode(rec)), "k")
    return body


@settings(max_examples=40, deadline=None)
@given(GC_RECORDS)
def test_a_gc_record_round_trips(rec):
    back = records.decode(GcRecord, _stored(rec), "gc/history/x.json")
    assert back == records.msgspec.structs.replace(rec, v=GcRecord.VERSION)


@settings(max_examples=40, deadline=None)
@given(st.builds(ReconcileSummary, seconds=FINITE))  # from_type alone ignores the float registration
def test_a_reconcile_summary_round_trips(rec):
    back = records.decode(ReconcileSummary, _stored(rec), "runs/reconcile/x.json")
    assert back == records.msgspec.structs.replace(rec, v=ReconcileSummary.VERSION)


@settings(max_examples=40, deadline=None)
@given(st.from_type(GcPartitionView) | st.from_type(PartitionReport) | st.from_type(PartitionFacts))
def test_unversioned_records_round_trip(rec):
    assert records.convert(type(rec), _stored(rec), "k") == rec


def test_a_version_1_gc_record_is_upcast_on_read(store):
    """Version 1 records were written before records were sealed: still read, as the
    current type (the upcast path, DenseSequence's legacy version)."""
    v1 = {
        "v": 1,
        "seq": 0,
        "run_id": "r",
        "status": "ok",
        "started_ms": 1,
        "finished_ms": 2,
        "seconds": 0.1,
        "m": 4,
        "cluster_epoch": 6,
        "deleted": 3,
    }
    store.put_if_absent("gc/history/00000000000000000000.json", codec.dumps(v1))
    (rec,) = GcHistory(store).tail(5)
    assert isinstance(rec, GcRecord) and rec.v == GcRecord.VERSION and (rec.m, rec.deleted, rec.passed) == (4, 3, True)


def test_a_version_2_gc_record_reads_as_the_current_version_without_an_alert(store):
    """What the release before alerts wrote (sealed, version 2, no ``alert``) reads as a
    current record: the 2 -> 3 upcaster fills the new field, 3 -> 4 the delete details."""
    v2 = {"v": 2, "seq": 0, "run_id": "r", "status": "ok", "started_ms": 1, "finished_ms": 2, "seconds": 0.1, "m": 4}
    store.put_if_absent("gc/history/00000000000000000000.json", codec.seal(v2))
    (rec,) = GcHistory(store).tail(5)
    assert rec.v == GcRecord.VERSION == 4 and rec.alert is None and rec.m == 4
    assert (rec.delete_epochs, rec.delete_sample, rec.deletes_key) == (None, (), None)


def test_a_version_3_gc_record_reads_as_version_4_with_no_delete_details(store):
    """What the release before the delete audit wrote (version 3, with an alert) reads
    as version 4: the counts stay, the delete details are empty."""
    v3 = {
        "v": 3,
        "seq": 0,
        "run_id": "r",
        "status": "ok",
        "started_ms": 1,
        "finished_ms": 2,
        "seconds": 0.1,
        "m": 4,
        "deleted": 7,
        "alert": {"kind": "stall", "message": "M stalled", "where": ["t/0"]},
    }
    store.put_if_absent("gc/history/00000000000000000000.json", codec.seal(v3))
    (rec,) = GcHistory(store).tail(5)
    assert rec.v == 4 and rec.deleted == 7 and rec.alert is not None and rec.alert.where == ("t/0",)
    assert (rec.delete_epochs, rec.delete_sample, rec.deletes_key) == (None, (), None)


def test_an_upcaster_runs_for_each_version_between(monkeypatch):
    """The chain N -> N+1 -> ... -> VERSION: a version-1 record passes every step."""
    steps = []

    def one_to_two(d):
        steps.append(1)
        return {**d, "renamed": d.pop("old")}

    def two_to_three(d):
        steps.append(2)
        return {**d, "run_id": d.pop("renamed")}

    monkeypatch.setattr(ReconcileSummary, "VERSION", 3)
    monkeypatch.setattr(ReconcileSummary, "UPCASTERS", {1: one_to_two, 2: two_to_three})
    body = {
        "v": 1,
        "old": "run-7",
        "started_ms": 1,
        "finished_ms": 2,
        "seconds": 0.5,
        "cluster_epoch": 3,
        "idle_lag": 2,
    }
    rec = records.decode(ReconcileSummary, body, "runs/reconcile/k.json")
    assert steps == [1, 2] and rec.run_id == "run-7" and rec.v == 3


@pytest.mark.parametrize("v", [GcRecord.VERSION + 1, 0, None, "2", True])
def test_an_unknown_version_is_refused_naming_the_key(v):
    with pytest.raises(UnsupportedVersion, match=r"gc/history/7\.json.*GC history record version"):
        records.decode(
            GcRecord,
            {"v": v, "run_id": "r", "status": "ok", "started_ms": 1, "finished_ms": 1, "seconds": 0},
            "gc/history/7.json",
        )


def test_a_record_that_does_not_fit_its_type_is_corrupt_naming_the_key():
    with pytest.raises(
        CorruptData,
        match=r"runs/reconcile/3\.json.*reconcile run summary does not match its "
        r"schema: Expected `int`, got `str` - at `\$.cluster_epoch`",
    ):
        records.decode(
            ReconcileSummary,
            {
                "v": 2,
                "run_id": "r",
                "started_ms": 1,
                "finished_ms": 1,
                "seconds": 0,
                "cluster_epoch": "three",
                "idle_lag": 2,
            },
            "runs/reconcile/3.json",
        )


def test_a_sequence_stores_and_returns_typed_records(store):
    seq = DenseSequence(store, "runs/reconcile/", ReconcileSummary)
    made = seq.append(
        lambda n: ReconcileSummary(
            run_id=f"r{n}", started_ms=1, finished_ms=2, seconds=0.0, cluster_epoch=1, idle_lag=2
        )
    )
    assert (made.seq, made.v, made.run_id) == (0, 2, "r0")
    assert seq.newest() == made == seq.get(0)


def test_a_produce_marker_of_version_1_upcasts_to_one_about_first_incarnations():
    """Version 1 markers predate topic incarnations: they read as naming none
    (``topics`` None), and today's encoder writes version 2 with the same fields."""
    from ctp_state.records import ProduceMarker

    v1 = {"v": 1, "producer_id": "p", "digest": "ab" * 32, "records": 4, "completed_ms": 1, "partitions": {"t/0": 4}}
    old = records.decode(ProduceMarker, codec.unseal(codec.seal(v1), "produce/p.json"), "produce/p.json")
    assert old.topics is None and old.records == 4 and old.partitions == {"t/0": 4}
    new = records.msgspec.structs.replace(old, topics={"t": "0" * 32})
    body = records.encode(new)
    assert body["v"] == 2 and body["topics"] == {"t": "0" * 32}
    assert records.decode(ProduceMarker, body, "produce/p.json") == records.msgspec.structs.replace(new, v=2)
    with pytest.raises(CorruptData, match="produce/p.json"):
        records.decode(ProduceMarker, {**body, "records": "four"}, "produce/p.json")
