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
import re
import time
from collections.abc import Callable
from typing import Any

from ctp_state import codec
from ctp_state.errors import ContentionTimeout, CorruptData, KeyExists, ObjectNotFound, StoreError
from ctp_state.storage import ObjectStore

log = logging.getLogger(__name__)
_NAME = re.compile(r"(\d{20})\.json")


class CreateOutcomeUnknown(StoreError):
    """A create-if-absent was sent but whether it landed could not be learned."""

    def __init__(self, key: str, cause: str):
        self.key, self.cause = key, cause
        super().__init__(f"the outcome of creating {key!r} is unknown: {cause}")


def create_once(store: ObjectStore, key: str, data: bytes, *, attempts: int = 6, backoff_s: float = 0.1,
                sleep: Callable[[float], None] = time.sleep) -> bool:
    """Create ``key`` holding ``data``. True when the key holds these bytes afterwards
    (including a create whose response was lost and that was sent again), False when
    it holds another writer's bytes. Raises :class:`CreateOutcomeUnknown` when the store
    keeps failing, so the caller can report "unknown", never "failed"."""
    cause = ""
    for attempt in range(attempts):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        try:
            store.put_if_absent(key, data)
            return True
        except KeyExists:
            try:
                return store.get(key) == data
            except ObjectNotFound:  # a conflicting create was in flight and did not land
                continue
            except (StoreError, OSError) as e:
                cause = str(e)
        except (StoreError, OSError) as e:
            cause = str(e)
        log.warning("creating %s: %s; sending the same bytes again", key, cause)
    raise CreateOutcomeUnknown(key, cause or "the store kept failing")


class DenseSequence:
    def __init__(self, store: ObjectStore, prefix: str, what: str, *, legacy_version: int | None = None,
                 check: Callable[[dict[str, Any], str], dict[str, Any]] = lambda rec, key: rec):
        """``legacy_version``: records of this version written before records were
        sealed are still read (unchecked); any other unsealed record is refused.
        ``check(record, key)`` validates a decoded record (raising CorruptData)."""
        if not prefix.endswith("/"):
            raise ValueError("a sequence prefix ends with '/'")
        self.store, self.prefix, self.what, self.legacy_version = store, prefix, what, legacy_version
        self.check = check
        self.hint_key = prefix + "hint"

    def key(self, seq: int) -> str:
        return f"{self.prefix}{seq:020d}.json"

    def decode(self, data: bytes, key: str) -> dict[str, Any]:
        if codec.is_sealed(data):
            return codec.unseal(data, key, self.what)
        rec = codec.loads(data, key, self.what)
        if self.legacy_version is None or rec.get("v") != self.legacy_version:
            raise CorruptData(key, f"{self.what} has no checksum (it is truncated, or was edited)")
        return rec

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
            m = _NAME.fullmatch(info.key[len(self.prefix):])
            if m:
                last = max(last, int(m.group(1)))
        return last

    def get(self, seq: int) -> dict[str, Any]:
        key = self.key(seq)
        return self.check(self.decode(self.store.get(key), key), key)

    def tail(self, n: int, last: int | None = None, *,
             unreadable: list[tuple[int, str]] | None = None) -> list[dict[str, Any]]:
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

    def newest(self) -> dict[str, Any] | None:
        records = self.tail(1)
        return records[-1] if records else None

    def append(self, make: Callable[[int], dict[str, Any]], *, attempts: int = 32) -> dict[str, Any]:
        """Write ``make(seq)`` sealed at the next free seq; ``make`` is called again with
        the new seq after a lost race, so a record can reflect the ones before it."""
        seq = self.last() + 1
        for _ in range(attempts):
            rec = {**make(seq), "seq": seq}
            if create_once(self.store, self.key(seq), codec.seal(rec)):
                try:
                    self.store.put(self.hint_key, str(seq).encode())
                except (StoreError, OSError) as e:  # a hint: the next reader lists a little more
                    log.warning("could not update %s: %s", self.hint_key, e)
                return rec
            seq = self.last() + 1
        raise ContentionTimeout(f"appending to {self.prefix}", attempts)
