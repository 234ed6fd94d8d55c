#!/usr/bin/env bash
# Install what the tests need, lint and type-check, and run the tests:  scripts/test.sh [pytest args]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/bootstrap.sh"
source "$repo/scripts/env.sh"
cd "$repo"
# Developer habits first (seconds): lint, formatting, strict types on ctp_state.
echo "[test] ruff check, ruff format --check, mypy" >&2
ruff check --quiet .
ruff format --check --quiet .
mypy
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "error: pytest collected no tests" >&2
fi
exit "$rc"
