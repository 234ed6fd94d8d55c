#!/usr/bin/env bash
# The Airflow UI with ctp's DAGs scheduled, plus a traffic generator (scripts/demo.sh --ui).
# Expects scripts/env.sh sourced and CTP_STORE / CTP_REPORT_DIR / AIRFLOW_HOME set.
# Ctrl-C stops everything it started.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="${CTP_UI_PORT:-8080}"
password="${CTP_UI_PASSWORD:-ctp-admin}"
mkdir -p "$AIRFLOW_HOME"
export AIRFLOW__CORE__DAGS_FOLDER="$repo/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False   # scheduled from the start
export AIRFLOW__CORE__PARALLELISM=4                       # keeps standalone near 1 GiB
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__API__PORT="$port"
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
export CTP_EPOCH_INTERVAL_MINUTES="${CTP_EPOCH_INTERVAL_MINUTES:-1}"
printf '{"admin": "%s"}\n' "$password" > "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"

ctp topic create demo --partitions 8 --exist-ok >/dev/null
# Own session: stopping the group stops the scheduler and its task runners too.
setsid airflow standalone >"$AIRFLOW_HOME/standalone.log" 2>&1 &
af=$!
( while true; do ctp produce --generate --topic demo --records 5000 >/dev/null 2>&1 || true; sleep 15; done ) &
gen=$!
trap 'kill -TERM -- -$af 2>/dev/null; kill $gen 2>/dev/null; wait 2>/dev/null; echo stopped' INT TERM EXIT

for _ in $(seq 1 90); do
  curl -fsS "http://127.0.0.1:$port/api/v2/monitor/health" >/dev/null 2>&1 && break
  sleep 2
done
cat <<MSG
Airflow UI:  http://127.0.0.1:$port   (user admin, password $password)
DAGs:        ctp_epoch_advance every ${CTP_EPOCH_INTERVAL_MINUTES} min -> ctp_reconcile -> ctp_gc
Traffic:     5,000 records to topic 'demo' every 15 s into $CTP_STORE
Report:      $CTP_REPORT_DIR/index.html (after the first GC run)
Logs:        $AIRFLOW_HOME/standalone.log
Press Ctrl-C to stop.
MSG
wait $af
