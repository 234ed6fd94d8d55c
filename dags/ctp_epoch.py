"""
### ctp: advance the cluster epoch

Advances the cluster epoch **C** by one, on a schedule (every
`$CTP_EPOCH_INTERVAL_MINUTES` minutes, default 5) or when triggered from the UI.
Producers stamp every L0 object with the epoch they read; advancing it lets the
reconciler move each partition's lower bound up, which is what lets the GC's safe
epoch **M** follow C.

- **Safe to run any time, and twice at once**: every value has a create-if-absent
  marker in the store, so two advancers never produce the same or a smaller epoch.
- **Updates** the `ctp://cluster/epoch` Asset, which schedules the reconcile DAG.
- **If it fails**: the store is unreachable or misconfigured; the task log has the
  one-line cause. Producers keep working on the old epoch meanwhile, and M stops
  following C until it runs again.
- Configuration (resolved in the task): Variable `ctp_store` or `$CTP_STORE`;
  S3 settings from the connection `ctp_s3` or the environment.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pendulum
from airflow.sdk import dag, task
from ctp_common import EPOCH_ASSET, default_args, open_store, resolve

log = logging.getLogger(__name__)
INTERVAL = timedelta(minutes=float(os.environ.get("CTP_EPOCH_INTERVAL_MINUTES", "5")))


@dag(
    dag_id="ctp_epoch_advance",
    schedule=INTERVAL,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one advance per tick is the point; overlap would only skip ahead
    tags=["ctp", "epoch"],
    doc_md=__doc__,
    default_args=default_args(retries=3, retry_delay=timedelta(seconds=30), execution_timeout=timedelta(minutes=2)),
)
def ctp_epoch_advance():
    @task(outlets=[EPOCH_ASSET])
    def advance() -> int:
        """Advance C by one and return the new value."""
        from ctp_state.epoch import ClusterEpoch

        cfg = resolve()
        new = ClusterEpoch(open_store(cfg)).advance()
        log.info("cluster epoch advanced to %d", new)
        return new

    advance()


ctp_epoch_advance()
