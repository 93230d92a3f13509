#!/usr/bin/env bash
# ensure-ca-certificates.sh: make sure Debian's CA bundle,
# /etc/ssl/certs/ca-certificates.crt, exists: make image copies it into the
# manager image. On Debian or Ubuntu, as root, it installs the distribution's
# ca-certificates package when the bundle is missing; elsewhere it says how.
set -euo pipefail

bundle=/etc/ssl/certs/ca-certificates.crt

if [[ -s "$bundle" ]]; then
  exit 0
fi

if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; then
  if [[ "$(id -u)" == "0" ]]; then
    echo "[ca-certificates] $bundle is missing: installing the ca-certificates package with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null
    [[ -s "$bundle" ]] && exit 0
    echo "[ca-certificates] apt-get finished but $bundle is still missing" >&2
    exit 1
  fi
  echo "$bundle is missing. Install it with: sudo apt-get install ca-certificates" >&2
  exit 1
fi

cat >&2 <<MSG
$bundle is missing. The manager image carries Debian's CA bundle, as the
distroless base images do. Install Debian's ca-certificates package, or run
the builder with another PEM bundle:
  cd hack/image && go run . --version <version> --ca-bundle /path/to/ca-bundle.pem
MSG
exit 1
