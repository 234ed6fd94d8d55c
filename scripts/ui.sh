#!/usr/bin/env bash
# The Airflow UI with ctp's DAGs scheduled, plus a traffic generator (scripts/demo.sh --ui).
# Expects scripts/env.sh sourced and CTP_STORE / CTP_REPORT_DIR / AIRFLOW_HOME set.
#
# Safe by default: every listener binds 127.0.0.1 (api-server on CTP_UI_PORT, 8080;
# the scheduler serves no logs: the api-server reads the task logs from disk; the
# reconcile's Spark driver and UI through SPARK_LOCAL_IP), and
# the admin password is CTP_UI_PASSWORD or, without it, a random one generated on first
# start, printed once and kept in $CTP_DEMO_DIR/ui-password (mode 600). The three ctp
# DAGs are unpaused explicitly, whatever an earlier run registered.
# Ctrl-C stops everything it started.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="${CTP_UI_PORT:-8080}"
state="${CTP_DEMO_DIR:-$(dirname "$AIRFLOW_HOME")}"
mkdir -p "$AIRFLOW_HOME" "$state"

secret() {  # a secret kept in $state/<name> (mode 600), generated on first use
  local file="$state/$1"
  if [ ! -s "$file" ]; then
    (umask 077; python -c 'import secrets; print(secrets.token_urlsafe(24))' > "$file")
    return 1
  fi
}
if [ -n "${CTP_UI_PASSWORD:-}" ]; then
  password="$CTP_UI_PASSWORD"; told="from CTP_UI_PASSWORD"
elif secret ui-password; then
  password="$(cat "$state/ui-password")"; told="kept in $state/ui-password"
else
  password="$(cat "$state/ui-password")"; told="$password  (generated now; kept in $state/ui-password)"
fi
secret jwt-secret || true

export AIRFLOW__CORE__DAGS_FOLDER="$repo/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=4                       # keeps Airflow near 1 GiB
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$port/execution/"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$port"
export AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$state/jwt-secret")"
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
export SPARK_LOCAL_IP=127.0.0.1   # the reconcile's Spark driver, block manager and UI: loopback too
export CTP_EPOCH_INTERVAL_MINUTES="${CTP_EPOCH_INTERVAL_MINUTES:-1}"
# JSON-encoded by Python: a CTP_UI_PASSWORD with quotes or backslashes stays one password.
(umask 077; CTP_PW="$password" python -c 'import json, os; print(json.dumps({"admin": os.environ["CTP_PW"]}))' \
  > "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated")

log="$AIRFLOW_HOME/ui.log"
airflow db migrate >"$log" 2>&1
ctp topic create demo --partitions 8 --exist-ok >/dev/null
# One session for all three: stopping the group stops the task runners too.
setsid bash -c '
  airflow api-server --host 127.0.0.1 --port "$0" &
  airflow scheduler --skip-serve-logs &
  airflow dag-processor &
  wait' "$port" >>"$log" 2>&1 &
af=$!
( while true; do ctp produce --generate --topic demo --records 5000 >/dev/null 2>&1 || true; sleep 15; done ) &
gen=$!
trap 'kill -TERM -- -$af 2>/dev/null; kill $gen 2>/dev/null; wait 2>/dev/null; echo stopped' INT TERM EXIT

for _ in $(seq 1 90); do
  curl -fsS "http://127.0.0.1:$port/api/v2/monitor/health" >/dev/null 2>&1 && break
  sleep 2
done
# Unpause explicitly: DAGs an earlier `scripts/demo.sh` registered stay paused otherwise.
for dag in ctp_epoch_advance ctp_reconcile ctp_gc; do
  for _ in $(seq 1 60); do
    airflow dags unpause "$dag" >>"$log" 2>&1 && break
    sleep 2  # not parsed yet
  done
done
cat <<MSG
Airflow UI:  http://127.0.0.1:$port   (user admin, password $told)
DAGs:        ctp_epoch_advance every ${CTP_EPOCH_INTERVAL_MINUTES} min -> ctp_reconcile -> ctp_gc (unpaused)
Traffic:     5,000 records to topic 'demo' every 15 s into $CTP_STORE
Report:      $CTP_REPORT_DIR/index.html (after the first GC run)
Logs:        $log
Press Ctrl-C to stop.
MSG
wait $af
