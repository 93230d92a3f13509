package backend

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestWorkloadKeysStayInTheLocksScope: whatever key a workload's labels
// produce, a Namespace lock's derived key is under its namespace's prefix,
// where the lock finds it again (LaneKey, ScopePrefix).
func TestWorkloadKeysStayInTheLocksScope(t *testing.T) {
	dl := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "deploys", Namespace: "team-a"},
		Spec: locksv1alpha1.DistributedLockSpec{KeyFrom: &locksv1alpha1.KeyFrom{Expression: "x"}}}
	for _, key := range []string{"deploy/prod", "ns/team-b/billing", "global/billing"} {
		keys, err := WorkloadKeys(dl, map[string]string{locksv1alpha1.AnnotationKey: key})
		if err != nil || len(keys) != 1 || !strings.HasPrefix(keys[0], "ns/team-a/") {
			t.Fatalf("WorkloadKeys(%q) = %v, %v; want one key under ns/team-a/", key, keys, err)
		}
		if p, ok := ScopePrefix(keys[0]); !ok || p != "ns/team-a/" {
			t.Errorf("ScopePrefix(%q) = %q, %v", keys[0], p, ok)
		}
		if k, ok := LaneKey(dl, keys[0]); !ok || k != key {
			t.Errorf("LaneKey(%q) = %q, %v; want %q", keys[0], k, ok, key)
		}
	}
	for _, bad := range []string{"", "../x", "a b"} {
		if keys, err := WorkloadKeys(dl, map[string]string{locksv1alpha1.AnnotationKey: bad}); err == nil {
			t.Errorf("WorkloadKeys(%q) = %v, want an error", bad, keys)
		}
	}
	if _, err := WorkloadKeys(dl, nil); err == nil || !strings.Contains(err.Error(), "no lockwarden.io/key annotation") {
		t.Errorf("a workload admitted before keyFrom: %v", err)
	}
	dl.Spec.KeyFrom, dl.Spec.Keys = nil, []string{"billing"}
	if keys, _ := WorkloadKeys(dl, map[string]string{locksv1alpha1.AnnotationKey: "other"}); len(keys) != 1 || keys[0] != "ns/team-a/billing" {
		t.Errorf("a lock with fixed keys: %v, want its own key whatever the annotation says", keys)
	}
}
