#!/usr/bin/env bash
# ensure-redis.sh: make sure redis-server (and Sentinel, which is the same
# binary) is on PATH for the tests. On Debian or Ubuntu, as root, it installs
# the distribution's redis-server package when missing; elsewhere it says how.
set -euo pipefail

if [[ -n "${LOCKWARDEN_REDIS_SERVER:-}" && -x "${LOCKWARDEN_REDIS_SERVER}" ]]; then
  exit 0
fi
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi

if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
  if [[ "$(id -u)" == "0" ]]; then
    echo "[redis] redis-server is missing: installing the redis-server package with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    # The package may start a system service; the tests never use it (they
    # start their own servers on free ports), so stop it if it runs.
    if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
    command -v redis-server >/dev/null 2>&1 && exit 0
    echo "[redis] apt-get finished but redis-server is still not on PATH" >&2
    exit 1
  fi
  echo "redis-server is missing. Install it with: sudo apt-get install redis-server" >&2
  exit 1
fi

cat >&2 <<'MSG'
redis-server is missing. The tests start their own redis-server processes (Redis 6.2 or newer).
Install Redis with your package manager, for example:
  macOS:   brew install redis
  Fedora:  sudo dnf install redis
  Alpine:  apk add redis
or point LOCKWARDEN_REDIS_SERVER at a redis-server binary.
MSG
exit 1
