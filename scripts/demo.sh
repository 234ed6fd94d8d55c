#!/usr/bin/env bash
# Install what ctp needs and run the end-to-end flow on embedded defaults
# (a local-filesystem store under .ctp-demo/ in the repo).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/bootstrap.sh"
source "$repo/scripts/env.sh"
export CTP_STORE="${CTP_STORE:-file://$repo/.ctp-demo/store}"
export CTP_REPORT_DIR="${CTP_REPORT_DIR:-$repo/.ctp-demo/report}"
exec ctp demo "$@"
