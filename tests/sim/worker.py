"""One simulation actor as a long-lived process: ``python -m tests.sim.worker URL SEED KIND``.

It reads one JSON command per line on stdin and answers one JSON line on stdout. It
keeps its :class:`~ctp_state.producer.Producer` between commands, so a producer
started with ``KIND=stale`` holds its cluster epoch for an hour, as a producer on a
machine that missed the advances would. The driver starts it in a session of its own:
a SIGKILL of the group, or a crash point (``"crash"`` sets ``CTP_FAULT`` for one
command), takes it down whole, and the driver starts a new one for the next step.

A producer follows the idempotent-producer contract (R8): records whose outcome was
unknown are re-sent, with the same producer id and sequence, before anything new goes
to that partition. A new process is a new producer id, so what a killed process left
unknown stays unknown: at most once.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from typing import Any

from ctp_state.errors import CtpError, GateFailed, TopicNotFound
from ctp_state.storage import open_store
from tests.sim.model import TOPIC, records


def _rows(table: Any) -> list[list[Any]]:
    import pyarrow as pa

    ms = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    out = []
    for row, ts in zip(table.drop_columns(["timestamp"]).to_pylist(), ms):
        out.append(
            [
                row["offset"],
                _b(row["value"]),
                _b(row["key"]),
                ts,
                [[h["key"], _b(h["value"])] for h in row["headers"] or []],
            ]
        )
    return out


def _b(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def _answer(v: Any) -> dict[str, Any]:
    return {
        "outcome": v.outcome,
        "base_offset": v.base_offset,
        "already_written": v.already_written,
        "reason": v.reason,
        "error": None if v.error is None else str(v.error)[:300],
        "incarnation": v.topic_id,  # the topic incarnation the verdict is about
    }


class Worker:
    def __init__(self, url: str, seed: int, kind: str, report_dir: str):
        self.store = open_store(url, os.environ)
        self.seed = seed
        self.kind = kind
        self.report_dir = report_dir
        self._producer: Any = None
        self.unsettled: dict[int, list[tuple[int, int]]] = {}  # partition -> [(batch, n)] told unknown

    def producer(self) -> Any:
        from ctp_state.producer import Producer

        if self._producer is None:
            self._producer = Producer(self.store, epoch_ttl_s=3600.0 if self.kind == "stale" else 0.2, append_threads=4)
        return self._producer

    # --- ops ----------------------------------------------------------------------------

    def produce(self, batch: int, parts: list[list[int]], retry: bool = False) -> dict[str, Any]:
        told = self._settle([p for p, _ in parts])
        want = [(p, n) for p, n in parts if p not in self.unsettled]  # still unknown: send nothing new there
        told += [[batch, p, {"outcome": "rejected", "reason": "not_sent"}] for p, n in parts if p in self.unsettled]
        told += self._send(batch, want, retry)
        return {"told": told}

    def resend(self) -> dict[str, Any]:
        return {"told": self._settle(sorted(self.unsettled))}

    def _settle(self, partitions: list[int]) -> list[list[Any]]:
        told: list[list[Any]] = []
        for p in partitions:
            while self.unsettled.get(p):
                batch, n = self.unsettled[p][0]
                answer = self._send(batch, [(p, n)], False)
                told += answer
                if answer[0][2]["outcome"] == "unknown":
                    break
        return told

    def _send(self, batch: int, parts: list[tuple[int, int]], retry: bool) -> list[list[Any]]:
        from ctp_state.producer import write_with_retry

        if not parts:
            return []
        chunks = [((TOPIC, p), records(self.seed, batch, p, n)) for p, n in parts]
        try:
            if retry:
                ok, bad = write_with_retry(self.producer(), chunks)
                verdicts = ok + bad
            else:
                verdicts = self.producer().write(chunks)
        except TopicNotFound as e:  # deleted, not created again yet: checked before anything is written
            return [
                [batch, p, {"outcome": "rejected", "reason": "topic_not_found", "error": str(e)[:300]}]
                for p, _ in parts
            ]
        n_of = dict(parts)
        told = []
        for v in verdicts:
            a = _answer(v)
            q = self.unsettled.setdefault(v.partition, [])
            entry = (batch, n_of[v.partition])
            if a["outcome"] == "unknown":
                if entry not in q:
                    q.append(entry)
            elif entry in q:
                q.remove(entry)
            if not q:
                self.unsettled.pop(v.partition, None)
            told.append([batch, v.partition, a])
        return told

    def advance(self) -> dict[str, Any]:
        from ctp_state.epoch import ClusterEpoch

        return {"epoch": ClusterEpoch(self.store).advance()}

    def reconcile(self, lease_ms: int, target_file_bytes: int, claim_wait_s: float = 0.0) -> dict[str, Any]:
        from ctp_state.reconcile import run_reconcile
        from ctp_state.settings import ReconcileSettings

        s = run_reconcile(
            self.store,
            config=ReconcileSettings(
                lease_ms=lease_ms,
                target_file_bytes=target_file_bytes,
                # 3: idle partitions tick at phases of their own (ctp_state.tick_schedule),
                # early, between the Spark reconciler's runs at 1 (docs/design.md 14)
                idle_lag=3,
                threads=4,
                claim_wait_s=claim_wait_s,
                quiet_min=1,  # the quiet partitions' path (docs/design.md 14) on the sim's few partitions
            ),
        )
        return {
            "ok": s.ok,
            "records": s.records,
            "statuses": sorted({p.status for p in s.partitions}),
            "problems": [
                f"{p.partition}: {p.status}: {p.reason}" for p in s.partitions if p.failed or p.status == "claim_held"
            ][:5],
        }

    def gc(
        self, l1_grace_s: float, max_deletes: int | None, full: bool = False, removal_grace_s: float = 60.0
    ) -> dict[str, Any]:
        from ctp_state.gc import run_gc
        from ctp_state.settings import GcSettings
        from ctp_state.table.catalog import CatalogConfig
        from ctp_state.table.maintenance import CatalogTables
        from expectations.gate import GxGate

        # The topic's table too: its gate checks, snapshot expiry and sweep (a small
        # table history, so that the sweep has work in a short run). The quiesce keeps
        # only the head: a retained older snapshot names the files a compaction replaced,
        # and R11 keeps them while it does (found by the soak, file seed 13: 13 replaced
        # files kept for good by the second of two snapshots, once nothing published).
        tables = CatalogTables(
            self.store,
            CatalogConfig.from_env(os.environ),
            home=os.path.dirname(self.report_dir),
            keep=1 if full else 2,
            max_age_s=0.0,
        )
        try:
            rec = run_gc(
                self.store,
                tables=tables,
                gate=GxGate(self.report_dir, store_url=self.store.url),
                config=GcSettings(
                    l1_grace_s=l1_grace_s,
                    l1_reader_grace_s=l1_grace_s,  # (replaced L1 files: the same short grace here)
                    max_deletes=max_deletes,
                    list_threads=4,
                    read_threads=8,
                    topic_removal_grace_s=0.0 if full else removal_grace_s,
                    # quiesce: nothing runs, so every leftover is garbage now
                    **({"l1_full_sweep_s": 0.0, "tmp_grace_s": 0.0} if full else {}),
                ),
            )
        except GateFailed as e:
            return {"gate_failed": e.failures}
        return {
            "status": rec.status,
            "m": rec.m,
            "deleted": rec.deleted,
            "l1_orphans": rec.l1_orphans,
            "topics_removed": rec.topic_incarnations_removed,
        }

    def read(self, partition: int) -> dict[str, Any]:
        from ctp_state.read import read_partition
        from ctp_state.topics import get_topic

        before = get_topic(self.store, TOPIC).id
        rows = _rows(read_partition(self.store, TOPIC, partition))
        after = get_topic(self.store, TOPIC).id
        return {"rows": rows, "incarnation": before if before == after else None}

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op, args = cmd["op"], cmd.get("args", {})
        if cmd.get("crash"):
            os.environ["CTP_FAULT"] = cmd["crash"]
        try:
            if op == "produce":
                return self.produce(args["batch"], args["parts"], args.get("retry", False))
            if op == "resend":
                return self.resend()
            if op == "advance":
                return self.advance()
            if op == "reconcile":
                return self.reconcile(args["lease_ms"], args["target_file_bytes"], args.get("claim_wait_s", 0.0))
            if op == "gc":
                return self.gc(
                    args["l1_grace_s"],
                    args.get("max_deletes"),
                    args.get("full", False),
                    args.get("removal_grace_s", 60.0),
                )
            if op == "read":
                return self.read(args["partition"])
            raise ValueError(f"unknown op {op!r}")
        except (CtpError, OSError) as e:
            return {"error": f"{type(e).__name__}: {e}"[:500]}
        finally:
            os.environ.pop("CTP_FAULT", None)


def main() -> None:
    url, seed, kind, report_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    w = Worker(url, seed, kind, report_dir)
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to the log, not the protocol
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            reply = w.handle(cmd)
        except Exception as e:  # a bug: report it as such, with the traceback
            reply = {"crashed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        print(json.dumps({"step": cmd.get("n"), **reply}), file=out, flush=True)


if __name__ == "__main__":
    main()
