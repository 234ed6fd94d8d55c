"""The codec's msgspec paths write and read exactly what the standard library's would.

Every log entry, snapshot and run record goes through :mod:`ctp_state.codec`; at 100,000
partitions a GC run from its pack reads 200,000 entries and a pack of 100,000 snapshots,
and writes the pack again, so the codec uses msgspec's parser everywhere and its encoder
for the bodies that hold no float. A sealed record's checksum covers its bytes, and a
golden file pins them (``test_golden_bytes.py``): here, for any body, the fast encoder's
bytes are the standard library's, the parser's values are too, and the typed decode of
a current record is the step-by-step decode's.
"""

from __future__ import annotations

import json
import typing

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings, strategies as st

from ctp_state import codec, entries as en, records, snapshot
from ctp_state.errors import CorruptData
from ctp_state.records import PartitionFacts, PartitionReport, ReconcileSummary
from ctp_state.sequence import DenseSequence
from ctp_state.storage import LocalStore

# JSON without floats, with any text: ASCII (the fast encoder's bytes) and not (DEL,
# non-ASCII, lone surrogates: the standard library's).
_text = st.one_of(st.text(st.characters(max_codepoint=0x7F), max_size=12), st.text(max_size=6))
_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), _text)
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=20
)


def _stdlib(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_text, _json, min_size=1, max_size=6))
def test_the_fast_encoder_writes_the_standard_librarys_bytes_for_any_body_without_floats(body):
    assert codec.dumps(body, floats=False) == _stdlib(body)
    if "crc" not in body:
        assert codec.seal(body, floats=False) == codec.seal(body)


@pytest.mark.parametrize(
    "body",
    [{"a": 1e20}, {"a": 1e-7}, {"a": float("nan")}, {"a": "\x7f"}, {"a": "é"}, {"é": 1}, {"a": "\ud800"}],
)
def test_a_body_the_fast_encoder_would_write_otherwise_is_written_by_the_standard_library(body):
    """Floats with exponents and NaN (which the fast path is never given: ``floats``
    stays True for them) and characters from DEL up (the standard library escapes them)."""
    assert codec.dumps(body) == _stdlib(body)
    if not any(isinstance(v, float) for v in body.values()):
        assert codec.dumps(body, floats=False) == _stdlib(body)


def _types_within(t: mi.Type) -> typing.Iterator[mi.Type]:
    yield t
    if isinstance(t, mi.StructType):
        for f in t.fields:
            yield from _types_within(f.type)
    for attr in ("item_type", "key_type", "value_type"):
        if hasattr(t, attr):
            yield from _types_within(getattr(t, attr))
    for attr in ("item_types", "types"):
        for sub in getattr(t, attr, ()):
            yield from _types_within(sub)


@pytest.mark.parametrize("kind", [*en._KINDS.values(), snapshot.SnapshotV2, snapshot.SnapshotV3])
def test_log_entries_and_snapshots_hold_no_float_so_the_fast_encoder_may_write_them(kind):
    """``floats=False`` is the callers' promise: a float field added to an entry or a
    snapshot fails here, not as a sealed record whose bytes depend on the encoder."""
    found = [t for t in _types_within(mi.type_info(kind)) if isinstance(t, (mi.FloatType, mi.AnyType))]
    assert found == []


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(_text, st.one_of(_json, st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=6)
)
def test_the_parser_reads_what_the_standard_library_writes_as_it_would(body):
    data = json.dumps(body).encode()
    try:
        want = json.loads(data)
    except ValueError:
        return  # (not a record ctp writes: the parser's refusal is checked below)
    try:
        got = codec.loads(data, "k")
    except CorruptData:
        # Stricter only where ctp writes nothing of the kind: a lone surrogate.
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(body, ensure_ascii=False))
        return
    assert got == want


@pytest.mark.parametrize(
    "data, why",
    [
        (b'{"a":NaN}', "not valid JSON"),
        (b'\xef\xbb\xbf{"a":1}', "not valid JSON"),
        ('{"a":1}'.encode("utf-16"), "not valid JSON"),
        (b'{"a":"\xff"}', "not valid JSON"),
        (b'{"a":' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
        (b"[1]", "not a JSON object"),
    ],
)
def test_what_the_parser_refuses_is_corrupt_data_naming_the_key(data, why):
    with pytest.raises(CorruptData, match=f"'runs/x.json'.*{why}"):
        codec.loads(data, "runs/x.json")


def _summary(n: int) -> ReconcileSummary:
    facts = PartitionFacts(topic="t", partition=0, initialized=True, log_end_offset=3, next_offset=0)
    return ReconcileSummary(
        run_id="r",
        started_ms=1,
        finished_ms=2,
        seconds=0.25,
        cluster_epoch=5,
        idle_lag=2,
        partitions=tuple(
            PartitionReport(
                topic="t", partition=p, status="advanced", state=msgspec.structs.replace(facts, partition=p)
            )
            for p in range(n)
        ),
    )


def test_a_current_record_decodes_in_one_pass_to_what_the_step_by_step_decode_gives(tmp_path):
    seq = DenseSequence(LocalStore(str(tmp_path)), "runs/reconcile/", ReconcileSummary)
    data = codec.seal(records.encode(_summary(3)))
    fast = seq.decode(data, "runs/reconcile/1.json")
    assert records.decode_current(ReconcileSummary, codec.checked(data, "k")) == fast
    assert fast == records.decode(ReconcileSummary, codec.loads(codec.checked(data, "k"), "k"), "k")
    assert fast.partitions[2].state is not None and fast.partitions[2].state.partition == 2


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda b: {**b, "v": 99}, "version 99"),  # newer than this ctp: refused, never guessed at
        (lambda b: {**b, "v": True}, "version True"),
        (lambda b: {k: v for k, v in b.items() if k != "v"}, "version None"),
        (lambda b: {**b, "cluster_epoch": "5"}, "does not match its schema"),
        (lambda b: {**b, "partitions": [{"topic": "t"}]}, "does not match its schema"),
    ],
)
def test_a_record_the_one_pass_decode_does_not_take_gets_the_step_by_step_error(tmp_path, change, error):
    seq = DenseSequence(LocalStore(str(tmp_path)), "runs/reconcile/", ReconcileSummary)
    data = codec.seal(change(records.encode(_summary(1))))
    assert records.decode_current(ReconcileSummary, codec.checked(data, "k")) is None
    with pytest.raises(CorruptData, match=error):
        seq.decode(data, "runs/reconcile/1.json")


def test_an_unknown_member_that_is_not_utf8_is_refused_by_the_one_pass_decode_too(tmp_path):
    """msgspec skips a member its type does not know without checking its text: the
    record must still be UTF-8 as a whole, as the step-by-step decode requires."""
    seq = DenseSequence(LocalStore(str(tmp_path)), "runs/reconcile/", ReconcileSummary)
    raw = codec.dumps(records.encode(_summary(1)))
    raw = raw[:-1] + b',"zz_unknown":"\xff"}'
    data = raw[:-1] + b',"crc":"%08x"}' % codec.crc32c(raw)
    assert records.decode_current(ReconcileSummary, codec.checked(data, "k")) is None
    with pytest.raises(CorruptData, match="not valid JSON"):
        seq.decode(data, "runs/reconcile/1.json")
