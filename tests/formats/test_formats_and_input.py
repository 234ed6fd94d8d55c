"""Bad input: every case is a one-line error naming what and where, and writes nothing."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from ctp_state import codec, entries as en, l0, validate
from ctp_state.entries import Init, Placeholder
from ctp_state.errors import (
    CorruptData,
    InvalidEpoch,
    InvalidRecord,
    InvalidTopicName,
    UnsupportedVersion,
)
from ctp_state.jsonl import read_records
from ctp_state.topics import create_topic
from tests.support import plog, space

# --- L0 -----------------------------------------------------------------------------------


def sample_object() -> tuple[bytes, list[l0.ChunkRef]]:
    a = [l0.Record(b"v1", b"k1", 1, (("h", b"\x00\xff"),)), l0.Record(b"", None, 2)]
    b = [l0.Record(bytes(range(256)), b"k", 3)]
    return l0.build_object(7, [("t", 0, a), ("u", 3, b)])


def test_l0_roundtrip_is_byte_identical():
    data, refs = sample_object()
    epoch, index = l0.read_index(data, "k")
    assert epoch == 7 and index == refs
    ref = refs[0]
    chunk = data[ref.byte_offset : ref.byte_offset + ref.byte_length]
    got = l0.records_of(l0.decode_chunk(chunk, "k", expected_crc=ref.crc32c, expected_records=2))
    assert got == [l0.Record(b"v1", b"k1", 1, (("h", b"\x00\xff"),)), l0.Record(b"", None, 2)]


def test_l0_corrupt_chunk_fails_its_crc():
    data, refs = sample_object()
    ref = refs[1]
    chunk = bytearray(data[ref.byte_offset : ref.byte_offset + ref.byte_length])
    chunk[len(chunk) // 2] ^= 0x01
    with pytest.raises(CorruptData) as e:
        l0.decode_chunk(bytes(chunk), "l0/001/x.l0", expected_crc=ref.crc32c, expected_records=1)
    assert "CRC32C mismatch" in str(e.value) and "l0/001/x.l0" in str(e.value)
    assert "\n" not in str(e.value)


def test_l0_record_count_mismatch_is_corrupt():
    data, refs = sample_object()
    ref = refs[1]
    chunk = data[ref.byte_offset : ref.byte_offset + ref.byte_length]
    with pytest.raises(CorruptData, match="holds 1 records"):
        l0.decode_chunk(chunk, "k", expected_crc=ref.crc32c, expected_records=5)


@pytest.mark.parametrize("cut", [1, 10, 17, 100])
def test_l0_truncated_object_is_refused(cut):
    data, _ = sample_object()
    with pytest.raises(CorruptData) as e:
        l0.read_index(data[:-cut], "l0/000/trunc.l0")
    assert "l0/000/trunc.l0" in str(e.value)


@pytest.mark.parametrize("chunks", [2, 5000])  # a footer within FOOTER_READ, and one past it
def test_an_l0_footer_reads_from_the_objects_end_alone(store, chunks):
    """The reconciler's quiet path reads only an L0 object's footer (a ranged GET of its
    end; a second for a footer longer than ``FOOTER_READ``): the same index as the whole
    object's, on both stores; a damaged footer is refused, naming the key."""
    from ctp_state.reconcile_quiet import read_footer

    data, refs = l0.build_object(7, [("t", p, [l0.Record(b"v%d" % p)]) for p in range(chunks)])
    assert (len(data) - refs[-1].byte_offset > l0.FOOTER_READ) == (chunks > 2)
    store.put("l0/000/000000000000000007/x.l0", data)
    assert read_footer(store, "l0/000/000000000000000007/x.l0") == l0.read_index(data, "k")[1]
    bad = data[:-40] + bytes([data[-40] ^ 1]) + data[-39:]
    store.put("l0/000/000000000000000007/y.l0", bad)
    with pytest.raises(CorruptData, match="y.l0"):
        read_footer(store, "l0/000/000000000000000007/y.l0")


def test_an_l0_footer_length_past_the_limit_is_refused_before_it_is_read():
    """A forged trailer in a large object (its footer length up to 4 GiB, within the
    object) would make a footer reader fetch that much: refused from the trailer alone."""
    trailer = l0.TRAILER.pack(l0.MAX_FOOTER_BYTES + 1, 0, l0.FORMAT_VERSION, l0.TRAILER_MAGIC)
    with pytest.raises(CorruptData, match="l0/000/big.l0.*exceeds"):
        l0.footer_tail_length(trailer, 1 << 31, "l0/000/big.l0")
    assert l0.footer_tail_length(l0.TRAILER.pack(100, 0, 1, l0.TRAILER_MAGIC), 1 << 31, "k") == 100 + l0.TRAILER.size


def test_l0_unknown_format_version_is_refused():
    data, _ = sample_object()
    bumped = data[:5] + bytes([9]) + data[6:]
    with pytest.raises(UnsupportedVersion, match="L0 format version 9"):
        l0.read_index(bumped, "k")


# --- entries --------------------------------------------------------------------------------


def test_entry_codec_roundtrip():
    for e in (
        Init(3),
        Placeholder(4, "l0/000/x.l0", 8, 100, 5, 123, None),
        Placeholder(4, "k", 8, 1, 1, 0, 2),
        Placeholder(4, "k", 8, 1, 1, 0, None, "producer-1", 17, 0xFFFFFFFF),
    ):
        data = en.encode(e)
        assert en.decode(data, "k") == e
        assert data.endswith(b'"}') and b'"crc":"' in data  # sealed


def test_each_entry_kind_decodes_into_its_own_type_whose_tag_is_that_kind():
    """The decoder converts an entry into the type its ``kind`` names (not the union:
    msgspec builds a union's decoder on every call), so each type's tag must be its kind,
    and a body of one kind with another kind's fields is refused."""
    for kind, cls in en._KINDS.items():
        assert cls.__struct_config__.tag == kind == cls.kind
    tick = en.Tick(5, 2, "reconciler:1")
    assert en.decode(en.encode(tick), "k") == tick
    claim_fields = codec.seal(
        {"kind": "tick", "v": 5, "owner": "r", "epoch": 5, "writer_epoch": 2, "lease_until_ms": 9}
    )
    with pytest.raises(CorruptData, match="unknown field `lease_until_ms`"):
        en.decode(claim_fields, "k")


def test_version_1_entries_written_before_checksums_still_read():
    assert en.decode(b'{"epoch":3,"kind":"init","v":1}', "k") == Init(3)


def test_an_entry_whose_bytes_changed_fails_its_checksum_naming_the_key():
    data = en.encode(Placeholder(4, "l0/000/x.l0", 8, 100, 5, 123))
    with pytest.raises(CorruptData, match="fails its CRC32C check") as e:
        en.decode(data.replace(b'"epoch":4', b'"epoch":3'), "logs/t/000000/00000000000000000007.json")
    assert "logs/t/000000/00000000000000000007.json" in str(e.value)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"{not json", "not valid JSON"),
        (b"[1,2]", "not a JSON object"),
        (b'{"v":1,"kind":"init"}', "missing required field `epoch`"),
        (b'{"v":1,"kind":"init","epoch":0}', r"Expected `int` >= 1 - at `\$.epoch`"),
        (b'{"v":1,"kind":"init","epoch":-3}', r"Expected `int` >= 1 - at `\$.epoch`"),
        (b'{"v":1,"kind":"init","epoch":9223372036854775808}', r"Expected `int` <= 999999999999999999 - at `\$.epoch`"),
        (b'{"v":1,"kind":"init","epoch":"7"}', "Expected `int`, got `str`"),
        (b'{"v":1,"kind":"bogus"}', "unknown entry kind"),
        (b'{"v":1,"kind":"init","epoch":1,"extra":2}', "unknown field `extra`"),
        (b'{"v":7,"kind":"init","epoch":1}', "entry version 7 is not supported"),
        (b'{"v":6,"kind":"init","epoch":1,"prev":5}', "version 6 entry has no checksum"),
        (b'{"v":2,"kind":"init","epoch":1}', "version 2 entry has no checksum"),
        (b'{"v":3,"kind":"advance","epoch":1,"writer_epoch":1,"release_owner":"r"}', "version 3 entry has no checksum"),
        (b'{"v":1,"kind":"init","epoch":1,"crc":"00000000"}', "fails its CRC32C check"),
        (b'{"v":1,"kind":"init","epoch":1000000000000000000}', r"Expected `int` <= 999999999999999999"),
        (b'{"kind":"init","epoch":1}', "entry version None is not supported"),
    ],
)
def test_malformed_or_unknown_version_entries_are_refused_naming_the_key(raw, match):
    with pytest.raises(CorruptData, match=match) as e:
        en.decode(raw, "logs/t/000000/00000000000000000003.json")
    assert "logs/t/000000/00000000000000000003.json" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_releasing_entry_is_version_3_and_reads_back_and_its_field_is_checked():
    """A reconcile or advance that also releases its claim is written as version 3
    (a ctp that predates it refuses it by version); every other entry stays version 2.
    Version 3 without ``release_owner``, ``release_owner`` on a version 2 entry or on
    another kind, and an empty owner are refused, naming the key."""
    key = "logs/t/000000/00000000000000000003.json"
    rec = en.Reconcile(4, 9, ("l1/t/000000/00000000000000000000-00000000000000000009.parquet",), 2, 1, (5,), "r:1")
    adv = en.Advance(3, 1, "r:1")
    for entry in (rec, adv):
        data = en.encode(entry)
        assert codec.unseal(data, key, "entry")["v"] == 3
        assert en.decode(data, key) == entry
    plain = en.Advance(3, 1)
    assert codec.unseal(en.encode(plain), key, "entry")["v"] == 2 and en.decode(en.encode(plain), key) == plain
    for body, match in [
        ({"v": 3, "kind": "advance", "epoch": 3, "writer_epoch": 1}, "releases no claim"),
        ({"v": 3, "kind": "init", "epoch": 3}, "releases no claim"),
        ({"v": 3, "kind": "seal", "at_ms": 1}, "releases no claim"),
        ({"v": 3, "kind": "advance", "epoch": 3, "writer_epoch": 1, "release_owner": None}, "releases no claim"),
        ({"v": 2, "kind": "advance", "epoch": 3, "writer_epoch": 1, "release_owner": "r"}, "unknown fields"),
        ({"v": 3, "kind": "claim", "writer_epoch": 1, "owner": "r", "mode": "exclusive", "lease_until_ms": 1,
          "now_ms": 0, "release_owner": "r"}, "unknown fields"),
        ({"v": 3, "kind": "advance", "epoch": 3, "writer_epoch": 1, "release_owner": ""}, "length >= 1"),
        ({"v": 3, "kind": "advance", "epoch": 3, "writer_epoch": 1, "release_owner": 7}, "got `int` - at `\\$.release_owner`"),
    ]:  # fmt: skip
        with pytest.raises(CorruptData, match=match) as e:
            en.decode(codec.seal(body), key)
        assert key in str(e.value)


def test_reading_a_log_with_an_unknown_version_entry_stops_at_that_key(store):
    create_topic(store, "t", 1)
    store.put_if_absent(f"logs/{space(store)}/000000/00000000000000000001.json", b'{"v":99,"kind":"init","epoch":1}')
    with pytest.raises(UnsupportedVersion) as e:
        plog(store, "t", 0).read_state()
    assert "00000000000000000001.json" in str(e.value)


# --- names and numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", ".", "..", "../etc", "a/b", "a b", "ü", "x" * 250, "a\x00", "..\\x"])
def test_invalid_topic_names(bad):
    with pytest.raises(InvalidTopicName):
        validate.topic_name(bad)


def test_invalid_topic_name_writes_nothing(store):
    with pytest.raises(InvalidTopicName):
        create_topic(store, "../../escape", 1)
    assert list(store.list()) == []


@pytest.mark.parametrize("ok", ["a", "A.b_c-9", "x" * 249, "..."])
def test_valid_topic_names(ok):
    assert validate.topic_name(ok) == ok


@pytest.mark.parametrize("bad", [0, -1, 2**63, "3", 1.5, True, None])
def test_invalid_epochs(bad):
    with pytest.raises(InvalidEpoch):
        validate.epoch(bad)


# --- JSON-lines producer input ------------------------------------------------------------------


def parse(text: str):
    return list(read_records(io.StringIO(text), "in.jsonl"))


def test_jsonl_parses_text_base64_and_headers():
    lines = [
        {"topic": "t", "partition": 1, "key": "k", "value": "héllo", "headers": {"a": "b"}, "timestamp": 5},
        {"topic": "t", "partition": 0, "value_b64": "AAH/", "headers": [["x", "y"]]},
    ]
    (t1, p1, r1), (t2, p2, r2) = parse("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert (t1, p1, r1.key, r1.value, r1.headers, r1.timestamp_ms) == (
        "t",
        1,
        b"k",
        "héllo".encode(),
        (("a", b"b"),),
        5,
    )
    assert (t2, p2, r2.value, r2.key) == ("t", 0, b"\x00\x01\xff", None)


@pytest.mark.parametrize(
    "line, match",
    [
        ("{oops", "in.jsonl:2: not valid JSON"),
        ('{"topic":"t","partition":0}', "in.jsonl:2: missing 'value'"),
        ('{"topic":"../x","partition":0,"value":"v"}', "in.jsonl:2: invalid topic name"),
        ('{"topic":"t","partition":-1,"value":"v"}', "'partition' must be a non-negative integer"),
        ('{"topic":"t","partition":0,"value_b64":"!!"}', "not valid base64"),
        ('{"topic":"t","partition":0,"value":"v","value_b64":"AA=="}', "not both"),
        ('{"topic":"t","partition":0,"value":"v","colour":1}', "unknown fields"),
        (
            '{"topic":"t","partition":0,"value":"v","timestamp":-5}',
            r"'timestamp' \(ms since 1970, up to year 9999\) must be in",
        ),
    ],
)
def test_jsonl_errors_name_the_line(line, match):
    good = json.dumps({"topic": "t", "partition": 0, "value": "ok"})
    with pytest.raises(InvalidRecord, match=match) as e:
        parse(good + "\n" + line + "\n")
    assert "\n" not in str(e.value)


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    value=st.binary(max_size=12) | _TEXT.map(str.encode),
    key=st.none() | st.binary(max_size=6) | _TEXT.map(str.encode),
    headers=st.lists(st.tuples(_TEXT, st.binary(max_size=4) | _TEXT.map(str.encode)), max_size=4),
    ts=st.integers(0, 253402300799999),
    offset=st.none() | st.integers(0, 2**40),
)
def test_what_ctp_read_prints_parses_back_as_the_same_record(value, key, headers, ts, offset):
    from ctp_state.jsonl import format_record, parse_record

    line = json.dumps(format_record("t", 3, offset, ts, key, value, headers), ensure_ascii=False)
    topic, partition, r = parse_record(json.loads(line), "x")
    assert (topic, partition) == ("t", 3)
    assert (r.value, r.key, r.timestamp_ms, r.headers) == (value, key, ts, tuple(headers))


def test_report_directories_are_per_store_and_stable():
    from expectations.job import default_report_dir, report_dir_from_env

    a = default_report_dir("file:///var/lib/ctp", "/home/u")
    assert a.startswith("/home/u/.ctp/reports/ctp-") and a == default_report_dir("file:///var/lib/ctp/", "/home/u")
    others = {default_report_dir(u, "/home/u") for u in ("file:///srv/ctp", "s3://bucket/ctp", "s3://bucket2/ctp")}
    assert len(others | {a}) == 4
    assert default_report_dir("s3://key:secret@b/p", "/h") == default_report_dir("s3://b/p", "/h")
    assert report_dir_from_env({"HOME": "/h", "CTP_REPORT_DIR": "/r"}, "file:///x") == "/r"
    assert report_dir_from_env({"HOME": "/h"}, "file:///x") == default_report_dir("file:///x", "/h")


def test_a_chained_entry_names_the_crc32c_of_the_entry_before_it():
    """Version 6: any kind, with ``prev``; the same entry after another entry is other
    bytes. Refused: no prev, a prev that is no CRC32C, release_owner on a kind that never
    releases."""
    from ctp_state import codec, entries as en
    from ctp_state.errors import CorruptData

    tick = en.Tick(3, 2, "run-1")
    a, b = en.encode(tick, prev=1), en.encode(tick, prev=2)
    assert a != b and en.encode(tick) not in (a, b)
    assert en.decode_chained(a, "k") == (tick, 1) and en.decode_chained(en.encode(tick), "k") == (tick, None)
    assert en.decode(b, "k") == tick
    again = en.encode(tick, prev=1, resend=2)  # a re-send: the same entry, other bytes
    assert again != a and en.decode_chained(again, "k") == (tick, 1)
    rel = en.Advance(3, 2, release_owner="run-1")
    assert en.decode_chained(en.encode(rel, prev=0xFFFFFFFF), "k") == (rel, 0xFFFFFFFF)
    for body, why in (
        ({"v": 6, "kind": "tick", "epoch": 3, "writer_epoch": 2, "owner": "r"}, "no CRC32C of the entry before it"),
        ({"v": 6, "kind": "tick", "epoch": 3, "writer_epoch": 2, "owner": "r", "prev": -1}, "no CRC32C"),
        ({"v": 6, "kind": "tick", "epoch": 3, "writer_epoch": 2, "owner": "r", "prev": "1"}, "no CRC32C"),
        ({"v": 6, "kind": "seal", "at_ms": 1, "release_owner": "r", "prev": 1}, "unknown fields ['release_owner']"),
        ({"v": 6, "kind": "seal", "at_ms": 1, "prev": 1, "resend": 0}, "re-send number that is not one"),
    ):
        with pytest.raises(CorruptData, match=re.escape(why)):
            en.decode(codec.seal(body), "logs/t/000000/3.json")
    with pytest.raises(ValueError):
        en.encode(tick, prev=1 << 32)
