"""A dense, append-only sequence of sealed records in the store: the one primitive
behind the GC history and the reconcile run summaries.

::

    <prefix><seq:020d>.json     one record per seq, created if absent, dense from 0
    <prefix>hint                the newest seq an appender saw (a hint, may lag)

Two appenders can never both own a seq (create-if-absent), so the order of records is
decided by the store, never by a writer's clock: "the newest record" is the highest
seq. Readers find it from the hint and one LIST after it. A create whose response was
lost is retried with the same bytes; finding exactly those bytes at the seq means it
landed (see :func:`create_once`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic

import msgspec

from ctp_state import codec, layout, records
from ctp_state.errors import ContentionTimeout, CorruptData, KeyExists, ObjectNotFound, StoreError
from ctp_state.records import R
from ctp_state.storage import ObjectStore

log = logging.getLogger(__name__)


class CreateOutcomeUnknown(StoreError):
    """A create-if-absent was sent but whether it landed could not be learned."""

    def __init__(self, key: str, cause: str):
        self.key, self.cause = key, cause
        super().__init__(f"the outcome of creating {key!r} is unknown: {cause}")


def create_once(
    store: ObjectStore,
    key: str,
    data: bytes,
    *,
    attempts: int = 6,
    backoff_s: float = 0.1,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Create ``key`` holding ``data``. True when the key holds these bytes afterwards
    (including a create whose response was lost and that was sent again), False when
    it holds another writer's bytes. Raises :class:`CreateOutcomeUnknown` when the store
    keeps failing, so the caller can report "unknown", never "failed"."""
    return (
        create_sent(store, key, lambda _attempt: data, attempts=attempts, backoff_s=backoff_s, sleep=sleep) is not None
    )


def create_sent(
    store: ObjectStore,
    key: str,
    sends: Callable[[int], bytes],
    *,
    attempts: int = 6,
    backoff_s: float = 0.1,
    sleep: Callable[[float], None] = time.sleep,
    before_resend: Callable[[], str | None] | None = None,
) -> bytes | None:
    """:func:`create_once`, sending ``sends(attempt)`` at each attempt: the bytes now at
    ``key`` when they are any of ours, None when they are another writer's.

    A state-log entry is sent again as *other* bytes that mean the same (its re-send
    number): a first send that landed, was read into a stored state and then lost by the
    store is never put back byte for byte by a re-send -- one that may land after the
    log before it changed, so the stored state would vouch for a log it is not the fold
    of (docs/design.md section 14). ``before_resend()`` runs before each send after the
    first: a reason not to send again (the outcome is unknown then), or None."""
    cause, sent = "", []
    for attempt in range(attempts):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
            if before_resend is not None:
                try:
                    stop = before_resend()
                except (StoreError, OSError) as e:
                    cause = str(e)
                    continue
                if stop is not None:
                    raise CreateOutcomeUnknown(key, f"{cause}; {stop}" if cause else stop)
        data = sends(attempt)
        sent.append(data)
        try:
            store.put_if_absent_once(key, data)
            return data
        except KeyExists:
            try:
                there = store.get(key)
            except ObjectNotFound:  # a conflicting create was in flight and did not land
                continue
            except (StoreError, OSError) as e:
                cause = str(e)
            else:
                return there if there in sent else None
        except (StoreError, OSError) as e:
            cause = str(e)
        log.warning("creating %s: %s; sending it again", key, cause)
    raise CreateOutcomeUnknown(key, cause or "the store kept failing")


def create_next(
    store: ObjectStore,
    first: int,
    make: Callable[[int], tuple[str, bytes]],
    *,
    after_loss: Callable[[int], int],
    what: str,
    attempts: int,
    create: Callable[[int, str, bytes], bool] | None = None,
) -> int:
    """The one create-if-absent loop behind every dense sequence ctp keeps (state-log
    entries, cluster-epoch markers, GC history records, reconcile summaries).

    Creates ``make(n)`` (a key and its bytes) at ``n = first``; when another writer
    owns ``n``, asks ``after_loss(n)`` for the next number to try (re-reading whatever
    the caller needs) and builds the record again. Returns the number this writer now
    owns. A create whose response was lost is settled by :func:`create_once` (the same
    bytes found at the key are ours); ``create(n, key, data)`` replaces it where the
    caller turns an unknown outcome into its own error. Raises :class:`ContentionTimeout` after
    ``attempts`` lost races: one exhaustion error for every sequence.
    """
    create = create or (lambda _n, key, data: create_once(store, key, data))
    n = first
    for _ in range(attempts):
        key, data = make(n)
        if create(n, key, data):
            return n
        n = after_loss(n)
    raise ContentionTimeout(what, attempts)


class DenseSequence(Generic[R]):
    """Typed records (:mod:`ctp_state.records`) sealed at ``<prefix><seq:020d>.json``."""

    def __init__(self, store: ObjectStore, prefix: str, kind: type[R], *, legacy_version: int | None = None):
        """``legacy_version``: records of this version written before records were
        sealed are still read (and upcast); any other unsealed record is refused."""
        if not prefix.endswith("/"):
            raise ValueError("a sequence prefix ends with '/'")
        self.store, self.prefix, self.kind, self.legacy_version = store, prefix, kind, legacy_version
        self.what = kind.WHAT
        self.hint_key = prefix + "hint"

    def key(self, seq: int) -> str:
        return layout.sequence_key(self.prefix, seq)

    def decode(self, data: bytes, key: str) -> R:
        raw = codec.checked_if_sealed(data, key, self.what)
        if raw is not None:
            current = records.decode_current(self.kind, raw)
            if current is not None:
                return current
            body = codec.loads(raw, key, self.what)
        else:
            body = codec.loads(data, key, self.what)
            if self.legacy_version is None or body.get("v") != self.legacy_version:
                raise CorruptData(key, f"{self.what} has no checksum (it is truncated, or was edited)")
        return records.decode(self.kind, body, key)

    def last(self) -> int:
        """The newest seq, -1 when empty: the hint, then a LIST after it."""
        try:
            hint = int(self.store.get(self.hint_key).decode())
        except (ObjectNotFound, ValueError, UnicodeDecodeError):
            hint = -1
        if hint >= 0 and self.store.head(self.key(hint)) is None:
            hint = -1  # a hint no record vouches for is not believed
        last = hint
        for info in self.store.list(self.prefix, start_after=self.key(hint) if hint >= 0 else None):
            seq = layout.parse_sequence_name(info.key[len(self.prefix) :])
            if seq is not None:
                last = max(last, seq)
        return last

    def get(self, seq: int) -> R:
        key = self.key(seq)
        return self.decode(self.store.get(key), key)

    def tail(self, n: int, last: int | None = None, *, unreadable: list[tuple[int, str]] | None = None) -> list[R]:
        """The newest ``n`` records, oldest first (a seq lost to a crashed appender is
        skipped; it is never reused). With ``unreadable``, a record that does not read
        is skipped and reported there as ``(seq, why)`` instead of raising."""
        last = self.last() if last is None else last
        out = []
        for seq in range(max(0, last - n + 1), last + 1):
            try:
                out.append(self.get(seq))
            except ObjectNotFound:
                continue
            except CorruptData as e:
                if unreadable is None:
                    raise
                unreadable.append((seq, str(e)))
        return out

    def newest(self) -> R | None:
        records = self.tail(1)
        return records[-1] if records else None

    def append(self, make: Callable[[int], R], *, attempts: int = 32) -> R:
        """Write ``make(seq)`` sealed at the next free seq; ``make`` is called again with
        the new seq after a lost race, so a record can reflect the ones before it.
        Returns the record as stored (its ``seq`` and ``v`` set)."""
        made: dict[int, R] = {}

        def build(seq: int) -> tuple[str, bytes]:
            made[seq] = msgspec.structs.replace(make(seq), seq=seq, v=self.kind.VERSION)
            return self.key(seq), codec.seal(records.encode(made[seq]))

        seq = create_next(
            self.store,
            self.last() + 1,
            build,
            after_loss=lambda _n: self.last() + 1,
            what=f"appending to {self.prefix}",
            attempts=attempts,
        )
        try:
            self.store.put(self.hint_key, str(seq).encode())
        except (StoreError, OSError) as e:  # a hint: the next reader lists a little more
            log.warning("could not update %s: %s", self.hint_key, e)
        return made[seq]
