//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
	"github.com/lockwarden/lockwarden/internal/manager"
)

// TestCronJobsOnTheDefaultBackend: the operator, installed as
// config/default installs it (the Helm chart's defaults pass the same
// flags), has created the ClusterLockBackend "kubernetes"; two CronJobs
// that share a lock naming it never run at the same time over two schedule
// periods, each run with a higher fencing token, and the lock's keys are
// Lease objects in the operator's namespace: no store is involved.
func TestCronJobsOnTheDefaultBackend(t *testing.T) {
	ctx := t.Context()
	var b locksv1alpha1.ClusterLockBackend
	waitFor(t, 30*time.Second, "the default ClusterLockBackend", func(ctx context.Context) (bool, error) {
		err := cluster.Client.Get(ctx, types.NamespacedName{Name: manager.DefaultClusterLockBackend}, &b)
		return err == nil, client.IgnoreNotFound(err)
	})
	if b.Spec.Kubernetes == nil {
		t.Fatalf("the default ClusterLockBackend names %+v, want the kubernetes store", b.Spec.Store)
	}

	ns := newNamespace(t, "e2e-default")
	dl := newLock(ns, "billing", "billing/ledger", "")
	dl.Spec.Backend = locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: manager.DefaultClusterLockBackend}}
	if err := cluster.Client.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the lock's BackendReady condition", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && conditionStatus(dl, locksv1alpha1.ConditionBackendReady) == metav1.ConditionTrue, err
	})
	rec := recordPods(t, ns)
	for _, name := range []string{"billing-report", "ledger-compaction"} {
		if err := cluster.Client.Create(ctx, newCronJob(ns, name, "billing", 20*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get cronjobs,jobs,pods,dlock,leases:\n%s", kubectl(t, "", "get", "cronjobs,jobs,pods,dlock", "-n", ns, "-o", "wide"))
		}
		rec.check(t)
	})
	waitFor(t, 4*time.Minute, "runs of two schedule periods", func(context.Context) (bool, error) {
		periods := map[string]bool{}
		done := rec.finished()
		for _, ru := range done {
			periods[ru.schedule] = true
		}
		return len(done) >= 4 && len(periods) >= 2, nil
	})

	// The key is a Lease in the operator's namespace.
	var leases coordinationv1.LeaseList
	if err := cluster.Client.List(ctx, &leases, client.InNamespace("lockwarden-system"), client.MatchingLabels{kubelock.LabelRole: "key"}); err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) == 0 {
		t.Fatal("no key Lease of the kubernetes store in lockwarden-system")
	}
}
