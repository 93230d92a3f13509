// Package defaultbackend runs the manager with its default flags against a
// control plane where no lock store runs at all, as a fresh install is. It
// is a package of its own: a process runs one manager (controller names
// are unique per process).
package defaultbackend

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
	"github.com/lockwarden/lockwarden/internal/manager"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
)

// waitFor polls cond every 50ms for up to 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestDefaultBackendGatesJobsWithNoStore: a manager started with its
// default flags creates the ClusterLockBackend "kubernetes", and a lock that
// names it gates two Jobs one after the other, with rising fencing tokens,
// though no store runs anywhere: the locks are Lease objects in the
// manager's namespace.
func TestDefaultBackendGatesJobsWithNoStore(t *testing.T) {
	env := kubetest.Start(t, kubetest.WithWebhooks())
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	if err := managertest.Start(ctx, env, env.Config, []string{"--leader-elect", "--leader-election-namespace", "default"}, stopped); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("manager stopped with %v", err)
		}
	})

	var b locksv1alpha1.ClusterLockBackend
	waitFor(t, "the default ClusterLockBackend", func() bool {
		return env.Client.Get(ctx, types.NamespacedName{Name: manager.DefaultClusterLockBackend}, &b) == nil
	})
	if b.Spec.Kubernetes == nil || b.Spec.NamespaceSelector == nil || len(b.Spec.NamespaceSelector.MatchLabels)+len(b.Spec.NamespaceSelector.MatchExpressions) != 0 {
		t.Fatalf("default ClusterLockBackend spec = %+v, want the kubernetes store for every namespace", b.Spec)
	}

	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "default"},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{"billing/ledger"},
			Backend: locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: manager.DefaultClusterLockBackend}},
		},
	}
	if err := env.Client.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	job := func(name string) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{"lockwarden.io/lock": "nightly"}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
			}}},
		}
	}
	token := func(name string) (running bool, fence int64) {
		var j batchv1.Job
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, &j); err != nil {
			return false, 0
		}
		f, _ := strconv.ParseInt(j.Spec.Template.Annotations["lockwarden.io/fencing-token"], 10, 64)
		return j.Spec.Suspend != nil && !*j.Spec.Suspend, f
	}
	if err := env.Client.Create(ctx, job("first")); err != nil {
		t.Fatal(err)
	}
	var first int64
	waitFor(t, "the first Job to run with a fencing token", func() bool {
		running, f := token("first")
		first = f
		return running && f > 0
	})
	if err := env.Client.Create(ctx, job("second")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second Job to wait in the queue", func() bool {
		var j batchv1.Job
		return env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "second"}, &j) == nil &&
			j.Annotations["lockwarden.io/queue-position"] != ""
	})
	if running, _ := token("second"); running {
		t.Fatal("the second Job runs while the first holds the lock")
	}
	// The lock is a Lease in the manager's namespace, showing its holder.
	var leases coordinationv1.LeaseList
	if err := env.Client.List(ctx, &leases, client.InNamespace("default"), client.HasLabels{kubelock.LabelStore}); err != nil {
		t.Fatal(err)
	}
	held := false
	for _, l := range leases.Items {
		if l.Labels[kubelock.LabelRole] == "key" && l.Spec.HolderIdentity != nil && strings.Contains(*l.Spec.HolderIdentity, "first") {
			held = true
		}
	}
	if !held {
		t.Fatalf("no key Lease in the manager's namespace names the first Job as holder (%d Leases of the store)", len(leases.Items))
	}

	// The first Job goes: the second runs, with a larger token.
	if err := env.Client.Delete(ctx, job("first"), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second Job to run once the first is gone", func() bool {
		running, f := token("second")
		return running && f > first
	})
}
