#!/usr/bin/env bash
# control-plane.sh: print a directory that holds the control-plane binaries the
# tests need, building and caching them when they are missing.
#
# Usage: hack/control-plane.sh [--e2e] [BINARY...]
#
#   (default)  kube-apiserver and etcd, for envtest (make test).
#   --e2e      also kube-controller-manager, kube-scheduler, kubectl and kwok (make test-e2e, make dev).
#   BINARY     exactly these (kube-apiserver, etcd, kube-controller-manager,
#              kube-scheduler, kubectl, kwok).
#
# Resolution order:
#   1. $KUBEBUILDER_ASSETS, when it already holds every binary asked for;
#   2. the cache, $LOCKWARDEN_ASSETS_DIR or <user cache dir>/lockwarden/control-plane/<versions>,
#      which lives outside the checkout so that every clone on this machine reuses it;
#   3. a build from the Go module proxy into that cache (kube-apiserver takes over
#      ten minutes cold on two cores; progress goes to stderr).
#
# The directory is the only thing printed on stdout, so callers can write
#   export KUBEBUILDER_ASSETS="$(hack/control-plane.sh)"
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"

want=()
for arg in "$@"; do
  case "$arg" in
    --e2e) want+=(kube-apiserver etcd kube-controller-manager kube-scheduler kubectl kwok) ;;
    kube-apiserver|etcd|kube-controller-manager|kube-scheduler|kubectl|kwok) want+=("$arg") ;;
    *) echo "control-plane.sh: unknown argument $arg (want --e2e or one of kube-apiserver etcd kube-controller-manager kube-scheduler kubectl kwok)" >&2; exit 2 ;;
  esac
done
[[ ${#want[@]} -gt 0 ]] || want=(kube-apiserver etcd)

log() { printf '[control-plane] %s\n' "$*" >&2; }

has_all() {
  local dir="$1" b
  [[ -n "$dir" && -d "$dir" ]] || return 1
  for b in "${want[@]}"; do
    [[ -x "$dir/$b" ]] || return 1
  done
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && has_all "$KUBEBUILDER_ASSETS"; then
  printf '%s\n' "$KUBEBUILDER_ASSETS"
  exit 0
fi

goos="$(go env GOOS)"
goarch="$(go env GOARCH)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
dir="${LOCKWARDEN_ASSETS_DIR:-$cache_root/lockwarden/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$goos-$goarch}"
mkdir -p "$dir"

if has_all "$dir"; then
  printf '%s\n' "$dir"
  exit 0
fi

# One builder at a time per cache directory; a second caller waits, then reuses.
exec 9>"$dir/.lock"
if ! flock -n 9; then
  log "another build is filling $dir; waiting for it"
  flock 9
fi

work="$dir/.build"
mkdir -p "$work/out"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

elapsed() { local s=$SECONDS; printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# Run a long build and print a heartbeat every 30 s so the terminal does not look hung.
run_with_heartbeat() {
  local what="$1"; shift
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 1 30); do
      sleep 1
      kill -0 "$pid" 2>/dev/null || break
    done
    kill -0 "$pid" 2>/dev/null && log "  still building $what ($(elapsed) elapsed)"
  done
  wait "$pid"
}

k8s_module() {
  local mod="$work/mod-kubernetes"
  if [[ -f "$mod/go.mod" ]]; then return; fi
  log "preparing a wrapper module for k8s.io/kubernetes $K8S_VERSION"
  mkdir -p "$mod.tmp"
  local gomod
  gomod="$(cd "$mod.tmp" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
  [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  local staging_version="v0.${K8S_VERSION#v1.}"
  {
    echo "module lockwarden.local/control-plane"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # k8s.io/kubernetes replaces each staging module with ./staging/src/k8s.io/<name>;
    # outside its repository the released v0.X.Y of each stands in.
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*$#\1#p' "$gomod" | while read -r m; do
      echo "	$m => $m $staging_version"
    done
    echo ")"
  } >"$mod.tmp/go.mod"
  mv "$mod.tmp" "$mod"
}

k8s_ldflags() {
  local v="$K8S_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean -X %s.buildDate=%s ' \
      "$p" "$v" "$p" "$major" "$p" "$minor" "$p" "$date"
  done
  printf -- '-s -w'
}

build_k8s() {
  local name="$1"
  k8s_module
  log "building $name $K8S_VERSION from the Go module proxy (cold: about ten minutes on two cores)"
  SECONDS=0
  (cd "$work/mod-kubernetes" && run_with_heartbeat "$name" go build -trimpath -ldflags "$(k8s_ldflags)" -o "$work/out/$name" "k8s.io/kubernetes/cmd/$name")
  mv "$work/out/$name" "$dir/$name"
  log "built $name in $(elapsed)"
}

build_etcd() {
  local mod="$work/mod-etcd"
  mkdir -p "$mod"
  if [[ ! -f "$mod/go.mod" ]]; then
    printf 'module lockwarden.local/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
      "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" "$ETCD_VERSION" >"$mod/go.mod"
  fi
  log "building etcd $ETCD_VERSION from the Go module proxy (cold: about two minutes)"
  SECONDS=0
  (cd "$mod" && run_with_heartbeat etcd go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3)
  mv "$work/out/etcd" "$dir/etcd"
  log "built etcd in $(elapsed)"
}

build_kwok() {
  log "building kwok $KWOK_VERSION from the Go module proxy (cold: about six minutes)"
  SECONDS=0
  GOBIN="$work/out" run_with_heartbeat kwok go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$work/out/kwok" "$dir/kwok"
  # kwok needs Stage definitions to run pods; the module ships them.
  local src
  src="$(GOFLAGS= go list -m -f '{{.Dir}}' "sigs.k8s.io/kwok@$KWOK_VERSION" 2>/dev/null || true)"
  if [[ -z "$src" ]]; then
    src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"
  fi
  rm -rf "$dir/kwok-stages"
  mkdir -p "$dir/kwok-stages"
  cp -r "$src/kustomize/stage/." "$dir/kwok-stages/"
  chmod -R u+w "$dir/kwok-stages"
  log "built kwok in $(elapsed)"
}

for b in "${want[@]}"; do
  [[ -x "$dir/$b" ]] && continue
  case "$b" in
    etcd) build_etcd ;;
    kwok) build_kwok ;;
    *) build_k8s "$b" ;;
  esac
done

has_all "$dir" || { log "some binaries are still missing in $dir"; exit 1; }
printf '%s\n' "$dir"
