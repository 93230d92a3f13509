#!/usr/bin/env bash
# verify.sh: the checks of `make verify`. Run it through make, which builds the
# pinned tools into bin/ first and passes MAKE and GOLANGCI_LINT.
#
#   1. generated files: regenerate the CRDs, RBAC and webhook manifests, the
#      deepcopy code and docs/api.md, and fail when that changed any of them;
#   2. formatting: gofmt and goimports (as configured in .golangci.yml);
#   3. go vet: the main module, test/e2e and test/perf with their build tags,
#      and bench/ and hack/image/ (their own modules);
#   4. golangci-lint: the same code;
#   5. the one-file installer: dist/install.yaml is what `make build-installer`
#      renders from config/ with the default IMG.
#
# Every step runs even when an earlier one failed, so one run reports everything;
# the exit status is non-zero when any step failed.
#
# Step 1 compares the tree before and after regenerating (tracked and untracked
# files alike), not the tree against HEAD: on a clean checkout, as in CI, that is
# `git diff --exit-code` plus untracked files; on a checkout with edits in
# progress it blames only what the generators changed. The regenerated files
# are left in place, ready to review and commit.
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE="${MAKE:-make}"
GOLANGCI_LINT="${GOLANGCI_LINT:-bin/golangci-lint}"
[[ "$GOLANGCI_LINT" == /* ]] || GOLANGCI_LINT="$PWD/$GOLANGCI_LINT"

# What the generators write: manifests under config/ (and the CRDs' copies in
# the Helm chart), deepcopy code next to the types, the API reference.
generated=(config charts/lockwarden/crds docs/api.md ':(glob)**/zz_generated.*.go')

steps=5
failed=()

banner() { printf '==> make verify: step %s/%s: %s\n' "$1" "$steps" "$2"; }

# snapshot prints the tree object of the working tree as it is now, tracked and
# untracked (but not ignored) files alike, through a private index so that the
# real index and the stash stay untouched.
snapshot() {
  local index
  index="$(mktemp -d)/index"
  cp "$(git rev-parse --git-path index)" "$index" 2>/dev/null || true
  GIT_INDEX_FILE="$index" git add -A -- "${generated[@]}" &&
    GIT_INDEX_FILE="$index" git write-tree
  local rc=$?
  rm -rf "$(dirname "$index")"
  return $rc
}

# 1. Generated files.
banner 1 "generated files are up to date (make manifests generate api-docs)"
if ! before="$(snapshot)"; then
  failed+=("generated files (could not snapshot the tree)")
elif ! "$MAKE" --no-print-directory -s manifests generate api-docs; then
  failed+=("generated files (a generator failed)")
elif ! after="$(snapshot)"; then
  failed+=("generated files (could not snapshot the tree)")
elif ! git diff --quiet "$before" "$after" -- "${generated[@]}"; then
  cat <<'EOF'

ERROR: generated files were out of date. Regenerating them changed the files
below; the fresh versions are now in your tree. Review them and commit them
with the change that made them stale (`make manifests generate api-docs`
produces them).

EOF
  git --no-pager diff --stat "$before" "$after" -- "${generated[@]}"
  echo
  git --no-pager diff "$before" "$after" -- "${generated[@]}"
  failed+=("generated files")
else
  echo "Generated files are up to date."
fi

# 2. Formatting, checked without rewriting anything (`make lint-fix` fixes it).
banner 2 "formatting (gofmt, goimports)"
# fmt walks the directory tree, not Go modules: ./... takes in bench/ and the
# files behind build tags too.
if "$GOLANGCI_LINT" fmt --diff ./...; then
  echo "Formatting is clean."
else
  printf '\nERROR: the files above are not formatted; `make lint-fix` formats them.\n'
  failed+=("formatting")
fi

# 3. go vet.
banner 3 "go vet (main module, test/e2e and test/perf with their tags, bench/, hack/image/)"
vet_ok=true
go vet ./... || vet_ok=false
go vet -tags e2e ./test/e2e/... || vet_ok=false
go vet -tags perf ./test/perf/... || vet_ok=false
(cd bench && go vet ./...) || vet_ok=false
(cd hack/image && go vet ./...) || vet_ok=false
if $vet_ok; then echo "go vet is clean."; else failed+=("go vet"); fi

# 4. golangci-lint.
banner 4 "golangci-lint (main module with the e2e and perf tags, bench/, hack/image/)"
if "$MAKE" --no-print-directory -s lint; then
  echo "golangci-lint is clean."
else
  failed+=("golangci-lint")
fi

# 5. The one-file installer. Rendered with the Makefile's default IMG (an IMG
# or VERSION in the environment would override it), in place, like step 1.
banner 5 "dist/install.yaml is up to date with config/ (make build-installer)"
installer_before="$(mktemp)"
cp dist/install.yaml "$installer_before" 2>/dev/null || : >"$installer_before"
if ! env -u IMG -u VERSION "$MAKE" --no-print-directory -s build-installer; then
  failed+=("dist/install.yaml (make build-installer failed)")
elif ! diff -u --label "dist/install.yaml (before)" --label "dist/install.yaml (rendered)" \
  "$installer_before" dist/install.yaml; then
  cat <<'EOF'

ERROR: dist/install.yaml was out of date with config/ (diff above). The fresh
version is now in your tree: commit it with the change to config/ that made it
stale (`make build-installer` renders it).
EOF
  failed+=("dist/install.yaml")
else
  echo "dist/install.yaml is up to date."
fi
rm -f "$installer_before"

if [[ ${#failed[@]} -gt 0 ]]; then
  printf '\n==> make verify FAILED: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
  exit 1
fi
printf '\n==> make verify: all checks passed\n'
