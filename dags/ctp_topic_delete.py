"""
### ctp: delete a topic

Deletes one incarnation of a topic, triggered from the UI (or the REST API) only. Fill
in **topic**, type the name again in **confirm**, and optionally give the incarnation
**id** that `ctp topic list` shows; without it the run deletes the incarnation that is
live when it starts.

1. `pin` checks the form and pins the incarnation (the id given, or the live one's).
2. `delete` writes the tombstone and seals every partition log of *that* incarnation
   (`ctp topic delete NAME --id ID`). From then on the name resolves to nothing,
   appends to the old incarnation are rejected, and its partitions stop holding M back.

- **Safe to retry and to run twice**: the delete is pinned to one incarnation id, so a
  retry finishes the seals of the incarnation it deleted and never touches a newer one
  created meanwhile (`ctp topic create` works at once after a delete).
- **What happens next**: the GC DAG removes the incarnation's logs, snapshots and L1
  files once its tombstone is older than `topic_removal_grace_s` (1 h by default);
  `ctp topic list` shows it as `deleting` until then. Its L0 objects go as M passes them.
- **If it fails**: the task log has the one-line cause (no such topic, a confirm that
  does not match, an id that is not the live one, the store unreachable). A failure
  after the tombstone leaves some logs unsealed: retry, or let the GC seal them first.
- Configuration (resolved in the task): Variable `ctp_store` or `$CTP_STORE`;
  S3 settings from the connection `ctp_s3` or the environment.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from ctp_common import default_args, open_store, resolve

log = logging.getLogger(__name__)


@dag(
    dag_id="ctp_topic_delete",
    schedule=None,  # only ever by hand
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ctp", "topics"],
    doc_md=__doc__,
    params={
        "topic": Param("", type="string", description="The topic to delete."),
        "confirm": Param("", type="string", description="The topic's name again, to confirm."),
        "id": Param(
            "", type="string", description="Only this incarnation (from `ctp topic list`); empty: the live one."
        ),
    },
    default_args=default_args(retries=2, retry_delay=timedelta(seconds=30), execution_timeout=timedelta(minutes=30)),
)
def ctp_topic_delete():
    @task(retries=0)
    def pin(params=None) -> dict[str, str]:
        """Check the form; return the topic and the id of the incarnation to delete."""
        from airflow.sdk.exceptions import AirflowFailException

        from ctp_state.errors import CtpError
        from ctp_state.topics import get_topic

        params = params or {}
        name, confirm, tid = params["topic"].strip(), params["confirm"].strip(), params["id"].strip()
        if not name or confirm != name:
            raise AirflowFailException(f"confirm must repeat the topic name {name!r}, got {confirm!r}")
        if tid:
            return {"topic": name, "id": tid}
        try:
            return {"topic": name, "id": get_topic(open_store(resolve()), name).incarnation}
        except CtpError as e:
            raise AirflowFailException(str(e)) from None

    @task
    def delete(target: dict[str, str]) -> dict[str, object]:
        """Tombstone and seals of the pinned incarnation (idempotent)."""
        from ctp_state.deletion import delete_topic
        from ctp_state.gc.history import remembered

        store = open_store(resolve())
        t, res = delete_topic(store, target["topic"], expect_id=target["id"], remembered=lambda: remembered(store))
        if res.errors:
            p, why = res.errors[0]
            log.warning(
                "%d partition logs not sealed yet (the GC seals them first); %s/%d: %s", len(res.errors), t.name, p, why
            )
        log.info("deleted topic %s (incarnation %s, %d partitions)", t.name, t.incarnation, t.partitions)
        return {"topic": t.name, "id": t.incarnation, "sealed": res.sealed + res.already, "errors": len(res.errors)}

    delete(pin())


ctp_topic_delete()
