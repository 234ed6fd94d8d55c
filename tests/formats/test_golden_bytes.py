"""Bytes written by an earlier ctp still read, and today's ctp writes the same bytes.

``golden/entries.jsonl`` and ``golden/snapshots.jsonl`` were written by the hand-written
entry and snapshot encoders that the msgspec codec replaced (regenerate them only when a
format version changes, never to make this test pass). Each line is ``{"name", "bytes"}``;
the values they must decode to are built here, in code. A codec change that reorders a
field, drops a default or renames a tag fails here before it reaches a store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctp_state import entries as en, layout, snapshot, state as sm
from ctp_state.entries import AccessMode, Advance, Claim, Init, Placeholder, Reconcile, Release, Seal, Tick
from ctp_state.errors import CorruptData

GOLDEN = Path(__file__).parent / "golden"
TOPIC_ID = "0123456789abcdef0123456789abcdef"
L0 = "l0/000/000000000000000004/0000000000000000001-aaaa.l0"
L1 = "l1/t/000000/00000000000000000000-00000000000000000009.parquet"


def golden_entries() -> dict[str, en.Entry]:
    return {
        "init": Init(3),
        "placeholder": Placeholder(4, L0, 8, 100, 5, 123),
        "placeholder_fenced": Placeholder(4, L0, 108, 1, 1, 0, 2),
        "placeholder_idempotent": Placeholder(4, L0, 8, 100, 5, 0xFFFFFFFF, 3, "producer-1", 17, 0xFFFFFFFF),
        "reconcile": Reconcile(4, 9, (L1,), 2, 1),
        "reconcile_crc": Reconcile(4, 9, (L1, L1.replace("0009", "0010")), 2, 1, (5, 0xFFFFFFFF)),
        "reconcile_releasing": Reconcile(4, 9, (L1,), 2, 1, (5,), "reconciler:1"),
        "reconcile_nothing": Reconcile(4, -1, (), 2, 1),
        "advance": Advance(3, 1),
        "advance_releasing": Advance(3, 1, "reconciler:1"),
        "claim": Claim(2, "reconciler:1", AccessMode.EXCLUSIVE, 61_000, 1_000),
        "claim_shared_expired": Claim(3, "w", AccessMode.SHARED, 61_000, 1_000, (("old", 1), ("older", 2))),
        "claim_wait": Claim(4, "w", AccessMode.WAIT_FOR_EXCLUSIVE, 61_000, 1_000),
        "release": Release("reconciler:1", 2),
        "seal": Seal(1_700_000_000_000),
        "tick": Tick(3, 2, "reconciler:1"),  # version 5
    }


def golden_states() -> dict[str, sm.PartitionState]:
    """States folded from entries by the pure state machine, as a log would hold them."""

    def fold(topic_id: str | None, entries: list[en.Entry]) -> sm.PartitionState:
        s = sm.PartitionState("t", 0, topic_id=topic_id)
        for offset, e in enumerate(entries):
            out = sm.apply(s, offset, e)
            assert out.accepted, (e, out)
            s = out.state
        return s

    l0 = lambda epoch, n: f"l0/000/{epoch:018d}/{n:019d}-aaaa.l0"  # noqa: E731
    busy = [
        Init(2),
        Claim(1, "writer", AccessMode.SHARED, 90_000, 1_000),
        Placeholder(2, l0(2, 1), 8, 100, 5, 11, 1, "p-1", 0, 21),
        Placeholder(3, l0(3, 2), 8, 50, 2, 12, 1, "p-1", 5, 22),
        Placeholder(3, l0(3, 3), 8, 70, 3, 13, 1),
        Claim(2, "rec", AccessMode.EXCLUSIVE, 95_000, 2_000, (("writer", 1),)),
        Reconcile(3, 6, (layout.l1_key("t", 0, 0, 6, TOPIC_ID),), 2, 2, (77,)),
        Placeholder(4, l0(4, 4), 8, 10, 1, 14),
    ]
    return {
        "empty": sm.PartitionState("t", 0),
        "init": fold(None, [Init(5)]),
        "busy": fold(TOPIC_ID, busy),
        "sealed": fold(TOPIC_ID, [Init(5), Seal(1_700_000_000_000)]),
    }


def _golden(name: str) -> dict[str, bytes]:
    return {d["name"]: d["bytes"].encode() for d in map(json.loads, (GOLDEN / name).read_text().splitlines())}


@pytest.mark.parametrize("name", sorted(golden_entries()))
def test_entries_read_and_write_the_bytes_of_the_earlier_encoder(name):
    entry, data = golden_entries()[name], _golden("entries.jsonl")[name]
    assert en.decode(data, f"logs/t/000000/{name}.json") == entry
    assert en.encode(entry) == data


@pytest.mark.parametrize("name", sorted(golden_states()))
def test_snapshots_read_and_write_the_bytes_of_the_earlier_encoder(name):
    state, data = golden_states()[name], _golden("snapshots.jsonl")[name]
    assert snapshot.encode_snapshot(state) == data
    assert snapshot.decode_snapshot(data, f"snapshots/t/{name}.json") == snapshot.recover(state)


def test_every_golden_line_is_checked():
    """A line nobody decodes would be a format nobody tests."""
    assert set(_golden("entries.jsonl")) == set(golden_entries())
    assert set(_golden("snapshots.jsonl")) == set(golden_states())


def _reseal(data: bytes, change) -> bytes:
    from ctp_state import codec

    body = codec.unseal(data, "k")
    change(body)
    return codec.seal(body)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: b["holders"][0].append({"forged": True}), "Expected `array` of at most length 5"),
        (lambda b: b["pending"][0].append(-5), "Expected `array` of at most length 8"),
        (lambda b: b["producers"][0][3][0].append("x"), "Expected `array` of at most length 4"),
        (lambda b: b["producers"][0].append([1, 2, 3]), "Expected `array` of at most length 4"),
        (lambda b: b.update(topic_id=b["topic_id"] + "\n"), "topic_id"),
    ],
)
def test_a_snapshot_row_with_an_item_too_many_or_an_odd_topic_id_is_refused(change, match):
    """Found by an attack review of the msgspec codec: positional rows took extra items
    and dropped them, and a trailing newline passed the topic id's pattern."""
    data = _reseal(_golden("snapshots.jsonl")["busy"], change)
    with pytest.raises(CorruptData, match=match):
        snapshot.decode_snapshot(data, "snapshots/t/busy.json")


def test_an_entry_with_a_lone_surrogate_where_a_number_belongs_is_corrupt_data():
    """Not a UnicodeEncodeError from deep inside msgspec: callers catch CorruptData (the
    parser refuses the lone surrogate; the conversion into the entry's type, behind it,
    would too: "not valid Unicode")."""
    from ctp_state import codec

    data = codec.seal({"at_ms": "\ud800", "kind": "seal", "v": 2})
    with pytest.raises(CorruptData, match="not valid JSON .*surrogate"):
        en.decode(data, "logs/t/000000/5.json")


def test_an_entry_with_a_number_past_pythons_digit_limit_is_corrupt_data():
    """Not the ValueError json.loads raises past 4,300 digits: callers catch CorruptData."""
    data = _seal_bytes(b'{"at_ms":' + b"9" * 5000 + b',"kind":"seal","v":2}')
    with pytest.raises(CorruptData, match="not valid JSON"):
        en.decode(data, "logs/t/000000/5.json")


def test_a_record_nested_past_the_parsers_depth_is_corrupt_data():
    """Not the RecursionError json.loads and msgspec raise: callers catch CorruptData."""
    deep = b"[" * 100_000 + b"]" * 100_000
    entry = _seal_bytes(b'{"at_ms":1,"kind":"seal","v":2,"zz":' + deep + b"}")
    with pytest.raises(CorruptData, match="not valid JSON"):
        en.decode(entry, "logs/t/000000/5.json")
    with pytest.raises(CorruptData, match="not valid JSON"):
        snapshot.decode_snapshot(_seal_bytes(_json_of("busy")[:-1] + b',"zz":' + deep + b"}"), "snapshots/t/busy.json")


def _seal_bytes(raw: bytes) -> bytes:
    """A sealed record of exactly these JSON bytes (``codec.seal`` would re-encode them)."""
    from ctp_state import codec

    return raw[:-1] + b',"crc":"%08x"}' % codec.crc32c(raw)


def _json_of(name: str) -> bytes:
    from ctp_state import codec

    return codec.checked(_golden("snapshots.jsonl")[name], "k")


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw.replace(b'"topic":"t"', b'"topic":"t\xff"'),  # not UTF-8, in a field
        lambda raw: raw.replace(b'["p-1",', b'["p-1\xff",'),  # in a producer id
        lambda raw: raw[:-1] + b',"zz":"\xff"}',  # in a member this ctp does not know
        lambda raw: raw.replace(b'"topic_id"', b'"\xffopic_id"'),  # a field's name
        lambda raw: raw.replace(b'"v":2', b'"v":2,"\xff":1'),  # a member's name
        lambda raw: raw.replace(b'"partition":0', b'"partition":' + b"9" * 5000),  # past Python's digit limit
    ],
    ids=["field", "producer-id", "unknown-member", "field-name", "member-name", "huge-number"],
)
def test_a_snapshot_with_bytes_that_are_not_utf8_or_a_huge_number_is_corrupt_data(damage):
    """Found by an attack review of the one-pass snapshot decoder: msgspec raised
    UnicodeDecodeError (which stops read_state) for bad UTF-8 in a field, and skipped an
    unknown member or a damaged field name without checking it (a sealed snapshot then
    read as not sealed). A snapshot whose JSON is not UTF-8 is set aside, as before."""
    raw = _json_of("busy")
    assert damage(raw) != raw
    data = _seal_bytes(damage(raw))
    with pytest.raises(CorruptData):
        snapshot.decode_snapshot(data, "snapshots/t/busy.json")


def test_a_sealed_snapshot_whose_sealed_flag_name_is_damaged_is_corrupt_data_not_unsealed():
    raw = _json_of("sealed")
    assert b'"sealed":true' in raw
    data = _seal_bytes(raw.replace(b'"sealed"', b'"se\xffled"'))
    with pytest.raises(CorruptData):
        snapshot.decode_snapshot(data, "snapshots/t/sealed.json")


def test_a_snapshot_with_a_lone_surrogate_escaped_in_a_name_or_a_mode_is_corrupt_data():
    from ctp_state import codec

    body = codec.unseal(_golden("snapshots.jsonl")["busy"], "k")
    for changed in ({**body, "x\ud800": 1}, {**body, "holders": [["rec", "\ud800", 2, 95000, 93000]]}):
        with pytest.raises(CorruptData):
            snapshot.decode_snapshot(codec.seal(changed), "snapshots/t/busy.json")


def write_golden() -> None:  # pragma: no cover - run by hand when a format version changes
    for name, values, enc in (
        ("entries.jsonl", golden_entries(), en.encode),
        ("snapshots.jsonl", golden_states(), snapshot.encode_snapshot),
    ):
        lines = [json.dumps({"name": k, "bytes": enc(v).decode()}) for k, v in values.items()]
        (GOLDEN / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":  # pragma: no cover
    write_golden()
