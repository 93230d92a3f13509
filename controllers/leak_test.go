package controllers

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// leakCycles is how many locks TestDeletedLocksLeaveNothingBehind creates
// and deletes (LOCKWARDEN_LEAK_CYCLES overrides it).
func leakCycles(t *testing.T) int {
	if v := os.Getenv("LOCKWARDEN_LEAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LOCKWARDEN_LEAK_CYCLES=%q: want a positive count", v)
		}
		return n
	}
	return 500
}

// A lock whose finalizer is removed and which is then deleted never gets
// its deletion reconcile. Whatever the operator kept for it (its backend
// client with sockets and goroutines, its metric series, its registry and
// tracker entries) must still go, so that a tenant cannot grow the shared
// operator by creating, stripping and deleting locks: after the cycles and
// one sweep period, every count is back where it started. Half the locks
// hold a lease (a manual holder) when they go, half only watch their
// backend; each uses one of Redis's 16 databases, so a backend client left
// behind is a connection left open.
func TestDeletedLocksLeaveNothingBehind(t *testing.T) {
	rdb := redistest.Start(t)
	const sweep = 2 * time.Second
	// A control plane of its own: the manager reconciles these locks only,
	// so that its goroutines and open backends are theirs.
	e := kubetest.Start(t, kubetest.WithWebhooks())
	m := startManager(t, managerOptions{resync: sweep, env: e})
	const ns = "leaks"
	namedNamespace(t, e, ns)
	ctx := context.Background()
	registry := m.reconciler.Registry

	rc := rdb.Client()
	// The operator's connections: its clients speak RESP2, the test's RESP3.
	clients := func() int {
		list, err := rc.ClientList(ctx).Result()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v", err)
		}
		return strings.Count(list, " resp=2\n")
	}
	series := func() int { return lockSeriesIn(ns) }
	users := func() int { return registryUsersIn(registry, ns) }
	heldKeys := func() int {
		keys, err := rc.Keys(ctx, "*"+ns+"*").Result()
		if err != nil {
			t.Fatalf("KEYS: %v", err)
		}
		n := 0
		for _, k := range keys {
			if strings.HasSuffix(k, ns+"/billing/ledger") {
				n++
			}
		}
		return n
	}
	// cycle creates lock name, waits until it is reconciled, strips its
	// finalizer (when strip) and deletes it.
	cycle := func(i int, name string, strip bool) {
		b := makeLock(name, ns, rdb.Addr).ttl(600)
		b.dl.Spec.Backend.Redis.DB = int32(i % 16)
		want := locksv1alpha1.ConditionBackendReady
		if i%2 == 0 {
			b = b.holder("maintenance")
			want = locksv1alpha1.ConditionHeld
		}
		if err := e.Client.Create(ctx, b.obj()); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		var dl locksv1alpha1.DistributedLock
		eventually(t, 15*time.Second, name+" to be reconciled", func() (bool, string) {
			if err := e.Client.Get(ctx, nn(ns, name), &dl); err != nil {
				return false, err.Error()
			}
			for _, c := range dl.Status.Conditions {
				if c.Type == want && c.Status == metav1.ConditionTrue {
					return true, ""
				}
			}
			return false, fmt.Sprintf("conditions %+v", dl.Status.Conditions)
		})
		if strip {
			patch := client.MergeFrom(dl.DeepCopy())
			dl.Finalizers = nil
			if err := e.Client.Patch(ctx, &dl, patch); err != nil {
				t.Fatalf("strip the finalizer of %s: %v", name, err)
			}
		}
		if err := e.Client.Delete(ctx, &dl); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}

	// The counts to come back to: with every worker and informer started
	// (one lock through its whole life first), nothing held.
	cycle(0, "warm-up", false)
	eventually(t, 15*time.Second, "the warm-up lock to be gone", func() (bool, string) {
		err := e.Client.Get(ctx, nn(ns, "warm-up"), &locksv1alpha1.DistributedLock{})
		return apierrors.IsNotFound(err) && registry.Len() == 0 && clients() == 0, fmt.Sprintf("get: %v; open backends %d; Redis connections %d", err, registry.Len(), clients())
	})
	runtime.GC()
	goroutines0, clients0, backends0 := runtime.NumGoroutine(), clients(), registry.Len()

	cycles := leakCycles(t)
	start := time.Now()
	for i := range cycles {
		cycle(i, fmt.Sprintf("l-%d", i), true)
	}
	t.Logf("%d create / strip-finalizer / delete cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	peakGoroutines, peakClients := runtime.NumGoroutine(), clients()

	// One sweep period after the last deletion (and the time to notice it).
	t.Cleanup(func() {
		if t.Failed() {
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		}
	})
	eventually(t, 3*sweep+10*time.Second, "everything kept for the deleted locks to go", func() (bool, string) {
		runtime.GC()
		g, c, b, u, s, k := runtime.NumGoroutine(), clients(), registry.Len(), users(), series(), heldKeys()
		ok := u == 0 && s == 0 && k == 0 && b <= backends0 && c <= clients0 && g <= goroutines0+10
		return ok, fmt.Sprintf("goroutines %d (started at %d), Redis connections %d (%d), open backends %d (%d), registry users in the namespace %d, lock metric series %d, leases still held %d",
			g, goroutines0, c, clients0, b, backends0, u, s, k)
	})
	t.Logf("goroutines %d at the start, %d after the cycles, %d after the sweep; Redis connections %d, %d, %d",
		goroutines0, peakGoroutines, runtime.NumGoroutine(), clients0, peakClients, clients())
}

// The sweep is the backstop for a deletion no reconcile saw (an event
// missed): a backend in use for a lock that is not in the cache, and the
// metric series of such a lock, are dropped within a sweep period.
func TestSweepForgetsWhatNoReconcileSaw(t *testing.T) {
	rdb := redistest.Start(t)
	const sweep = time.Second
	// A control plane of its own: nobody else's locks keep backends open.
	e := kubetest.Start(t, kubetest.WithWebhooks())
	m := startManager(t, managerOptions{resync: sweep, env: e})
	const ns = "ghosts"
	namedNamespace(t, e, ns)
	registry := m.reconciler.Registry

	ghost := makeLock("ghost", ns, rdb.Addr).obj() // never created
	ghost.Spec.Backend.Redis.DB = 7
	if _, err := registry.For(context.Background(), holder.Ref{Kind: lockKind, Namespace: ns, Name: "ghost"}, ghost); err != nil {
		t.Fatalf("open the ghost lock's backend: %v", err)
	}
	metrics.BackendUp.WithLabelValues(ns, "ghost").Set(1)
	metrics.QueueDepth.WithLabelValues(ns, "ghost").Set(3)
	eventually(t, 3*sweep+5*time.Second, "the ghost lock's backend and series to go", func() (bool, string) {
		users, series := registryUsersIn(registry, ns), lockSeriesIn(ns)
		return users == 0 && series == 0 && registry.Len() == 0, fmt.Sprintf("registry users %d, open backends %d, lock series %d", users, registry.Len(), series)
	})
}

// lockSeriesIn counts the locks of namespace ns with metric series.
func lockSeriesIn(ns string) int {
	n := 0
	for _, nn := range metrics.LockSeries() {
		if nn.Namespace == ns {
			n++
		}
	}
	return n
}

// registryUsersIn counts the holders of namespace ns that use a backend.
func registryUsersIn(r *backend.Registry, ns string) int {
	n := 0
	for _, u := range r.Users() {
		if u.Namespace == ns {
			n++
		}
	}
	return n
}
