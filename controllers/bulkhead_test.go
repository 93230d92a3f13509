package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// slowLocker answers every call but Ping (so it passes its health checks)
// after delay: a tenant's store that answers, slowly.
type slowLocker struct {
	backend.Locker
	delay time.Duration
}

func (l *slowLocker) wait(ctx context.Context) {
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
	}
}

func (l *slowLocker) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	l.wait(ctx)
	return l.Locker.TryAcquire(ctx, req)
}

func (l *slowLocker) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	l.wait(ctx)
	return l.Locker.Acquire(ctx, req)
}

func (l *slowLocker) Release(ctx context.Context, lease *lock.Lease) error {
	l.wait(ctx)
	return l.Locker.Release(ctx, lease)
}

func (l *slowLocker) Dequeue(ctx context.Context, keys []string, owner string) error {
	l.wait(ctx)
	return l.Locker.Dequeue(ctx, keys, owner)
}

func (l *slowLocker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	l.wait(ctx)
	return l.Locker.Inspect(ctx, keys)
}

// One tenant's backend answers every call only after slowDelay (as a
// PostgreSQL or ZooKeeper backend may take its full 2 s operation timeout)
// while 20 of its Jobs wait. Another tenant's Jobs must still start at
// once: the slow backend holds at most its share of the shared workers
// (BackendWorkerShare), and its other reconciles come back later without
// calling it. Without that, the 16 Job workers all sat in slow calls and
// the other tenant's Jobs started only when one came free. The start
// times with and without the slow tenant are logged (docs/benchmarks.md).
func TestSlowBackendDoesNotStallOtherTenants(t *testing.T) {
	const slowDelay = 3 * time.Second
	const slowJobs, fastJobs = 20, 8
	slowRdb, fastRdb := redistest.Start(t), redistest.Start(t)
	e := kubetest.Start(t, kubetest.WithWebhooks())
	startManager(t, managerOptions{env: e, wrapLocker: func(cfg backend.Config, l backend.Locker) backend.Locker {
		if storeAddr(cfg) == slowRdb.Addr {
			return &slowLocker{Locker: l, delay: slowDelay}
		}
		return l
	}})
	namedNamespace(t, e, "slow")
	namedNamespace(t, e, "fast")
	ctx := context.Background()

	// startFast creates fastJobs Jobs of the fast tenant, each on a lock of
	// its own (free), one after the other, and returns how long each took
	// from its creation to running.
	startFast := func(round string) []time.Duration {
		var took []time.Duration
		for i := range fastJobs {
			name := fmt.Sprintf("%s-%d", round, i)
			if err := e.Client.Create(ctx, makeLock(name, "fast", fastRdb.Addr).keys(name).obj()); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := e.Client.Create(ctx, makeJob(name, "fast").lock(name).obj()); err != nil {
				t.Fatal(err)
			}
			waitRunning(t, e.Client, 30*time.Second, "fast", name)
			took = append(took, time.Since(start))
		}
		return took
	}
	p50 := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}

	// Warm the fast backend up (its client is built with the first lock).
	startFast("warm")
	alone := startFast("alone")

	if err := e.Client.Create(ctx, makeLock("nightly", "slow", slowRdb.Addr).obj()); err != nil {
		t.Fatal(err)
	}
	for i := range slowJobs {
		if err := e.Client.Create(ctx, makeJob(fmt.Sprintf("slow-%d", i), "slow").lock("nightly").obj()); err != nil {
			t.Fatal(err)
		}
	}
	// Let the slow tenant's reconciles take their workers.
	eventually(t, 10*time.Second, "the slow tenant's Jobs to be reconciled", func() (bool, string) {
		n := 0
		for i := range slowJobs {
			if j := getJob(t, e.Client, "slow", fmt.Sprintf("slow-%d", i)); len(j.Finalizers) > 0 {
				n++
			}
		}
		return n == slowJobs, fmt.Sprintf("%d of %d gated", n, slowJobs)
	})
	beside := startFast("beside")

	t.Logf("the other tenant's Jobs started in p50 %v alone (%v), p50 %v beside %d waiting Jobs of a backend answering after %v (%v)",
		p50(alone).Round(time.Millisecond), alone, p50(beside).Round(time.Millisecond), slowJobs, slowDelay, beside)
	if worst := slices.Max(beside); worst >= slowDelay {
		t.Errorf("beside the slow tenant, a Job of the other tenant took %v to start (all: %v); want each well under the slow backend's %v: it waited for a worker the slow backend held",
			worst.Round(time.Millisecond), beside, slowDelay)
	}
}
