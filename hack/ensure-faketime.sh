#!/usr/bin/env bash
# ensure-faketime.sh: make sure libfaketime is installed for the clock-skew
# fault tests (internal/testutil/zktest preloads it into one server's JVM to
# set that server's wall clock off, internal/testutil/pgtest into a
# PostgreSQL server to make its clock jump). On Debian or Ubuntu, as root, it
# installs the distribution's faketime package when missing; elsewhere it
# says how. LOCKWARDEN_FAKETIME_LIB names the library when it lives elsewhere.
set -euo pipefail

libs=(
  "${LOCKWARDEN_FAKETIME_LIB:-}"
  /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
  /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1
  /usr/lib/faketime/libfaketime.so.1
)

have() {
  local lib
  for lib in "${libs[@]}"; do
    [[ -n "${lib}" && -f "${lib}" ]] && return 0
  done
  return 1
}

if have; then
  exit 0
fi

if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
  if [[ "$(id -u)" == "0" ]]; then
    echo "[faketime] libfaketime is missing: installing the faketime package with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends faketime >/dev/null
    have && exit 0
    echo "[faketime] apt-get finished but libfaketime.so.1 is still missing" >&2
    exit 1
  fi
  echo "libfaketime is missing. Install it with: sudo apt-get install --no-install-recommends faketime" >&2
  exit 1
fi
echo "libfaketime is missing: install your distribution's faketime (libfaketime) package, or set LOCKWARDEN_FAKETIME_LIB" >&2
exit 1
