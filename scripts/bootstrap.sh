#!/usr/bin/env bash
# Install everything ctp needs into a virtualenv, idempotently.
#
#   scripts/bootstrap.sh            # venv at $CTP_VENV (default: .venv in the repo)
#
# Re-running is cheap: the install is skipped while pyproject.toml and this script are
# unchanged and the venv's key imports still work.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CTP_VENV:-$repo/.venv}"
python="${CTP_PYTHON:-}"
PYSPARK_VERSION=4.3.0

log() { printf '[bootstrap] %s\n' "$*" >&2; }

if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python="$candidate"; break
    fi
  done
fi
[ -n "$python" ] || { echo "error: Python 3.11 is required (set CTP_PYTHON to its path)" >&2; exit 1; }

# Spark needs a Java runtime (17 is what the stack is measured with).
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing a Java runtime for Spark (apt-get install openjdk-17-jre-headless)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "error: Spark needs Java 17 on PATH (install openjdk-17-jre-headless)" >&2; exit 1
  fi
fi

stamp="$venv/.ctp-install-stamp"
# The install is this checkout's: its path is part of the stamp, and the check (run from
# outside the checkout, so that the current directory proves nothing) finds ctp_state in it.
want="$( (echo "$repo"; cat "$repo/pyproject.toml" "$repo/scripts/bootstrap.sh") | sha256sum | cut -d' ' -f1)"
check='import os, ctp_state, pyspark, airflow, great_expectations, moto, boto3
from ctp_state.local_s3 import weed_binary; weed_binary()
assert pyspark.__version__ == "'$PYSPARK_VERSION'", "pyspark is " + pyspark.__version__
here = os.path.dirname(os.path.dirname(os.path.realpath(ctp_state.__file__)))
assert here == os.path.realpath("'$repo'"), "ctp_state is installed from " + here'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && (cd / && "$venv/bin/python" -c "$check") >/dev/null 2>&1; then
  exit 0
fi

log "creating $venv with $("$python" --version) (a few minutes the first time)"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[test,bench]"
# The Spark provider depends on pyspark-client, whose files overwrite pyspark's own
# Python files (pyspark.__version__ then says 4.2.0 beside 4.3.0 jars). Put pyspark
# back. Never uninstall pyspark-client: that deletes the shared files.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "pyspark==$PYSPARK_VERSION"
if ! out="$(cd / && "$venv/bin/python" -c "$check" 2>&1)"; then
  printf '%s\n' "$out" | tail -5 >&2
  echo "error: the install in $venv is incomplete (see above)" >&2; exit 1
fi
echo "$want" > "$stamp"
log "ready: $venv"
