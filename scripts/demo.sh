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
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/bootstrap.sh"
source "$repo/scripts/env.sh"
demo="$repo/.ctp-demo"
export CTP_STORE="${CTP_STORE:-file://$demo/store}"
export CTP_REPORT_DIR="${CTP_REPORT_DIR:-$demo/report}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$demo/airflow}"
# Embedded defaults: SQLite in AIRFLOW_HOME, whatever the calling shell says.
unset AIRFLOW__DATABASE__SQL_ALCHEMY_CONN

case "${1:-}" in
  --ui) shift; exec "$repo/scripts/ui.sh" "$@" ;;
  --cli) shift; exec ctp demo "$@" ;;
  *) exec python "$repo/scripts/run_dags.py" "$@" ;;
esac
