#!/usr/bin/env bash
# kueue.sh: print the path of Kueue's manager binary (sigs.k8s.io/kueue/cmd/kueue),
# building and caching it when it is missing.
#
# Usage: hack/kueue.sh
#
# The binary lives outside the checkout, in $LOCKWARDEN_ASSETS_DIR or
# <user cache dir>/lockwarden/kueue/<version>-<os>-<arch>, so that every clone on
# this machine reuses it. Kueue's go.mod has no replace directives, so
# `go install <module>@<version>` builds it from the Go module proxy (a few
# minutes cold on two cores; progress goes to stderr).
#
# The path is the only thing printed on stdout:
#   export LOCKWARDEN_KUEUE="$(hack/kueue.sh)"
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"

log() { printf '[kueue] %s\n' "$*" >&2; }

goos="$(go env GOOS)"
goarch="$(go env GOARCH)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
dir="${LOCKWARDEN_ASSETS_DIR:-$cache_root/lockwarden/kueue/$KUEUE_VERSION-$goos-$goarch}"
mkdir -p "$dir"

if [[ -x "$dir/kueue" ]]; then
  printf '%s\n' "$dir/kueue"
  exit 0
fi

# One builder at a time per cache directory; a second caller waits, then reuses.
exec 9>"$dir/.lock"
if ! flock -n 9; then
  log "another build is filling $dir; waiting for it"
  flock 9
fi
if [[ ! -x "$dir/kueue" ]]; then
  log "building Kueue $KUEUE_VERSION from the Go module proxy"
  SECONDS=0
  mkdir -p "$dir/.build"
  CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOBIN="$dir/.build" \
    go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  mv "$dir/.build/kueue" "$dir/kueue"
  log "built Kueue in $((SECONDS / 60))m$((SECONDS % 60))s"
fi
printf '%s\n' "$dir/kueue"
