#!/usr/bin/env bash
# ensure-podman.sh: best effort to have podman (and runc, which sandboxes that
# refuse crun's defaults can still use) for make image-check, which runs the
# manager image with it. On Debian or Ubuntu, as root, it installs the
# distribution's podman and runc packages when podman is missing. Running the
# image with podman is optional: this script never fails, it only says why
# podman is not there.
set -uo pipefail

if command -v podman >/dev/null 2>&1; then
  exit 0
fi
if [[ "${LOCKWARDEN_NO_PODMAN:-}" == 1 ]]; then
  exit 0
fi
if [[ -r /etc/os-release ]] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release && [[ "$(id -u)" == "0" ]]; then
  echo "[podman] podman is missing: installing the podman and runc packages with apt-get (LOCKWARDEN_NO_PODMAN=1 skips this)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq --no-install-recommends podman runc >/dev/null; then
    exit 0
  fi
  echo "[podman] apt-get could not install podman: the image is checked without running it in a container" >&2
  exit 0
fi
echo "[podman] podman is not installed: the image is checked without running it in a container (install podman to run it)" >&2
exit 0
