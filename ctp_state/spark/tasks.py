"""What runs inside the Spark tasks of a reconcile: each task is its own entry point. It
opens the store from the URL and the environment of its worker process (there is no
s3a here: object storage is read and written by Python code in the tasks, with ranged
GETs and plain PUTs) and builds its share of the L1 files with
:func:`ctp_state.reconcile.build_one`; results go back to the driver as JSON strings.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from ctp_state.storage import ObjectStore

_STORES: dict[str, ObjectStore] = {}  # a Python worker opens each store once

#: The build job's output: one JSON :class:`~ctp_state.l1.L1Build` per L1 file.
RESULT_SCHEMA = "result string"


def _store(url: str) -> Any:
    """One store client per worker process (boto3 clients are expensive to build)."""
    from ctp_state.storage import open_store

    if url not in _STORES:
        _STORES[url] = open_store(url, os.environ)
    return _STORES[url]


def _build(url: str, compression: str, job: Any) -> Any:
    """Build one planned file: ``(index, L1File)`` of a reconcile (an
    :class:`~ctp_state.l1.L1Build`), or a compaction's
    :class:`~ctp_state.compact.CompactJob` (a :class:`~ctp_state.compact.RunBuild`)."""
    from ctp_state.compact import CompactJob, build_run

    if isinstance(job, CompactJob):
        return build_run(_store(url), job, compression=compression)
    from ctp_state.reconcile import build_one

    index, f = job
    return build_one(_store(url), index, f, compression, os.environ.get("CTP_PROFILE_DIR"))


def _arrow_column(name: str, values: list[str] | list[int]) -> Any:
    """A one-column RecordBatch of strings or int64s built from buffers: ``pa.array`` on
    Python objects imports pandas (~0.3-1 s in every fresh Python worker)."""
    import pyarrow as pa

    n = len(values)
    if values and isinstance(values[0], int):
        arr = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(struct.pack(f"<{n}q", *values))])
    else:
        data = [v.encode() for v in values]  # type: ignore[union-attr]
        offsets = [0]
        for d in data:
            offsets.append(offsets[-1] + len(d))
        arr = pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(struct.pack(f"<{n + 1}i", *offsets)), pa.py_buffer(b"".join(data))]
        )
    return pa.RecordBatch.from_arrays([arr], names=[name])


def _warm(batches: Iterator[Any]) -> Iterator[Any]:
    import ctp_state.l1
    import ctp_state.reconcile  # noqa: F401

    for _ in batches:
        pass
    yield _arrow_column("pid", [os.getpid()])


def _builder(url: str, compression: str, plan: list[bytes] | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function. Each input row is a slot: its number (``id``, an
    index into ``plan``) or, with no ``plan``, its pickled files (``jobs``). For each
    ``(index, L1File)`` of the slot it builds the file (the task opens the store itself
    from ``url`` and its environment); it yields the slot's result dicts as JSON."""

    def build(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if plan is not None:
                slots = [plan[slot] for slot in batch.column("id").to_pylist()]
            else:
                slots = batch.column("jobs").to_pylist()
            for blob in slots:
                # one batch per slot, not per file: each Arrow batch costs the JVM too
                yield _arrow_column(
                    "result",
                    [msgspec.json.encode(_build(url, compression, job)).decode() for job in pickle.loads(blob)],
                )

    return build
