#!/usr/bin/env bash
# ensure-zookeeper.sh: make sure the Apache ZooKeeper server jars and a Java
# runtime are installed for the tests (internal/testutil/zktest starts the
# servers itself with java and /usr/share/java/zookeeper.jar). On Debian or
# Ubuntu, as root, it installs the distribution's zookeeper package (which
# brings its Java runtime) when missing; elsewhere it says how.
set -euo pipefail

jars="${LOCKWARDEN_ZOOKEEPER_CLASSPATH:-/usr/share/java/zookeeper.jar}"
java="${LOCKWARDEN_JAVA:-$(command -v java || true)}"

have() {
  [[ -n "${java}" && -x "${java}" ]] || return 1
  local jar
  IFS=: read -r -a parts <<<"${jars}"
  for jar in "${parts[@]}"; do
    [[ -e "${jar}" ]] || return 1
  done
}

if have; then
  exit 0
fi

if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
  if [[ "$(id -u)" == "0" ]]; then
    echo "[zookeeper] ZooKeeper or Java is missing: installing the zookeeper package with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends zookeeper >/dev/null
    # The package may start a system service; the tests never use it (they
    # start their own servers on free ports), so stop it if it runs.
    if command -v service >/dev/null 2>&1; then service zookeeper stop >/dev/null 2>&1 || true; fi
    if command -v systemctl >/dev/null 2>&1; then systemctl stop zookeeper >/dev/null 2>&1 || true; fi
    java="${LOCKWARDEN_JAVA:-$(command -v java || true)}"
    have && exit 0
    echo "[zookeeper] apt-get finished but java or ${jars} is still missing" >&2
    exit 1
  fi
  echo "ZooKeeper or Java is missing. Install it with: sudo apt-get install --no-install-recommends zookeeper" >&2
  exit 1
fi

cat >&2 <<'MSG'
ZooKeeper or Java is missing. The tests start their own ZooKeeper servers (3.5 or newer)
with java and the server jars. Install them with your package manager, for example:
  macOS:   brew install zookeeper
  Fedora:  sudo dnf install zookeeper
then point LOCKWARDEN_JAVA at a java binary and LOCKWARDEN_ZOOKEEPER_CLASSPATH at
the server's jars (colon-separated, e.g. "$(ls /path/to/zookeeper/lib/*.jar | paste -sd:)").
MSG
exit 1
