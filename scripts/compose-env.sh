#!/usr/bin/env bash
# Write the .env that docker-compose.yml needs: a random value for every secret the
# stack refuses to start without. Run it once, before `docker compose up`; running it
# again keeps what .env already holds and adds only what is missing.
#
#   scripts/compose-env.sh            # .env beside docker-compose.yml
#   scripts/compose-env.sh FILE       # another file (docker compose --env-file FILE ...)
#
# The file is created mode 600 (owner only) and is git-ignored. No secret is printed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_file="${1:-$repo/.env}"

random_secret() {  # 32 hex characters from the kernel's CSPRNG (URL- and JSON-safe)
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'
}

umask 077
if [ ! -e "$env_file" ]; then
  {
    echo "# docker-compose.yml's secrets, written by scripts/compose-env.sh on $(date -u +%Y-%m-%d)."
    echo "# Keep this file private (mode 600, git-ignored)."
    echo "# Published ports listen on 127.0.0.1 only; to publish them on every interface:"
    echo "# CTP_BIND_ADDRESS=0.0.0.0"
  } >"$env_file"
fi
chmod 600 "$env_file"

added=()
for name in MINIO_ROOT_PASSWORD POSTGRES_PASSWORD AIRFLOW_ADMIN_PASSWORD AIRFLOW_JWT_SECRET AIRFLOW_SECRET_KEY; do
  if ! grep -q "^${name}=." "$env_file"; then
    if grep -q "^${name}=" "$env_file"; then  # present but empty: drop the empty line
      sed -i "/^${name}=\$/d" "$env_file"
    fi
    echo "${name}=$(random_secret)" >>"$env_file"
    added+=("$name")
  fi
done

if [ ${#added[@]} -gt 0 ]; then
  echo "[compose-env] $env_file: generated ${added[*]}" >&2
else
  echo "[compose-env] $env_file: every secret is already set; nothing changed" >&2
fi
echo "[compose-env] Airflow login after 'docker compose up -d --build': http://127.0.0.1:8080, user admin," >&2
echo "[compose-env] password: grep AIRFLOW_ADMIN_PASSWORD $env_file" >&2
