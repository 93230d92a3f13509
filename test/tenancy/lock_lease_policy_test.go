package tenancy

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeclient "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/lock"
	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// deniedByLeasePolicy reports whether err is the lock-leases policy's refusal.
func deniedByLeasePolicy(err error) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+tenancytest.LockLeasePolicyName+"'")
}

// TestOnlyTheOperatorWritesLockLeases: the operator, with config/rbac's
// permissions, holds a lock on the kubernetes store in its namespace; an
// administrator (all RBAC permissions) can neither delete, edit nor forge
// the store's Leases, which would free the lock or start its fencing tokens
// again, while Leases without the store's label (leader election) stay
// theirs to write.
func TestOnlyTheOperatorWritesLockLeases(t *testing.T) {
	admin := adminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, _, err := tenancytest.User(env, operatorUser, tenancytest.OperatorGroups...)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := kubelock.New(kubelock.Config{Client: cs, Namespace: tenancytest.OperatorNamespace, Prefix: "tenancy"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"ns/tenant-a/billing"}, TTL: time.Minute, Holder: "operator"})
	if err != nil {
		t.Fatalf("the operator cannot take a lock on the kubernetes store with config/rbac's permissions: %v", err)
	}

	var leases coordinationv1.LeaseList
	if err := admin.List(ctx, &leases, client.InNamespace(tenancytest.OperatorNamespace), client.HasLabels{kubelock.LabelStore}); err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) != 2 {
		t.Fatalf("%d Leases of the store, want the key's and the session's", len(leases.Items))
	}
	for _, le := range leases.Items {
		if err := admin.Delete(ctx, &le); !deniedByLeasePolicy(err) {
			t.Errorf("an administrator deleting Lease %s (%s): %v, want the lock-leases policy's refusal", le.Name, le.Labels[kubelock.LabelRole], err)
		}
		edited := le.DeepCopy()
		edited.Annotations[kubelock.AnnotationState] = `{"key":"ns/tenant-a/billing","fence":0}`
		if err := admin.Update(ctx, edited); !deniedByLeasePolicy(err) {
			t.Errorf("an administrator editing Lease %s: %v, want the lock-leases policy's refusal", le.Name, err)
		}
	}
	forged := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lw-forged", Namespace: tenancytest.OperatorNamespace, Labels: map[string]string{kubelock.LabelStore: "x"}}}
	if err := admin.Create(ctx, forged); !deniedByLeasePolicy(err) {
		t.Errorf("an administrator creating a Lease with the store's label: %v, want the policy's refusal", err)
	}
	plain := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "not-a-lock", Namespace: tenancytest.OperatorNamespace}}
	if err := admin.Create(ctx, plain); err != nil {
		t.Errorf("a Lease without the store's label: %v, want it allowed", err)
	} else if err := admin.Delete(ctx, plain); err != nil {
		t.Errorf("deleting a Lease without the store's label: %v", err)
	}

	// The lock is untouched: the operator still holds it, renews and releases it.
	if _, err := l.Renew(ctx, lease, time.Minute); err != nil {
		t.Fatalf("Renew after the refused writes: %v", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
