#!/usr/bin/env bash
# podman-check.sh ARCHIVE: run the manager image from the OCI archive ARCHIVE
# (bin/image.tar) with podman, as a user of the image would: --help must exit 0
# and show the flags, a bad flag must exit non-zero and name the flag. The
# image runs as its own user (65532) from an empty filesystem, so this also
# shows that the entrypoint exists and that user may run it.
#
# Optional: without podman it says so and succeeds. When podman is installed
# but cannot start any container on this machine (rlimits or cgroups it may
# not set, as in some sandboxes), it prints podman's error and succeeds too:
# that is no fault of the image. Everything else fails.
#
#   PODMAN            the podman command and its global flags (default: podman),
#                     for example "podman --runtime runc"
#   PODMAN_RUN_FLAGS  extra flags of podman run, for example
#                     "--ulimit nofile=1024:1024 --ulimit nproc=1000:1000"
set -euo pipefail

archive="${1:?usage: podman-check.sh bin/image.tar}"
PODMAN="${PODMAN:-podman}"
PODMAN_RUN_FLAGS="${PODMAN_RUN_FLAGS:-}"

if ! command -v "${PODMAN%% *}" >/dev/null 2>&1; then
  echo "[podman] podman is not installed: not running the image with podman (optional)"
  exit 0
fi
if [[ ! -f "$archive" ]]; then
  echo "[podman] $archive does not exist: run make image" >&2
  exit 1
fi

# Errors of the container runtime that say this machine cannot run
# containers at all, whatever the image.
environment_errors='setrlimit|setting rlimit|cgroups in hybrid mode|cannot set up namespace|newuidmap'

run() {
  # shellcheck disable=SC2086 # PODMAN and PODMAN_RUN_FLAGS are word lists.
  $PODMAN run --rm --network none $PODMAN_RUN_FLAGS "oci-archive:$archive" "$@" 2>&1 |
    grep -vE '^(Getting image source signatures|Copying (blob|config)|Writing manifest|Storing signatures)'
}

set +e
help_out="$(run --help)"
help_rc=$?
set -e
# Sandboxes that refuse podman's defaults (crun setting rlimits, cgroups in
# hybrid mode) often run containers with runc and rlimits it may keep: try
# that once, unless the caller chose the flags.
if [[ $help_rc -ne 0 ]] && grep -qE "$environment_errors" <<<"$help_out" &&
  [[ "$PODMAN" == podman && -z "$PODMAN_RUN_FLAGS" ]] && command -v runc >/dev/null 2>&1; then
  echo "[podman] podman's defaults cannot start containers here; trying runc with fixed rlimits"
  PODMAN="podman --runtime runc"
  PODMAN_RUN_FLAGS="--ulimit nofile=20000:20000 --ulimit nproc=1000:1000"
  set +e
  help_out="$(run --help)"
  help_rc=$?
  set -e
fi
if [[ $help_rc -ne 0 ]] && grep -qE "$environment_errors" <<<"$help_out"; then
  echo "[podman] podman cannot start containers here; not running the image with podman (optional):"
  echo "$help_out" | sed 's/^/[podman]   /'
  echo "[podman] set PODMAN and PODMAN_RUN_FLAGS to run it anyway (see docs/image.md)"
  exit 0
fi
echo "[podman] $PODMAN run oci-archive:$archive --help: exit $help_rc"
echo "$help_out" | head -n 4 | sed 's/^/[podman]   /'
if [[ $help_rc -ne 0 ]]; then
  echo "[podman] FAIL: --help exited $help_rc, want 0; output:" >&2
  echo "$help_out" >&2
  exit 1
fi
if ! grep -q -- '-leader-elect' <<<"$help_out"; then
  echo "[podman] FAIL: --help does not mention -leader-elect" >&2
  exit 1
fi

set +e
bad_out="$(run --no-such-flag)"
bad_rc=$?
set -e
echo "[podman] $PODMAN run oci-archive:$archive --no-such-flag: exit $bad_rc"
grep -- 'no-such-flag' <<<"$bad_out" | sed 's/^/[podman]   /' || true
if [[ $bad_rc -eq 0 ]] || ! grep -q 'flag provided but not defined: -no-such-flag' <<<"$bad_out"; then
  echo "[podman] FAIL: --no-such-flag exited $bad_rc, want non-zero with an error naming the flag; output:" >&2
  echo "$bad_out" >&2
  exit 1
fi
echo "[podman] ok"
