"""The GC's state pack: the partition states a passing run decided on, as one object
the next run starts from instead of reading every partition's log (docs/design.md,
section 14).

::

    gc/packs/<seq:020d>-<run id>.pack   its size (8 bytes, big-endian), then zstd-compressed
                                        lines: a sealed header (with the CRC32C of each
                                        state's last entry, in order), then one sealed
                                        snapshot (ctp_state.snapshot) per partition

A pack is a cache, never a source of truth. It is written by a run whose gate passed,
before its history record, and used only when that record (itself sealed) names it by
key and CRC32C, and the pack's header names the same run and seq: a pack that is
damaged, cut short, another run's or another store's is not used, and the run reads
every partition from its log, as a run without a pack does. Each state in it passed
the snapshot checks on the way in. A state from it is *older* than the log, never
different: lower bounds only grow, and a placeholder accepted after a state carries an
epoch at or above that state's bound (R3, R6), so an M from older states is lower --
the stale-safe M every GC run already relies on. A state is used only while the entry
it ends at is still in the log with the bytes its CRC32C names (one GET): a store that
lost the log's tail, and took a new entry where it was, does not match.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import re

import pyarrow as pa

from ctp_state import codec, layout
from ctp_state.errors import CorruptData
from ctp_state.snapshot import decode_snapshot, encode_snapshot
from ctp_state.state import PartitionState

PACK_VERSION = 2  # 2: the header names the CRC32C of each state's last entry
PACKS = layout.GC_PACKS
_KEY_RE = re.compile(r"([0-9]{20})-([0-9A-Za-z_-]+)\.pack")


def pack_key(seq: int, run_id: str) -> str:
    """Where run ``run_id`` writes its pack when it tries to own record ``seq`` (named by
    the run too, so a run that loses ``seq`` never overwrites the winner's)."""
    return f"{PACKS}{seq:020d}-{run_id}.pack"


def pack_seq(key: str) -> int | None:
    """The seq of a pack's key; None for a key that is not a pack's."""
    m = _KEY_RE.fullmatch(key[len(PACKS) :]) if key.startswith(PACKS) else None
    return int(m.group(1)) if m else None


def encode_pack(seq: int, run_id: str, states: list[PartitionState], last_crcs: list[int | None]) -> bytes:
    """The states as a pack for record ``seq`` of run ``run_id``, each with the CRC32C
    of the stored bytes of the entry it ends at (None: not known; that state is not
    used)."""
    if len(last_crcs) != len(states):
        raise ValueError("one last-entry CRC32C per state")
    head = codec.seal(
        {
            "kind": "gc_pack",
            "v": PACK_VERSION,
            "seq": seq,
            "run_id": run_id,
            "count": len(states),
            "last_crc32c": list(last_crcs),
        }
    )
    raw = b"\n".join([head, *(encode_snapshot(s) for s in states)])
    return len(raw).to_bytes(8, "big") + bytes(pa.compress(raw, codec="zstd", asbytes=True))


def decode_pack(
    data: bytes, key: str, *, seq: int, run_id: str, crc32c: int
) -> list[tuple[PartitionState, int | None]]:
    """The states of the pack at ``key`` that record ``seq`` of run ``run_id`` names
    with ``crc32c``, each with its last entry's CRC32C. Raises :class:`CorruptData`
    naming what does not match."""
    if codec.crc32c(data) != crc32c:
        raise CorruptData(key, "state pack does not match the CRC32C its GC record names")
    size = int.from_bytes(data[:8], "big")
    if len(data) < 8 or size > _MAX_SIZE:
        raise CorruptData(key, f"state pack names a size of {size} bytes")
    try:
        raw = bytes(pa.decompress(data[8:], decompressed_size=size, codec="zstd", asbytes=True))
    except (pa.ArrowException, ValueError) as e:
        raise CorruptData(key, f"state pack does not decompress ({e})") from None
    lines = raw.split(b"\n")
    head = codec.unseal(lines[0], key, "state pack header")
    want = {"kind": "gc_pack", "v": PACK_VERSION, "seq": seq, "run_id": run_id, "count": len(lines) - 1}
    if {k: head.get(k) for k in want} != want:
        raise CorruptData(key, f"state pack header is not the one GC record {seq} ({run_id}) names")
    crcs = head.get("last_crc32c")
    if (
        not isinstance(crcs, list)
        or len(crcs) != len(lines) - 1
        or not all(c is None or (isinstance(c, int) and 0 <= c < 1 << 32) for c in crcs)
    ):
        raise CorruptData(key, "state pack header does not name one last-entry CRC32C per state")
    return [(decode_snapshot(line, key), c) for line, c in zip(lines[1:], crcs)]


#: The largest pack a reader decompresses (its size is stored in front of the frame):
#: about ten million partitions' states.
_MAX_SIZE = 1 << 34
