#!/usr/bin/env bash
# ensure-postgres.sh: make sure the PostgreSQL server binaries (initdb and
# postgres) are installed for the tests, and print the directory that holds
# them on stdout (so a Makefile can export LOCKWARDEN_PG_BINDIR=$(...)).
#
# The binaries are looked for where internal/testutil/pgtest looks:
# $LOCKWARDEN_PG_BINDIR, `pg_config --bindir`, the newest
# /usr/lib/postgresql/*/bin (Debian and Ubuntu keep them off PATH). On Debian
# or Ubuntu, as root, it installs the distribution's postgresql package when
# they are missing, and stops the system service the package starts (the
# tests start their own servers on free ports and never use it); elsewhere it
# says how to install them. Messages go to stderr.
set -euo pipefail

has_bins() { [[ -x "$1/initdb" && -x "$1/postgres" ]]; }

find_bindir() {
  if [[ -n "${LOCKWARDEN_PG_BINDIR:-}" ]]; then
    if has_bins "${LOCKWARDEN_PG_BINDIR}"; then echo "${LOCKWARDEN_PG_BINDIR}"; return 0; fi
    echo "[postgres] LOCKWARDEN_PG_BINDIR=${LOCKWARDEN_PG_BINDIR} holds no initdb and postgres" >&2
    return 1
  fi
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d="$(pg_config --bindir 2>/dev/null || true)"
    if [[ -n "$d" ]] && has_bins "$d"; then echo "$d"; return 0; fi
  fi
  # Newest major version first (sort -V orders 9.6 before 15).
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    if has_bins "$d"; then echo "$d"; return 0; fi
  done
  return 1
}

if find_bindir; then
  exit 0
fi
if [[ -n "${LOCKWARDEN_PG_BINDIR:-}" ]]; then
  exit 1
fi

if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
  if [[ "$(id -u)" == "0" ]]; then
    echo "[postgres] initdb/postgres are missing: installing the postgresql package with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    # The package creates and starts a cluster as a system service; the tests
    # never use it, so stop it if it runs.
    if command -v service >/dev/null 2>&1; then service postgresql stop >/dev/null 2>&1 || true; fi
    if command -v pg_ctlcluster >/dev/null 2>&1; then
      for c in $(ls -d /etc/postgresql/*/* 2>/dev/null); do
        pg_ctlcluster "$(basename "$(dirname "$c")")" "$(basename "$c")" stop >/dev/null 2>&1 || true
      done
    fi
    if find_bindir; then exit 0; fi
    echo "[postgres] apt-get finished but initdb/postgres are still not found" >&2
    exit 1
  fi
  echo "PostgreSQL is missing. Install it with: sudo apt-get install postgresql" >&2
  exit 1
fi

cat >&2 <<'MSG'
PostgreSQL is missing. The tests start their own PostgreSQL servers (initdb and
postgres, version 12 or newer). Install them with your package manager, for example:
  macOS:   brew install postgresql
  Fedora:  sudo dnf install postgresql-server
  Alpine:  apk add postgresql
then set LOCKWARDEN_PG_BINDIR to the directory holding initdb and postgres
if it is not where `pg_config --bindir` says.
MSG
exit 1
