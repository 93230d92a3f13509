// Package chart checks the two ways of installing lockwarden that are not
// config/default itself: the Helm chart (charts/lockwarden) and the one-file
// installer (dist/install.yaml). It
//
//   - lints the chart (helm lint --strict) and renders it with its default
//     values and with each of its switches (cert-manager, serviceMonitor,
//     networkPolicy);
//   - applies what it renders, and dist/install.yaml, to a real kube-apiserver
//     (envtest) with server-side apply in dry-run mode: the API server
//     validates every object (schemas, CEL of the admission policy, webhook
//     configurations) without running anything;
//   - compares the chart with config/default (kustomize build): the objects,
//     the RBAC rules, the CRDs, the webhooks and the admission policy, so that
//     a change to config/ that the chart does not follow fails here.
//
// The chart and kustomize come from bin/ (`make test-chart` builds them). Under
// -short every test skips; when bin/helm or bin/kustomize is missing a test
// skips, or fails when LOCKWARDEN_REQUIRE_SERVERS is set (CI must not pass
// silently).
package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// fieldOwner is the server-side apply field manager of every apply here.
const fieldOwner = "lockwarden-chart-test"

// env is the control plane; nil under -short.
var env *kubetest.Env

// root is the module root: charts/, config/, dist/ and bin/ are under it.
var root string

func TestMain(m *testing.M) {
	r, err := kubetest.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "find the module root:", err)
		os.Exit(1)
	}
	root = r
	kubetest.MainEnv(m, "chart", func(e *kubetest.Env) (func(), error) {
		env = e
		return nil, nil
	})
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}

// tool returns the path of bin/<name>. When it is missing the test skips,
// or fails when LOCKWARDEN_REQUIRE_SERVERS is set.
func tool(t testing.TB, name string) string {
	t.Helper()
	needEnv(t)
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
			t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but %s is missing (%v): run `make %s` or `make test-chart`", p, err, name)
		}
		t.Skipf("%s is missing: run `make %s` (or `make test-chart`, which builds it)", p, name)
	}
	return p
}

// run runs a tool from the module root and returns its standard output; it
// fails the test with the tool's output when the tool fails.
func run(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(t, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runErr is run that returns the failure (with the tool's output) instead.
func runErr(t testing.TB, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool(t, name), args...)
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bin/%s %q: %w\n%s%s", name, args, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

// decode splits a multi-document YAML stream into objects.
func decode(t testing.TB, what string, b []byte) []*unstructured.Unstructured {
	t.Helper()
	f := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadManifests(f)
	if err != nil {
		t.Fatalf("parse %s: %v", what, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s has no objects", what)
	}
	return objs
}

// createNamespace creates a namespace for real, unless it exists.
func createNamespace(t testing.TB, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// apply applies one object with server-side apply; opts add client.DryRunAll.
func apply(ctx context.Context, u *unstructured.Unstructured, opts ...client.ApplyOption) error {
	opts = append(opts, client.FieldOwner(fieldOwner), client.ForceOwnership)
	return env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...)
}
