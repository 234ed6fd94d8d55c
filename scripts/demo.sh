#!/usr/bin/env bash
# Install what ctp needs and run it end to end on embedded defaults: Airflow on SQLite,
# a local-filesystem store and local Spark, all under .ctp-demo/ in the repo.
#
#   scripts/demo.sh            drive the three DAGs once with dag.test(): traffic, epoch
#                              advances, the Spark reconcile, the GC behind its gate;
#                              prints what happened and where the report is
#   scripts/demo.sh --ui       start the Airflow UI (airflow standalone) with the DAGs
#                              scheduled and a traffic generator; prints URL and login
#   scripts/demo.sh --cli      the same flow through the ctp CLI only (no Airflow)
#   scripts/demo.sh --s3 [--cli]
#                              the same, on a real S3 protocol: a local SeaweedFS server
#                              (loopback only, generated credentials, data under
#                              .ctp-demo/seaweedfs; report and Airflow under .ctp-demo/s3/;
#                              the tables in its Iceberg REST catalog), started before
#                              and stopped after
# The modes run in any order in one checkout: each store keeps its own report directory,
# Airflow home and Iceberg catalog (the file store's SQLite file, the S3 store's REST catalog).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/bootstrap.sh"
source "$repo/scripts/env.sh"
demo="$repo/.ctp-demo"

# Each store has everything of its own under .ctp-demo/: the file store's report,
# Airflow home and catalog sit at the top (and its catalog beside the store), the S3
# store's under .ctp-demo/s3/. So any mode runs after any other in one checkout.
s3=()
if [ "${1:-}" = --s3 ]; then
  shift
  # The store is a prefix of the server's bucket; the server's settings reach every
  # child (Airflow tasks, spark-submit) through the environment.
  # Its Iceberg REST catalog too (--catalog): the tables are published there.
  s3=(python -m ctp_state.local_s3 --dir "$demo/seaweedfs" --prefix demo --catalog --)
  mine="$demo/s3"
else
  mine="$demo"
  export CTP_STORE="${CTP_STORE:-file://$demo/store}"
fi
mkdir -p "$mine"
export CTP_REPORT_DIR="${CTP_REPORT_DIR:-$mine/report}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$mine/airflow}"
export CTP_DEMO_DIR="${CTP_DEMO_DIR:-$demo}"  # the UI's password and JWT secret
# Embedded defaults: SQLite in AIRFLOW_HOME, whatever the calling shell says.
unset AIRFLOW__DATABASE__SQL_ALCHEMY_CONN
case "${1:-}" in
  --ui) shift; [ ${#s3[@]} = 0 ] || { echo "error: --s3 does not combine with --ui" >&2; exit 2; }
        exec "$repo/scripts/ui.sh" "$@" ;;
  --cli) shift; exec "${s3[@]}" ctp demo "$@" ;;
  *) exec "${s3[@]}" python "$repo/scripts/run_dags.py" "$@" ;;
esac
