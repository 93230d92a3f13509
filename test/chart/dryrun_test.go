package chart

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// renderOnly are the API groups whose CRDs the envtest API server does not
// have: the Prometheus Operator's (ServiceMonitor) and cert-manager's
// (Certificate, Issuer). Their objects are checked by rendering only
// (TestRender); nothing here would validate them.
var renderOnly = map[string]bool{
	"monitoring.coreos.com": true,
	"cert-manager.io":       true,
}

// TestChartDryRun applies the rendered chart to the API server, for each value
// set: the CRDs for real first, the release namespace for real, and every
// other object with server-side apply in dry-run mode, so that the API server
// validates them all (schemas, defaulting, the admission policy's CEL) and
// nothing is left behind.
func TestChartDryRun(t *testing.T) {
	for name, vs := range valueSets {
		t.Run(name, func(t *testing.T) {
			objs := render(t, releaseName, releaseNamespace, vs.set...)
			createNamespace(t, releaseNamespace)
			dryRun(t, objs)
		})
	}
}

// TestInstallerDryRun does the same for dist/install.yaml, whose Namespace is
// created for real.
func TestInstallerDryRun(t *testing.T) {
	needEnv(t)
	b, err := os.ReadFile(filepath.Join(root, "dist", "install.yaml"))
	if err != nil {
		t.Fatalf("read the installer: %v (make build-installer writes it)", err)
	}
	dryRun(t, decode(t, "dist/install.yaml", b))
}

// dryRun applies objs: CRDs and Namespaces for real, the rest in dry-run mode.
func dryRun(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "CustomResourceDefinition":
			if err := apply(ctx, o); err != nil {
				t.Fatalf("apply %s: %v", objectKey(o), err)
			}
		case o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1":
			if err := apply(ctx, o); err != nil {
				t.Fatalf("apply %s: %v", objectKey(o), err)
			}
		default:
			rest = append(rest, o)
		}
	}
	applied := 0
	for _, o := range rest {
		if renderOnly[o.GroupVersionKind().Group] {
			continue
		}
		if err := apply(ctx, o, client.DryRunAll); err != nil {
			t.Errorf("server-side apply (dry run) %s: %v", objectKey(o), err)
			continue
		}
		applied++
	}
	// The dry run must have checked the manager and its webhook at least.
	if applied < 10 {
		t.Errorf("only %d objects were applied in dry-run mode: the render lost most of the chart", applied)
	}
}
