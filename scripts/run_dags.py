"""Drive the three ctp DAGs end to end with ``dag.test()``, on embedded defaults.

    python scripts/run_dags.py [--rounds 3] [--records 20000] [--partitions 8] [--json]

Prepares Airflow (``AIRFLOW_HOME``, default ``.ctp-demo/airflow``; SQLite unless
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` says otherwise; ``airflow db migrate`` once),
generates traffic while the epoch DAG advances the cluster epoch, then runs the
reconcile DAG (spark-submit through ``spark_default``, ``local[2]`` unless set) and the
GC DAG (gate, collect, report), and prints what happened: epochs, records reconciled,
M, objects deleted, and where the report is. The store is ``$CTP_STORE`` (default
``.ctp-demo/store``); the report goes to ``$CTP_REPORT_DIR`` (default ``.ctp-demo/report``
for that store, the store's own directory under ``$AIRFLOW_HOME/ctp/reports/`` for another).
Exits 1 if any DAG run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAGS = os.path.join(REPO, "dags")


def prepare_airflow_env() -> dict[str, str]:
    """Airflow settings for an embedded run; must be set before airflow is imported."""
    demo = os.path.join(REPO, ".ctp-demo")
    defaults = {
        "AIRFLOW_HOME": os.path.join(demo, "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": DAGS,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "CTP_STORE": "file://" + os.path.join(demo, "store"),
    }
    if "CTP_STORE" not in os.environ:  # the demo's own store: its report beside it
        defaults["CTP_REPORT_DIR"] = os.path.join(demo, "report")
    # (another store's report goes where the GC DAG puts each store's: its own directory)
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    os.makedirs(os.environ["AIRFLOW_HOME"], exist_ok=True)
    if DAGS not in sys.path:
        sys.path.insert(0, DAGS)  # as Airflow does: DAG files share ctp_common.py
    return {k: os.environ[k] for k in defaults if k in os.environ}


def migrate() -> None:
    """``airflow db migrate`` once per metadata DB (idempotent, ~3 s on SQLite)."""
    conn = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite")
    stamp = os.path.join(os.environ["AIRFLOW_HOME"], ".ctp-migrated")
    if os.path.exists(stamp) and open(stamp).read() == conn:
        return
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    r = subprocess.run([airflow, "db", "migrate"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: airflow db migrate failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    with open(stamp, "w") as f:
        f.write(conn)


@contextlib.contextmanager
def output_to(path: str):
    """Send this process's stdout/stderr (file descriptors, so Airflow's and Spark's
    loggers too) to ``path`` while DAG runs are printing their task logs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class Driver:
    def __init__(self, say, log_path: str) -> None:
        from airflow.dag_processing.dagbag import DagBag

        self.say, self.log_path = say, log_path
        with output_to(log_path):
            bag = DagBag(dag_folder=DAGS)
        if bag.import_errors:
            path, err = next(iter(bag.import_errors.items()))
            sys.exit(f"error: {path} does not import: {err.strip().splitlines()[-1]}")
        self.dags = bag.dags
        self.runs: list[dict] = []

    def run(self, dag_id: str, conf: dict | None = None) -> None:
        t0 = time.monotonic()
        with output_to(self.log_path):
            dr = self.dags[dag_id].test(run_conf=conf or None)
        state = str(getattr(dr.state, "value", dr.state))
        took = round(time.monotonic() - t0, 1)
        self.runs.append({"dag_id": dag_id, "state": state, "seconds": took, "conf": conf or {}})
        self.say(f"  DAG {dag_id}{' ' + json.dumps(conf) if conf else ''}: {state} in {took}s")
        if state != "success":
            with open(self.log_path, errors="replace") as f:
                tail = f.readlines()[-40:]
            sys.stderr.write("".join(tail))
            raise SystemExit(f"error: DAG {dag_id} finished {state}; task logs in {self.log_path} (tail above)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="produce + epoch-advance rounds")
    ap.add_argument("--records", type=int, default=20_000, help="records per round")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--topic", default="demo")
    ap.add_argument("--json", action="store_true", help="print the outcome as JSON on the last line")
    args = ap.parse_args()

    env = prepare_airflow_env()
    quiet = args.json
    say = (lambda msg: print(msg, file=sys.stderr)) if quiet else print
    say(f"Airflow home {env['AIRFLOW_HOME']}")
    migrate()
    logging.getLogger("airflow").setLevel(logging.WARNING)

    from ctp_common import open_store, resolve  # the DAGs' own resolution: Variables, connections, env

    from ctp_state.epoch import ClusterEpoch
    from ctp_state.errors import CtpError
    from ctp_state.gc.history import GcHistory
    from ctp_state.l0 import Record
    from ctp_state.producer import Producer, write_with_retry
    from ctp_state.status import reconcile_summaries as summaries
    from ctp_state.storage import redact_url
    from ctp_state.topics import create_topic

    cfg = resolve()
    store = open_store(cfg)
    log_path = os.path.join(env["AIRFLOW_HOME"], "dag-runs.log")
    driver = Driver(say, log_path)
    say(f"task logs: {log_path}")
    from ctp_state.topics import get_topic

    try:
        create_topic(store, args.topic, args.partitions, exist_ok=True)
    except CtpError as e:  # e.g. the topic exists with another partition count: use it as it is
        say(f"note: {e}")
    partitions = get_topic(store, args.topic).partitions
    epoch_before = ClusterEpoch(store).current()
    produced = 0
    with Producer(store, epoch_ttl_s=0) as producer:
        for r in range(args.rounds):
            now = int(time.time() * 1000)
            chunks = {}
            for i in range(args.records):
                chunks.setdefault((args.topic, i % partitions), []).append(
                    Record(os.urandom(100), f"user-{i % 1000}".encode(), now)
                )
            accepted, rejected = write_with_retry(producer, sorted(chunks.items()))
            produced += sum(v.records for v in accepted)
            if rejected:
                raise SystemExit(f"error: traffic was rejected: {rejected[0].error}")
            say(
                f"round {r + 1}: produced {args.records} records (one L0 object) at epoch {ClusterEpoch(store).current()}"
            )
            driver.run("ctp_epoch_advance")
    driver.run("ctp_reconcile")
    reconciled = summaries(store).newest()
    driver.run("ctp_gc", {"dry_run": True})
    dry = GcHistory(store).tail(1)[0]
    driver.run("ctp_gc", {"dry_run": False})
    gc = GcHistory(store).tail(1)[0]
    # Everything accepted is still readable exactly once, from L1 and unreconciled L0.
    from ctp_state.read import read_partition
    from ctp_state.status import read_states, select_topics

    topic = select_topics(store, [args.topic])
    read_back = sum(read_partition(store, args.topic, p).num_rows for p in range(partitions))
    in_logs = sum(s.next_offset for s in read_states(store, topic))
    say(
        f"read back {read_back} records after the GC (the logs hold {in_logs}): "
        + ("every record exactly once" if read_back == in_logs else "MISMATCH")
    )
    if read_back != in_logs:
        raise SystemExit(f"error: read back {read_back} records, the logs hold {in_logs}")
    # The reconcile DAG's publish task put the committed records into the topic's table.
    from ctp_state.table.jobs import describe

    table = describe(store, cfg.catalog(), args.topic, home=os.path.expanduser("~"))  # the DAGs' catalog
    published = sum(f.records for f in table.files)
    say(f"table {table.table}: {published} records in {len(table.files)} files ({table.metadata_location})")
    out = {
        "store": redact_url(store.url),
        "airflow_home": env["AIRFLOW_HOME"],
        "metadata_db": os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").split(":", 1)[0],
        "epoch_before": epoch_before,
        "epoch_after": ClusterEpoch(store).current(),
        "records_produced": produced,
        "records_reconciled": reconciled.records if reconciled else None,
        "l1_files": reconciled.l1_files if reconciled else None,
        "m": gc.m,
        "would_delete_dry_run": dry.would_delete,
        "l0_objects_deleted": gc.deleted,
        "l0_bytes_deleted": gc.deleted_bytes,
        "gc_status": gc.status,
        "records_read_back": read_back,
        "records_in_table": published,
        "table_metadata": table.metadata_location,
        "report": os.path.join(cfg.report_dir, "index.html"),
        "dag_runs": driver.runs,
    }
    say(
        f"epochs {out['epoch_before']} -> {out['epoch_after']}; {out['records_reconciled']} records reconciled into "
        f"{out['l1_files']} L1 files; M = {out['m']}; GC dry run would delete {out['would_delete_dry_run']}, "
        f"then deleted {out['l0_objects_deleted']} L0 objects ({out['l0_bytes_deleted']} bytes)"
    )
    say(f"report: {out['report']}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    from ctp_state.errors import CtpError
    from ctp_state.process_exit import run as run_and_leave

    def entry() -> None:
        try:
            main()
        except CtpError as e:  # a one-line cause, as the CLI gives
            sys.exit(f"error: {e}")

    run_and_leave(entry)  # the demo's status, whatever pyarrow does at teardown (ctp_state.process_exit)
