#!/usr/bin/env bash
# Install what the tests need, lint and type-check, and run the tests:  scripts/test.sh [pytest args]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/bootstrap.sh"
# The report's offline test reads it in headless Chromium (tests/report).
if ! command -v "${CTP_CHROMIUM:-chromium}" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[test] installing Debian's chromium for the browser tests (apt-get install chromium)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "[test] warning: no chromium on PATH; tests/report will fail (install chromium, or set CTP_CHROMIUM)" >&2
  fi
fi
source "$repo/scripts/env.sh"
cd "$repo"
# Developer habits first (seconds): lint, formatting, strict types on ctp_state.
echo "[test] ruff check, ruff format --check, mypy" >&2
ruff check --quiet .
ruff format --check --quiet .
mypy
set +e
# Three workers on two cores (pytest-xdist; CTP_TEST_WORKERS=0 runs in this process):
# most tests wait on Spark, Airflow, the S3 server, leases or killed processes, so a
# third keeps the cores busy. Measured 2026-11-27 on 2 cores: the tests' summed time
# was the same with 2 and with 3 workers (4,359 s and 4,391 s), the wall time 2,202 s
# and 1,494 s. worksteal: a worker that runs out takes tests queued on another, so
# the long end-to-end tests do not leave a core idle at the end.
if [ "${CTP_TEST_WORKERS:-3}" = 0 ]; then
  python -m pytest "$@"
else
  python -m pytest -n "${CTP_TEST_WORKERS:-3}" --dist worksteal "$@"
fi
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "error: pytest collected no tests" >&2
fi
exit "$rc"
