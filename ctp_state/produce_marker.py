"""The completion marker of ``ctp produce``: a producer id finished an input.

``produce/<producer id>.json`` (a sealed :class:`~ctp_state.records.ProduceMarker`)
names the input's digest, its record count and the incarnation of each topic it was
written into. A re-run of the same input into the same incarnations then writes nothing
at all. It is only a shortcut: the partitions' logs know which of the producer id's
records they hold either way, so a marker that is missing, damaged, of another input
or of topics since deleted and created again is ignored (and replaced when the run
completes).
"""

from __future__ import annotations

import logging
import time

from ctp_state import codec, layout, records
from ctp_state.errors import CorruptData, CtpError, KeyExists, ObjectNotFound
from ctp_state.records import ProduceMarker
from ctp_state.storage import ObjectStore

log = logging.getLogger(__name__)


def completed_before(
    store: ObjectStore, producer_id: str, digest: str, count: int, incarnations: dict[str, str | None]
) -> ProduceMarker | None:
    """The marker of an earlier run that completed this very input (``digest``,
    ``count`` records) into these topic ``incarnations`` (name -> id); None otherwise."""
    key = layout.produce_marker(producer_id)
    try:
        done = _read(store, key)
    except ObjectNotFound:
        return None
    except CorruptData as e:  # only a shortcut: the partitions still know what they hold
        log.warning("ignoring %s", e)
        return None
    if done.digest != digest or done.records != count:
        log.warning("ignoring %s: it records another input", key)
        return None
    if (why := other_incarnation(done, incarnations)) is not None:
        log.warning("ignoring %s: %s", key, why)
        return None
    return done


def mark_complete(
    store: ObjectStore,
    producer_id: str,
    digest: str,
    count: int,
    partitions: dict[str, int],
    incarnations: dict[str, str | None],
) -> None:
    """Record that ``producer_id`` completed this input. Best effort (a later run reads
    the logs without it); a concurrent run's marker of the same input is left as it is."""
    key = layout.produce_marker(producer_id)
    body = codec.seal(
        records.encode(
            ProduceMarker(
                producer_id=producer_id,
                digest=digest,
                records=count,
                completed_ms=int(time.time() * 1000),
                partitions=partitions,
                topics=incarnations,
            )
        )
    )
    try:
        try:
            store.put_if_absent(key, body)
        except KeyExists:
            # A concurrent run of the same input finished first, or the marker is of
            # topics since deleted: then this one replaces it (it is only a shortcut).
            there = _read(store, key)
            if there.digest != digest or other_incarnation(there, incarnations) is not None:
                store.put(key, body)
    except CtpError:
        pass  # only a shortcut for later runs: every record is in either way


def _read(store: ObjectStore, key: str) -> ProduceMarker:
    return records.decode(ProduceMarker, codec.unseal(store.get(key), key, ProduceMarker.WHAT), key)


def other_incarnation(marker: ProduceMarker, incarnations: dict[str, str | None]) -> str | None:
    """Why a completion marker is about other incarnations of the topics than
    ``incarnations`` (name -> id), or None when it is about these. A marker written
    before incarnation ids (version 1) can only be about topics created before them."""
    recorded = marker.topics if marker.topics is not None else dict.fromkeys(incarnations)
    for t, tid in incarnations.items():
        if t not in recorded:
            return f"it does not name topic {t}"
        if recorded[t] != tid:
            return (
                f"topic {t} was deleted and created again since it was written "
                f"(incarnation {recorded[t] or 'legacy'} then, {tid or 'legacy'} now)"
            )
    return None
