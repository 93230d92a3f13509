package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// The chart is compared with config/default as the release "lockwarden" in
// the namespace "lockwarden-system": the chart's name prefix is then the
// release name, "lockwarden", and config/default's namePrefix is
// "lockwarden-", so every object has the same name both ways and the names are
// compared as they are.
const (
	driftRelease   = "lockwarden"
	driftNamespace = "lockwarden-system"
)

// TestChartMatchesConfigDefault fails when the chart's defaults and
// config/default disagree on what they install: the set of objects, the
// RBAC rules, the CRDs, the admission webhooks or the admission policy. A
// change to config/ (or to the markers `make manifests` generates it from)
// must be made to the chart too.
func TestChartMatchesConfigDefault(t *testing.T) {
	chart := index(render(t, driftRelease, driftNamespace))
	kust := index(decode(t, "config/default", run(t, "kustomize", "build", "config/default")))
	// config/default creates its namespace; the chart installs into the
	// release namespace, which `helm install --create-namespace` creates.
	delete(kust, "Namespace/"+driftNamespace)

	t.Run("objects", func(t *testing.T) {
		if diff := cmp.Diff(sortedKeys(kust), sortedKeys(chart)); diff != "" {
			t.Errorf("the chart and config/default install different objects (kind/name) (-config/default +chart):\n%s", diff)
		}
	})
	t.Run("rbac", func(t *testing.T) {
		for key, k := range kust {
			c, ok := chart[key]
			if !ok {
				continue // reported by "objects"
			}
			switch k.GetKind() {
			case "Role", "ClusterRole":
				if diff := cmp.Diff(ruleSet(t, k), ruleSet(t, c)); diff != "" {
					t.Errorf("%s: the rules differ (compared as sets) (-config/default +chart):\n%s", key, diff)
				}
			case "RoleBinding", "ClusterRoleBinding":
				for _, f := range []string{"roleRef", "subjects"} {
					if diff := cmp.Diff(k.Object[f], c.Object[f]); diff != "" {
						t.Errorf("%s: %s differs (-config/default +chart):\n%s", key, f, diff)
					}
				}
			}
		}
	})
	t.Run("crds", func(t *testing.T) {
		for key, k := range kust {
			if k.GetKind() != "CustomResourceDefinition" {
				continue
			}
			c, ok := chart[key]
			if !ok {
				continue
			}
			kb, cb := specJSON(t, k), specJSON(t, c)
			if !bytes.Equal(kb, cb) {
				t.Errorf("%s: the spec differs (-config/default +chart):\n%s", key, cmp.Diff(k.Object["spec"], c.Object["spec"]))
			}
		}
		// And the files themselves: crds/ is a copy of config/crd/bases.
		bases, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
		if err != nil || len(bases) == 0 {
			t.Fatalf("no CRDs in config/crd/bases (%v)", err)
		}
		for _, b := range bases {
			want, err := os.ReadFile(b)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(b)
			got, err := os.ReadFile(filepath.Join(root, chartDir, "crds", name))
			if err != nil {
				t.Errorf("the chart lacks a CRD of config/crd/bases: %v (copy it: cp config/crd/bases/*.yaml %s/crds/)", err, chartDir)
				continue
			}
			if !bytes.Equal(want, got) {
				t.Errorf("%s/crds/%s differs from config/crd/bases/%s: copy it again (cp config/crd/bases/*.yaml %s/crds/)", chartDir, name, name, chartDir)
			}
		}
	})
	t.Run("webhooks", func(t *testing.T) {
		for key, k := range kust {
			if kind := k.GetKind(); kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
				continue
			}
			c, ok := chart[key]
			if !ok {
				continue
			}
			// Every field of every webhook: the rules, the service and path,
			// failurePolicy, sideEffects, the selectors and match conditions.
			if diff := cmp.Diff(webhooksByName(t, k), webhooksByName(t, c)); diff != "" {
				t.Errorf("%s: the webhooks differ (-config/default +chart):\n%s", key, diff)
			}
		}
	})
	t.Run("admission policy", func(t *testing.T) {
		n := 0
		for key, k := range kust {
			if kind := k.GetKind(); kind != "ValidatingAdmissionPolicy" && kind != "ValidatingAdmissionPolicyBinding" {
				continue
			}
			n++
			c, ok := chart[key]
			if !ok {
				continue
			}
			if diff := cmp.Diff(k.Object["spec"], c.Object["spec"]); diff != "" {
				t.Errorf("%s: the spec differs (-config/default +chart):\n%s", key, diff)
			}
		}
		if n != 6 {
			t.Errorf("config/default has %d admission policy objects, want the three policies (Job gate, Pod gate, lock Leases) and their bindings", n)
		}
	})
}

// objectKey names an object by kind and name.
func objectKey(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }

// index maps objects by objectKey.
func index(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := make(map[string]*unstructured.Unstructured, len(objs))
	for _, o := range objs {
		m[objectKey(o)] = o
	}
	return m
}

func sortedKeys(m map[string]*unstructured.Unstructured) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ruleSet returns a Role's or ClusterRole's rules as a sorted set of strings,
// every list in a rule sorted: the order of rules and of their verbs or
// resources does not change what the role allows.
func ruleSet(t testing.TB, role *unstructured.Unstructured) []string {
	t.Helper()
	var r rbacv1.ClusterRole
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(role.Object, &r); err != nil {
		t.Fatalf("%s: %v", objectKey(role), err)
	}
	set := make([]string, 0, len(r.Rules))
	for _, rule := range r.Rules {
		set = append(set, fmt.Sprintf("apiGroups=%s resources=%s resourceNames=%s nonResourceURLs=%s verbs=%s",
			sorted(rule.APIGroups), sorted(rule.Resources), sorted(rule.ResourceNames), sorted(rule.NonResourceURLs), sorted(rule.Verbs)))
	}
	slices.Sort(set)
	return slices.Compact(set)
}

func sorted(s []string) string {
	s = slices.Clone(s)
	slices.Sort(s)
	for i, v := range s {
		if v == "" {
			s[i] = `""`
		}
	}
	return "[" + strings.Join(s, ",") + "]"
}

// specJSON returns an object's spec as JSON (map keys sorted).
func specJSON(t testing.TB, o *unstructured.Unstructured) []byte {
	t.Helper()
	b, err := json.Marshal(o.Object["spec"])
	if err != nil {
		t.Fatalf("%s: %v", objectKey(o), err)
	}
	return b
}

// webhooksByName returns a webhook configuration's webhooks by name.
func webhooksByName(t testing.TB, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	hooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
	if err != nil {
		t.Fatalf("%s: %v", objectKey(o), err)
	}
	m := map[string]any{}
	for _, h := range hooks {
		hm, _ := h.(map[string]any)
		name, _ := hm["name"].(string)
		m[name] = hm
	}
	return m
}

// toYAML formats an object for a failure message.
func toYAML(t testing.TB, o *unstructured.Unstructured) string {
	t.Helper()
	b, err := yaml.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
