"""S3 requests per partition per epoch, by operation, on a real S3 server. Printed as JSON.

    python benchmarks/bench_requests.py [--partitions 300] [--rounds 4] [--idle-lag 6]
                                        [--warmup 2] [--records 5] [--scenario idle|active|both]
                                        [--detail] [--marginal]

What an S3 bill counts is requests, so this counts them where they leave: at the boto3
client, every client the store creates (its own and the one ``bulk()`` builds for the
GC's lister and deleter), against a local SeaweedFS server over HTTP
(:class:`~ctp_state.local_s3.LocalS3`). A paginated listing is one request a page, and a
request that fails (a 404 HEAD, a 412 conditional PUT) is one request too; both are
counted as the server bills them. ``http_requests`` also counts botocore's retries (it
equals the calls unless the server throttled or failed).

One topic of ``--partitions`` partitions on a fresh store; ``--warmup`` rounds not
counted (by default ``idle_lag``: every partition has been advanced once, R6, and so has
its first snapshot; the first GC has made its full L1 sweep), then ``--rounds``
measured rounds (a multiple of ``idle_lag`` averages the idle partitions' advance
fairly), each:

- produce (``active`` only): one producer writes ``--records`` records to every
  partition, in one L0 object;
- advance: C moves on by one (``ClusterEpoch.advance``);
- reconcile: ``run_reconcile`` with the default settings but ``--idle-lag`` (an idle
  partition is advanced, R6, every ``idle_lag`` epochs);
- gc: ``run_gc`` (deleting, default settings) behind the real Great Expectations gate,
  ``--gap`` seconds after the reconcile.

Scenarios: ``idle`` (no traffic at all: what a partition nobody writes to costs) and
``active`` (every partition written every epoch). Figures are per partition per epoch
(count / (partitions x rounds)), by operation and by phase; ``put_class`` (PUT, COPY,
POST, LIST; DELETE counted here too) and ``get_class`` (GET, HEAD) sum the maintenance
phases (advance, reconcile, gc; the producer's own requests are shown apart, under
``by_phase.produce``). ``cost_100k_*_per_day`` scales that to 100,000 partitions and a
5-minute epoch (288 epochs a day) at $0.005 per 1,000 PUT-class and $0.0004 per 1,000
GET-class requests (other operations priced as GET-class, as AWS does). The per-epoch
costs that do not grow with partitions (the advance, the run records) are scaled with
them, so at small ``--partitions`` the estimate is a little high.

What a reader of a partition's state pays grows with the log's tail since its last
snapshot; ``per_round`` shows whether the rounds measured are alike. If they are not
(a tail that grows for several epochs before something snapshots it), measure a whole
cycle: ``--warmup`` and ``--rounds`` of that many epochs.

``--marginal`` runs each scenario again at twice ``--partitions`` (a bucket of its own)
and reports the difference: what one more partition costs per epoch, by operation, with
the runs' fixed requests (the GC history and its pack, the summaries, the epoch) apart
as ``fixed_per_epoch``. That is the figure that scales to 100,000 partitions;
``cost_100k_*_per_day_marginal`` prices it, the fixed requests added once an epoch.

``--detail`` adds, per phase, the requests by operation and key shape (the store's
prefix dropped, numbers as ``#``, hex ids as ``<id>``): which request comes from where.

:class:`RequestCounter` is the reusable part: ``with RequestCounter(store) as n:``
counts every request of ``store``'s clients and of any client created meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PUT_CLASS = frozenset(
    {
        "PutObject",
        "CopyObject",
        "PostObject",
        "ListObjects",
        "ListObjectsV2",
        "ListObjectVersions",
        "ListMultipartUploads",
        "ListParts",
        "DeleteObject",
        "DeleteObjects",
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPartCopy",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
    }
)
GET_CLASS = frozenset({"GetObject", "HeadObject"})
USD_PER_1000 = {"put_class": 0.005, "get_class": 0.0004, "other_class": 0.0004}
MAINTENANCE = ("advance", "reconcile", "gc")
EPOCHS_PER_DAY = 288  # a 5-minute epoch
SCALE_PARTITIONS = 100_000

_TOKEN = re.compile(r"(?<![A-Za-z0-9])[0-9a-f]+(?![A-Za-z0-9])")  # a name part: a number, an id


def request_class(operation: str) -> str:
    """``put_class``, ``get_class`` or ``other_class`` (priced as GET-class by AWS)."""
    if operation in PUT_CLASS:
        return "put_class"
    return "get_class" if operation in GET_CLASS else "other_class"


class RequestCounter:
    """The S3 requests of a store's boto3 clients, by phase and operation.

    Counts at botocore's ``before-call`` (one API call: a page of a listing, a failed
    HEAD) and ``before-send`` (one HTTP attempt: retries included) on the store's own
    client and on every client created while counting (``store.bulk()``'s), by wrapping
    ``botocore.session.Session.create_client``. ``with counter.phase(name):`` files what
    follows under ``name`` (``"other"`` outside any phase). Safe from the store's threads.
    """

    def __init__(self, store: Any = None, *, shapes: bool = False):
        self.store = store
        self.shapes = shapes
        self.calls: defaultdict[str, Counter[str]] = defaultdict(Counter)  # phase -> operation -> API calls
        self.sends: defaultdict[str, Counter[str]] = defaultdict(Counter)  # phase -> operation -> HTTP attempts
        self.errors: defaultdict[str, Counter[str]] = defaultdict(Counter)  # phase -> "operation code" -> n
        self.keys: defaultdict[str, Counter[str]] = defaultdict(Counter)  # phase -> "operation shape" -> n
        self.current = "other"
        self.clients = 0
        self._strip = getattr(store, "prefix", "") or ""
        self._lock = threading.Lock()
        self._id = f"ctp-request-counter-{id(self)}"
        self._active = False
        self._original: Any = None

    # --- the hooks ---------------------------------------------------------------------

    def attach(self, client: Any) -> None:
        """Count ``client``'s requests (once, however often it is attached)."""
        events = client.meta.events
        events.register("before-parameter-build.s3", self._on_params, unique_id=self._id + "-params")
        events.register("before-call.s3", self._on_call, unique_id=self._id + "-call")
        events.register("before-send.s3", self._on_send, unique_id=self._id + "-send")
        events.register("after-call.s3", self._on_after, unique_id=self._id + "-after")
        with self._lock:
            self.clients += 1

    def _on_params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if self._active and self.shapes:  # the call's own parameters (before-call has the HTTP request's)
            context[self._id] = self._shape(params)

    def _on_call(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        if not self._active:
            return
        with self._lock:
            self.calls[self.current][model.name] += 1
            if self.shapes:
                self.keys[self.current][f"{model.name} {context.get(self._id, '?')}"] += 1

    def _on_send(self, event_name: str, **_: Any) -> None:
        if self._active:
            with self._lock:
                self.sends[self.current][event_name.rpartition(".")[2]] += 1

    def _on_after(
        self, model: Any, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        if self._active and http_response.status_code >= 300:
            code = parsed.get("Error", {}).get("Code") or http_response.status_code
            where = f" {context[self._id]}" if self._id in context else ""
            with self._lock:
                self.errors[self.current][f"{model.name} {code}{where}"] += 1

    def _shape(self, params: dict[str, Any]) -> str:
        if "Delete" in params:
            return f"{len(params['Delete'].get('Objects', ()))} keys"
        key = params.get("Key")
        if key is None:  # a listing
            key = params.get("Prefix", "") + "*"
            if "Delimiter" in params:
                key += " (one level)"
            if "StartAfter" in params or "ContinuationToken" in params:
                key += " (next page)" if "ContinuationToken" in params else " (start-after)"
        if self._strip and key.startswith(self._strip):
            key = key[len(self._strip) :]
        return _TOKEN.sub(lambda m: "#" if m[0].isdigit() else "<id>" if len(m[0]) >= 8 else m[0], key)

    # --- counting ----------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def __enter__(self) -> RequestCounter:
        import botocore.session

        original = self._original = botocore.session.Session.create_client
        counter = self

        def create_client(session: Any, *args: Any, **kwargs: Any) -> Any:
            client = original(session, *args, **kwargs)
            if getattr(client.meta, "service_model", None) and client.meta.service_model.service_name == "s3":
                counter.attach(client)
            return client

        botocore.session.Session.create_client = create_client  # type: ignore[method-assign]
        # S3Store's clients created before the counter: its own, and the one it sends its
        # conditional creates on once (put_if_absent_once), if it made it yet
        for own in (getattr(self.store, "_s3", None), getattr(self.store, "_creates", None)):
            if own is not None:
                self.attach(own)
        self._active = True
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        import botocore.session

        self._active = False
        botocore.session.Session.create_client = self._original  # type: ignore[method-assign]

    def reset(self) -> None:
        with self._lock:
            for d in (self.calls, self.sends, self.errors, self.keys):
                d.clear()

    def totals(self, phases: tuple[str, ...] | None = None) -> Counter[str]:
        """API calls by operation, summed over ``phases`` (all when None)."""
        out: Counter[str] = Counter()
        for name, ops in self.calls.items():
            if phases is None or name in phases:
                out.update(ops)
        return out


# --- the scenarios ---------------------------------------------------------------------------


def _per(counts: Counter[str], units: int) -> dict[str, float]:
    return {op: round(n / units, 4) for op, n in sorted(counts.items())}


def _classes(counts: Counter[str], units: int) -> dict[str, float]:
    out = {"put_class": 0.0, "get_class": 0.0, "other_class": 0.0}
    for op, n in counts.items():
        out[request_class(op)] += n / units
    return {k: round(v, 4) for k, v in out.items()}


def run_scenario(
    server: Any,
    name: str,
    partitions: int,
    rounds: int,
    idle_lag: int,
    warmup: int,
    records: int,
    detail: bool,
    gap_s: float = 0.0,
    bucket: str | None = None,
    tick_together: bool = False,
) -> dict:
    from ctp_state.epoch import ClusterEpoch
    from ctp_state.gc import run_gc
    from ctp_state.l0 import Record
    from ctp_state.producer import Producer
    from ctp_state.reconcile import run_reconcile
    from ctp_state.settings import GcSettings, ReconcileSettings
    from ctp_state.storage import open_store
    from ctp_state.topics import create_topic
    from expectations.gate import GxGate

    report_dir = tempfile.mkdtemp(prefix="ctp-bench-requests-gx-")
    store = open_store(server.url(bucket or name), server.env)
    gate = GxGate(report_dir)
    config = ReconcileSettings(idle_lag=idle_lag, tick_together=tick_together)
    active = name == "active"
    outcome: dict = {"reconciled": 0, "advanced": 0, "gc_status": Counter()}
    t_start = time.perf_counter()
    try:
        with RequestCounter(store, shapes=detail) as counter:
            with counter.phase("setup"):
                create_topic(store, "t", partitions)
            setup = dict(counter.totals())

            def one_round(r: int) -> None:
                if active:
                    ts = int(time.time() * 1000)
                    batch = [Record(f"r{r}-{i}".encode(), None, ts + i) for i in range(records)]
                    with counter.phase("produce"), Producer(store, epoch_ttl_s=0) as prod:
                        for v in prod.write([(("t", p), batch) for p in range(partitions)]):
                            if not v.accepted:
                                raise SystemExit(f"produce to t/{v.partition} failed: {v.error}")
                with counter.phase("advance"):
                    ClusterEpoch(store).advance()
                with counter.phase("reconcile"):
                    s = run_reconcile(store, config=config)
                if not s.ok:
                    raise SystemExit(f"reconcile failed in round {r}: {s}")
                time.sleep(gap_s)  # (DAG tasks are seconds apart; see --gap)
                with counter.phase("gc"):
                    g = run_gc(store, gate=gate, config=GcSettings())
                if r >= 0:  # a measured round
                    outcome["reconciled"] += s.partitions_reconciled
                    outcome["advanced"] += s.partitions_advanced
                    outcome["gc_status"][g.status] += 1

            for r in range(-warmup, 0):
                one_round(r)
            warmup_calls = {p: dict(c) for p, c in counter.calls.items() if p != "setup"}
            counter.reset()
            per_round: list[dict[str, int]] = []
            t0 = time.perf_counter()
            for r in range(rounds):
                before = {p: sum(c.values()) for p, c in counter.calls.items()}
                one_round(r)
                per_round.append({p: sum(c.values()) - before.get(p, 0) for p, c in sorted(counter.calls.items())})
            measured_s = time.perf_counter() - t0
    finally:
        store.close()
        shutil.rmtree(report_dir, ignore_errors=True)

    units = partitions * rounds
    maintenance = counter.totals(MAINTENANCE)
    out: dict = {
        "maintenance_calls": dict(sorted(maintenance.items())),
        "per_partition_epoch": _per(maintenance, units),
        **_classes(maintenance, units),
        "total_per_partition_epoch": round(sum(maintenance.values()) / units, 4),
        "by_phase": {p: _per(c, units) for p, c in sorted(counter.calls.items())},
        "per_epoch_total": {p: round(sum(c.values()) / rounds, 1) for p, c in sorted(counter.calls.items())},
        "per_round": per_round,
        "http_requests": sum(sum(c.values()) for c in counter.sends.values()),
        "api_calls": sum(sum(c.values()) for c in counter.calls.values()),
        "errors": {p: dict(sorted(c.items())) for p, c in sorted(counter.errors.items())},
        "warmup": warmup_calls,
        "setup": setup,
        "outcome": {
            "partitions_reconciled": outcome["reconciled"],
            "partitions_advanced": outcome["advanced"],
            "gc_status": dict(outcome["gc_status"]),
        },
        "clients": counter.clients,
        "seconds": {"measured_rounds": round(measured_s, 1), "scenario": round(time.perf_counter() - t_start, 1)},
    }
    if detail:
        out["by_key"] = {
            p: {k: round(n / units, 4) for k, n in sorted(c.items(), key=lambda kv: -kv[1])}
            for p, c in sorted(counter.keys.items())
        }
    return out


def marginal(small: dict, large: dict, partitions: int, rounds: int) -> dict:
    """What one more partition costs per epoch, and what a run costs whatever the
    partitions: the maintenance calls at ``2 x partitions`` less those at ``partitions``,
    by operation (the runs' fixed requests -- the history, the pack, the summaries, the
    epoch -- drop out), and the remainder per epoch. Pure."""
    ops = sorted(set(small["maintenance_calls"]) | set(large["maintenance_calls"]))
    a = Counter({op: small["maintenance_calls"].get(op, 0) for op in ops})
    b = Counter({op: large["maintenance_calls"].get(op, 0) for op in ops})
    per = Counter({op: b[op] - a[op] for op in ops})
    fixed = Counter({op: a[op] - per[op] for op in ops})  # per run: a = fixed + partitions x per
    return {
        "per_partition_epoch": _per(per, partitions * rounds),
        **_classes(per, partitions * rounds),
        "fixed_per_epoch": _per(fixed, rounds),
        "fixed_per_epoch_classes": _classes(fixed, rounds),
    }


def _tree() -> str:
    """The checkout measured: its commit, ``+dirty`` with uncommitted changes."""
    here = os.path.join(os.path.dirname(__file__), "..")
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "-uno"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


def daily_cost(figures: dict, fixed: dict | None = None) -> dict:
    """Requests and dollars a day at 100k partitions, 288 epochs a day: ``figures`` per
    partition per epoch, plus ``fixed`` per epoch whatever the partitions (none: the
    figures carry them, spread over the partitions measured)."""
    scale = SCALE_PARTITIONS * EPOCHS_PER_DAY
    figures = {k: figures[k] + (fixed[k] / SCALE_PARTITIONS if fixed is not None else 0.0) for k in USD_PER_1000}
    out: dict = {f"{k}_requests": round(figures[k] * scale) for k in USD_PER_1000}
    out["usd"] = round(sum(figures[k] * scale / 1000 * price for k, price in USD_PER_1000.items()), 2)
    out["usd_by_class"] = {k: round(figures[k] * scale / 1000 * price, 2) for k, price in USD_PER_1000.items()}
    return out


def main() -> None:
    from ctp_state.settings import ReconcileSettings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--idle-lag", type=int, default=ReconcileSettings().idle_lag)
    ap.add_argument(
        "--tick-together", action="store_true", help="every idle partition ticks in the same run (the old schedule)"
    )
    ap.add_argument("--warmup", type=int, help="rounds not counted first (default: the idle lag)")
    ap.add_argument("--records", type=int, default=5, help="records per partition per round (active)")
    ap.add_argument("--scenario", choices=("idle", "active", "both"), default="both")
    ap.add_argument("--detail", action="store_true", help="requests by key shape, per phase")
    ap.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds between a round's reconcile and its GC (an Airflow DAG's tasks are seconds apart; "
        "the counts do not depend on it)",
    )
    ap.add_argument(
        "--marginal",
        action="store_true",
        help="also run each scenario at twice --partitions: the difference is what one partition costs "
        "without the runs' fixed requests (``marginal``), the figure that scales to 100k partitions",
    )
    args = ap.parse_args()

    from ctp_state.local_s3 import LocalS3

    result: dict = {
        "server": "seaweedfs",
        "partitions": args.partitions,
        "rounds": args.rounds,
        "idle_lag": args.idle_lag,
        "tick_together": args.tick_together,
    }
    warmup = args.idle_lag if args.warmup is None else args.warmup
    result["warmup_rounds"] = warmup
    result["tree"] = _tree()
    scenarios = ("idle", "active") if args.scenario == "both" else (args.scenario,)
    data_dir = tempfile.mkdtemp(prefix="ctp-bench-requests-s3-")
    t0 = time.perf_counter()
    try:
        with LocalS3(data_dir, catalog=False) as server:
            for name in scenarios:
                res = run_scenario(
                    server,
                    name,
                    args.partitions,
                    args.rounds,
                    args.idle_lag,
                    warmup,
                    args.records,
                    args.detail,
                    args.gap,
                    tick_together=args.tick_together,
                )
                result[name] = res
                print(json.dumps({name: {k: res[k] for k in ("per_partition_epoch", "seconds")}}), file=sys.stderr)
                if args.marginal:
                    twice = run_scenario(
                        server,
                        name,
                        2 * args.partitions,
                        args.rounds,
                        args.idle_lag,
                        warmup,
                        args.records,
                        False,
                        args.gap,
                        bucket=f"{name}-twice",
                        tick_together=args.tick_together,
                    )
                    res["marginal"] = marginal(res, twice, args.partitions, args.rounds)
                    res["marginal"]["outcome_twice"] = twice["outcome"]
                    print(json.dumps({name: {"marginal": res["marginal"]["per_partition_epoch"]}}), file=sys.stderr)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    for name in scenarios:
        result[f"cost_100k_{name}_per_day"] = daily_cost(result[name])
        if "marginal" in result[name]:
            m = result[name]["marginal"]
            result[f"cost_100k_{name}_per_day_marginal"] = daily_cost(m, m["fixed_per_epoch_classes"])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
