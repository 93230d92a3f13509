package devcluster

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// renderDefault renders config/default, building bin/kustomize when it is
// missing (skipped with -short).
func renderDefault(t *testing.T) []byte {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "kustomize")); err != nil && testing.Short() {
		t.Skip("bin/kustomize is missing (make kustomize); -short does not build it")
	}
	out, err := RenderDefault(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestProductionObjects keeps what the local cluster installs from
// config/default in step with the names it runs the operator under: the
// ServiceAccount is the operator's user, every binding binds it, the
// admission policy exempts exactly that user, and nothing but RBAC and the
// policy is taken.
func TestProductionObjects(t *testing.T) {
	objs, err := ProductionObjects(renderDefault(t))
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string][]*unstructured.Unstructured{}
	for _, u := range objs {
		byKind[u.GetKind()] = append(byKind[u.GetKind()], u)
		namespaced := productionKinds[u.GroupVersionKind().GroupKind()]
		switch {
		case namespaced && u.GetNamespace() != OperatorNamespace:
			t.Errorf("%s %s is in namespace %q, want %s", u.GetKind(), u.GetName(), u.GetNamespace(), OperatorNamespace)
		case !namespaced && u.GetNamespace() != "":
			t.Errorf("cluster-scoped %s %s kept namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
		}
	}
	for _, kind := range []string{"Deployment", "Service", "CustomResourceDefinition", "MutatingWebhookConfiguration", "PodDisruptionBudget", "NetworkPolicy", "Secret", "Namespace"} {
		if len(byKind[kind]) > 0 {
			t.Errorf("ProductionObjects took a %s", kind)
		}
	}
	if sas := byKind["ServiceAccount"]; len(sas) != 1 || sas[0].GetName() != OperatorServiceAccount {
		t.Errorf("ServiceAccounts = %v, want only %s", names(sas), OperatorServiceAccount)
	}
	bindsManagerRole := false
	for _, b := range append(byKind["RoleBinding"], byKind["ClusterRoleBinding"]...) {
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if m["kind"] != "ServiceAccount" || m["name"] != OperatorServiceAccount || m["namespace"] != OperatorNamespace {
				t.Errorf("%s %s binds %v, not the operator's ServiceAccount %s/%s", b.GetKind(), b.GetName(), m, OperatorNamespace, OperatorServiceAccount)
			}
		}
		if ref, _, _ := unstructured.NestedString(b.Object, "roleRef", "name"); ref == "lockwarden-manager-role" && b.GetKind() == "ClusterRoleBinding" {
			bindsManagerRole = true
		}
	}
	if !bindsManagerRole {
		t.Error("no ClusterRoleBinding binds lockwarden-manager-role")
	}
	vaps, bindings := byKind["ValidatingAdmissionPolicy"], byKind["ValidatingAdmissionPolicyBinding"]
	want := []string{JobGatePolicy, LockLeasePolicy, PodGatePolicy}
	if !slices.Equal(names(vaps), want) || !slices.Equal(names(bindings), want) {
		t.Fatalf("admission policies %v and bindings %v, want %v each", names(vaps), names(bindings), want)
	}
	for _, vap := range vaps {
		conds, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
		exempts := false
		for _, c := range conds {
			if expr, _ := c.(map[string]any)["expression"].(string); strings.Contains(expr, "'"+OperatorUser+"'") {
				exempts = true
			}
		}
		if !exempts {
			t.Errorf("the policy %s's matchConditions %v do not exempt %s, the user the operator runs as", vap.GetName(), conds, OperatorUser)
		}
	}
}

func TestProductionObjectsNeedsThePolicy(t *testing.T) {
	rendered := []byte(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: lockwarden-controller-manager
  namespace: lockwarden-system
`)
	_, err := ProductionObjects(rendered)
	if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
		t.Fatalf("ProductionObjects without a policy = %v, want an error naming ValidatingAdmissionPolicy", err)
	}
}

func names(objs []*unstructured.Unstructured) []string {
	out := make([]string, len(objs))
	for i, u := range objs {
		out[i] = u.GetName()
	}
	return out
}
