# VERSION is the release this tree builds: the image tag, the chart's appVersion
# and the installer's image default to it.
VERSION ?= 0.1.0
# Image reference used by every target that builds, pushes or deploys the image.
IMG ?= ghcr.io/lockwarden/lockwarden:v$(VERSION)

# Go settings: everything the project needs comes from the Go module proxy.
GOBIN ?= $(shell go env GOPATH)/bin
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

# Test settings.
# TEST_TIMEOUT bounds one `go test` run of test-unit or test-integration, E2E_TIMEOUT one of
# test-e2e; GO_TEST_FLAGS adds flags to all three (for example -v or -run).
TEST_TIMEOUT ?= 20m
GO_TEST_FLAGS ?=
E2E_TIMEOUT ?= 30m
# BENCH_COUNT is how many times `make bench` runs each benchmark (benchstat needs several).
BENCH_COUNT ?= 6

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRD, RBAC and webhook manifests from the code markers (and copy the CRDs into the Helm chart).
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases
	@# The Helm chart installs the same CRDs (Helm reads them from the chart's crds/).
	cp config/crd/bases/*.yaml charts/lockwarden/crds/

.PHONY: generate
generate: controller-gen ## Generate the DeepCopy methods of the API types.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

.PHONY: api-docs
api-docs: crd-ref-docs ## Generate the API reference, docs/api.md, from the types in api/.
	$(CRD_REF_DOCS) --source-path=./api --config=hack/api-docs/config.yaml --renderer=markdown --output-path=docs/api.md --log-level=WARN

.PHONY: fmt
fmt: ## Run go fmt against code.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet against code.
	go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint (configuration in .golangci.yml) over the main module, test/ with its build tags, and bench/.
	$(GOLANGCI_LINT) run ./...
	cd bench && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...
	cd hack/image && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...

.PHONY: lint-fix
lint-fix: golangci-lint ## Run golangci-lint and apply its fixes, formatting (gofmt, goimports) included.
	$(GOLANGCI_LINT) run --fix ./...
	cd bench && $(GOLANGCI_LINT) run --config ../.golangci.yml --fix ./...
	cd hack/image && $(GOLANGCI_LINT) run --config ../../.golangci.yml --fix ./...

.PHONY: redis-server
redis-server: ## Make sure redis-server is installed (installs the Debian/Ubuntu package as root when missing).
	@hack/ensure-redis.sh

.PHONY: postgres-server
postgres-server: ## Make sure PostgreSQL's server binaries are installed (installs the Debian/Ubuntu package as root when missing).
	@hack/ensure-postgres.sh >/dev/null

.PHONY: zookeeper-server
zookeeper-server: ## Make sure ZooKeeper and a Java runtime are installed (installs the Debian/Ubuntu package as root when missing).
	@hack/ensure-zookeeper.sh

.PHONY: faketime
faketime: ## Make sure libfaketime is installed (the clock-skew fault tests fake one server's clock; installs the Debian/Ubuntu package as root when missing).
	@hack/ensure-faketime.sh

.PHONY: stores
stores: redis-server postgres-server zookeeper-server faketime ## Make sure every store the tests start is installed (etcd comes from the control-plane cache), and libfaketime for the clock-skew tests.

# BACKEND is the store `make dev` points the ClusterLockBackend dev at:
# redis (default), postgres, zookeeper or etcd (started beside Redis), or
# kubernetes (Lease objects in the local API server: nothing to start).
BACKEND ?=

.PHONY: dev
dev: redis-server ## Run a local control plane (kube-controller-manager, kwok node), Redis and the operator; REDLOCK=1 for three Redis masters, BACKEND=postgres|zookeeper|etcd|kubernetes for that store behind ClusterLockBackend dev. Ctrl-C stops it.
	@case "$(BACKEND)" in postgres) hack/ensure-postgres.sh >/dev/null ;; zookeeper) hack/ensure-zookeeper.sh ;; esac
	@go build -o bin/lockwarden-dev ./hack/dev
	@REDLOCK="$(REDLOCK)" BACKEND="$(BACKEND)" bin/lockwarden-dev

.PHONY: envtest-assets
envtest-assets: ## Print the directory of kube-apiserver and etcd for envtest, building them into the cache when missing.
	@hack/control-plane.sh

##@ Test

.PHONY: verify
verify: controller-gen crd-ref-docs golangci-lint ## Fail when regenerating (manifests, deepcopy, docs/api.md) changes a file, or formatting, go vet or golangci-lint finds anything.
	@MAKE="$(MAKE)" GOLANGCI_LINT="$(GOLANGCI_LINT)" hack/verify.sh

.PHONY: test
test: ## Run everything CI runs, in order, stopping at the first failure: verify, test-unit, test-integration, test-e2e, image-check.
	@echo "==> make test: step 1/5: verify (generated files, formatting, vet, lint, dist/install.yaml)"
	@$(MAKE) --no-print-directory verify
	@echo "==> make test: step 2/5: unit tests (go test -short)"
	@$(MAKE) --no-print-directory test-unit
	@echo "==> make test: step 3/5: integration tests (envtest kube-apiserver; real Redis, PostgreSQL, ZooKeeper, etcd; the Helm chart)"
	@$(MAKE) --no-print-directory test-integration
	@echo "==> make test: step 4/5: end-to-end tests (local control plane, kwok)"
	@$(MAKE) --no-print-directory test-e2e
	@echo "==> make test: step 5/5: the manager image (build for linux/amd64 and linux/arm64, inspect, run)"
	@$(MAKE) --no-print-directory image-check
	@echo "==> make test: all 5 steps passed"

.PHONY: test-unit
test-unit: ## Run the unit tests (go test -short): no kube-apiserver, no redis-server; the quick loop.
	go test -short ./... -count=1 -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

.PHONY: test-integration
test-integration: stores helm kustomize ## Run every suite without -short: the envtest suites (real kube-apiserver, and Kueue's manager) and those against real Redis, PostgreSQL, ZooKeeper and etcd servers.
	@# kube-controller-manager: the tenancy suites run its ClusterRole aggregation and admission-policy type checking.
	@# LOCKWARDEN_REQUIRE_SERVERS: a test whose server is missing fails here instead of skipping.
	@# LOCKWARDEN_KUEUE: Kueue's manager, for test/kueue/withkueue (hack/kueue.sh builds it once into the cache).
	LOCKWARDEN_REQUIRE_SERVERS=1 LOCKWARDEN_KUEUE="$$(hack/kueue.sh)" KUBEBUILDER_ASSETS="$$(hack/control-plane.sh kube-apiserver etcd kube-controller-manager)" go test ./... -count=1 -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

.PHONY: test-e2e
test-e2e: stores ## Run the end-to-end suite against a local control plane with kube-controller-manager and kwok.
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh --e2e)" go test -tags e2e ./test/e2e/... -count=1 -timeout $(E2E_TIMEOUT) -v $(GO_TEST_FLAGS)

# FAULT_RUNS is how many seeded runs `make test-faults` makes of each fault test
# (at least 4: some tests cover their nemeses over 4 consecutive seeds),
# FAULT_DURATION how long each run lasts at least, FAULT_SEED replays one run.
FAULT_RUNS ?= 40
FAULT_DURATION ?= 10s
FAULT_SEED ?=
FAULT_TIMEOUT ?= 90m

.PHONY: test-faults
test-faults: stores ## Run the fault tests of every store long (FAULT_RUNS runs of FAULT_DURATION each; FAULT_SEED=<seed> replays one) and print each nemesis table line.
	@mkdir -p bin
	LOCKWARDEN_REQUIRE_SERVERS=1 KUBEBUILDER_ASSETS="$$(hack/control-plane.sh kube-apiserver etcd)" \
	LOCKWARDEN_FAULT_RUNS=$(FAULT_RUNS) LOCKWARDEN_FAULT_DURATION=$(FAULT_DURATION) LOCKWARDEN_FAULT_SEED=$(FAULT_SEED) \
	go test ./internal/lock/... -run 'TestFault' -count=1 -timeout $(FAULT_TIMEOUT) -v $(GO_TEST_FLAGS) | tee bin/test-faults.log | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|nemesis table|exclusion violated|replay with'

.PHONY: test-chart
test-chart: helm kustomize ## Lint and render the Helm chart, compare it with config/default, and dry-run it and dist/install.yaml against an envtest kube-apiserver.
	LOCKWARDEN_REQUIRE_SERVERS=1 KUBEBUILDER_ASSETS="$$(hack/control-plane.sh)" go test ./test/chart/... -count=1 -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

.PHONY: perf
perf: redis-server ## Run the load harness (test/perf) on a local cluster and write bin/perf-report.md.
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh --e2e)" go test -tags perf ./test/perf/... -count=1 -timeout 90m -v $(GO_TEST_FLAGS)

.PHONY: bench
bench: redis-server benchstat ## Run the lock engine benchmarks (bench/, its own module) against lockwarden, redsync and redislock.
	mkdir -p bin
	cd bench && go test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) -timeout 30m ./... | tee ../bin/bench.txt
	$(BENCHSTAT) bin/bench.txt

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager binary into bin/lockwarden.
	go build -o bin/lockwarden ./cmd

.PHONY: kubectl-plugin
kubectl-plugin: ## Build the kubectl plugin into bin/kubectl-lockwarden (put it on the PATH: kubectl lockwarden).
	go build -ldflags "-X github.com/lockwarden/lockwarden/internal/cli.Version=v$(VERSION)" -o bin/kubectl-lockwarden ./cmd/kubectl-lockwarden

.PHONY: run
run: manifests generate fmt vet ## Run the manager from your host against the cluster in $KUBECONFIG.
	go run ./cmd

.PHONY: docker-build
docker-build: ## Build the manager image (needs a Docker engine).
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(IMAGE_REVISION) \
		--build-arg CREATED=$$(TZ=UTC git show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd $(IMAGE_REVISION)) -t ${IMG} .

.PHONY: docker-push
docker-push: ## Push the manager image.
	docker push ${IMG}

# IMAGE_REVISION is the commit make image records in the image's revision label
# and make image-check expects there; evaluated once per make run.
IMAGE_REVISION := $(shell git rev-parse HEAD 2>/dev/null)

.PHONY: image
image: ## Build the manager image for linux/amd64 and linux/arm64 without a container engine (hack/image): OCI layout bin/image/, OCI archive bin/image.tar.
	@hack/ensure-ca-certificates.sh
	cd hack/image && go run . --root ../.. --version $(VERSION) --revision "$(IMAGE_REVISION)"

.PHONY: image-push
image-push: image ## Push the image index of bin/image/ (both platforms) to $(IMG), with the credentials of your Docker config.
	cd hack/image && go run . --root ../.. --push $(IMG)

.PHONY: image-check
image-check: image ## Build the image, then inspect it (platforms, user, labels, files, static ELF binaries), run its binary, push it to an in-memory registry; and run it with podman when podman is installed.
	cd hack/image && LOCKWARDEN_IMAGE_DIR=$(CURDIR)/bin/image LOCKWARDEN_IMAGE_REVISION=$(IMAGE_REVISION) LOCKWARDEN_IMAGE_VERSION=$(VERSION) go test . -count=1 -v
	@hack/ensure-podman.sh
	hack/image/podman-check.sh bin/image.tar

##@ Deployment

ifndef ignore-not-found
  ignore-not-found = false
endif

.PHONY: install
install: manifests kustomize kubectl ## Install the CRDs into the cluster in $KUBECONFIG.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests kustomize kubectl ## Uninstall the CRDs from the cluster in $KUBECONFIG.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

# render-default prints config/default with the manager image set to $(IMG). It
# sets the image in a copy of config/, so that the tree is left unchanged.
define render-default
tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && cp -R config "$$tmp/config" && \
(cd "$$tmp/config/manager" && $(KUSTOMIZE) edit set image controller=$(IMG)) && \
$(KUSTOMIZE) build "$$tmp/config/default"
endef

.PHONY: build-installer
build-installer: manifests kustomize ## Write dist/install.yaml, everything config/default installs with the image $(IMG), in one file.
	@mkdir -p dist
	@( $(render-default) ) > dist/install.yaml.tmp && mv dist/install.yaml.tmp dist/install.yaml

.PHONY: deploy
deploy: manifests kustomize kubectl ## Deploy the operator to the cluster in $KUBECONFIG.
	( $(render-default) ) | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: kustomize kubectl ## Remove the operator from the cluster in $KUBECONFIG.
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

##@ Dependencies

## Location to install tools to
LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

## Tool binaries
KUBECTL ?= $(LOCALBIN)/kubectl
KUSTOMIZE ?= $(LOCALBIN)/kustomize
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
CRD_REF_DOCS ?= $(LOCALBIN)/crd-ref-docs
BENCHSTAT ?= $(LOCALBIN)/benchstat
HELM ?= $(LOCALBIN)/helm

## Tool versions
KUSTOMIZE_VERSION ?= v5.8.1
CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
CRD_REF_DOCS_VERSION ?= v0.3.0
# golang.org/x/perf has no tags: a pseudo-version the module proxy serves.
BENCHSTAT_VERSION ?= v0.0.0-20260908200009-22c9c6c9d4da
HELM_VERSION ?= v3.22.0

.PHONY: kubectl
kubectl: $(KUBECTL) ## Build kubectl of the pinned Kubernetes version into the control-plane cache and link it into bin/.
$(KUBECTL): $(LOCALBIN)
	ln -sf "$$(hack/control-plane.sh kubectl)/kubectl" $(KUBECTL)

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Download kustomize locally if necessary.
$(KUSTOMIZE): $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Download controller-gen locally if necessary.
$(CONTROLLER_GEN): $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Download golangci-lint locally if necessary.
$(GOLANGCI_LINT): $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

.PHONY: benchstat
benchstat: $(BENCHSTAT) ## Download benchstat locally if necessary.
$(BENCHSTAT): $(LOCALBIN)
	$(call go-install-tool,$(BENCHSTAT),golang.org/x/perf/cmd/benchstat,$(BENCHSTAT_VERSION))

.PHONY: helm
helm: $(HELM) ## Build helm of the pinned version locally if necessary.
$(HELM): $(LOCALBIN)
	$(call go-install-tool,$(HELM),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))

.PHONY: crd-ref-docs
crd-ref-docs: $(CRD_REF_DOCS) ## Download crd-ref-docs locally if necessary.
$(CRD_REF_DOCS): $(LOCALBIN)
	$(call go-install-tool,$(CRD_REF_DOCS),github.com/elastic/crd-ref-docs,$(CRD_REF_DOCS_VERSION))

# go-install-tool will 'go install' any package with custom target and name of binary, if it doesn't exist
# $1 - target path with name of binary
# $2 - package url which can be installed
# $3 - specific version of package
define go-install-tool
@[ -f "$(1)-$(3)" ] && [ "$$(readlink -- "$(1)" 2>/dev/null)" = "$(1)-$(3)" ] || { \
set -e; \
package=$(2)@$(3) ;\
echo "Downloading $${package}" ;\
rm -f $(1) ;\
GOBIN=$(LOCALBIN) GOTOOLCHAIN=local go install $${package} ;\
mv $(1) $(1)-$(3) ;\
} ;\
ln -sf $$(realpath $(1)-$(3)) $(1)
endef
