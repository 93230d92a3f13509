package controllers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// positionWrites counts, from a watch of one namespace's Jobs, the writes
// that changed a Job's queue-position annotation to a new place (not its
// removal when the Job starts).
type positionWrites struct {
	stop func()
	mu   sync.Mutex
	n    int
}

func countPositionWrites(t *testing.T, c client.WithWatch, namespace string) *positionWrites {
	t.Helper()
	w, err := c.Watch(context.Background(), &batchv1.JobList{}, client.InNamespace(namespace))
	if err != nil {
		t.Fatal(err)
	}
	p := &positionWrites{stop: w.Stop}
	t.Cleanup(w.Stop)
	go func() {
		last := map[string]string{}
		for ev := range w.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			pos := j.Annotations[locksv1alpha1.AnnotationQueuePosition]
			prev, seen := last[j.Name]
			last[j.Name] = pos
			if seen && pos != "" && pos != prev {
				p.mu.Lock()
				p.n++
				p.mu.Unlock()
			}
		}
	}()
	return p
}

func (p *positionWrites) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Every handover moves each waiter one place up, an API write per waiter on
// the client all tenants share. One namespace with a deep queue and quick
// handovers gets only its share of these writes: counted from the API
// server, its queue-position writes stay within the bound's burst and rate,
// another namespace's waiter is shown its place meanwhile, and once the
// handovers stop every waiter shows its right place (deferred, not lost).
func TestOneNamespaceGetsOnlyItsShareOfQueuePositionWrites(t *testing.T) {
	const rate, burst = 2, 5
	shows := newKeyedLimiter(rate, burst)
	rdb := redistest.Start(t)
	startManager(t, managerOptions{shows: &shows})
	c := env.Client
	busy, quiet := newNamespace(t, nil), newNamespace(t, nil)

	create(t, makeLock("billing", busy, rdb.Addr).ttl(600).obj())
	holder := waitRunningAfterCreate(t, busy, "h0")
	const waiters = 10 // all of them listed in the lock's status
	for i := 1; i <= waiters; i++ {
		create(t, makeJob(fmt.Sprintf("w%02d", i), busy).lock("billing").obj())
	}
	waitQueued(t, busy, "billing", waiters)
	waitPlacesShown(t, busy, 1, waiters)

	writes := countPositionWrites(t, watchClient(t, env), busy)
	start := time.Now()
	// Three quick handovers: each moves every waiter one place up.
	for i := 1; i <= 3; i++ {
		complete(t, c, holder)
		holder = waitRunning(t, c, 20*time.Second, busy, fmt.Sprintf("w%02d", i))
	}
	// Meanwhile another namespace's waiter is shown its place.
	create(t, makeLock("billing", quiet, rdb.Addr).ttl(600).obj())
	waitRunningAfterCreate(t, quiet, "q0")
	create(t, makeJob("q1", quiet).lock("billing").obj())
	eventually(t, 20*time.Second, "the quiet namespace's waiter to show its place", func() (bool, string) {
		j := getJob(t, c, quiet, "q1")
		return j.Annotations[locksv1alpha1.AnnotationQueuePosition] == "1/1", fmt.Sprint(j.Annotations)
	})
	elapsed := time.Since(start)
	// The tokens the bucket can have given in elapsed, plus one for the
	// write in flight when the window closed.
	bound := burst + int(elapsed.Seconds()*rate) + 1
	if n := writes.count(); n > bound {
		t.Fatalf("namespace %s got %d queue-position writes in %v; its share is at most %d (burst %d, %d/s)", busy, n, elapsed.Round(time.Millisecond), bound, burst, rate)
	} else {
		t.Logf("busy namespace: %d queue-position writes in %v (bound %d)", n, elapsed.Round(time.Millisecond), bound)
	}

	// Deferred, not lost: every waiter left shows its place.
	waitPlacesShown(t, busy, 4, waiters)
}

// waitPlacesShown waits until the waiting Jobs w<from>..w<to> of namespace
// show the places 1..n of a queue of n, in some order.
func waitPlacesShown(t *testing.T, namespace string, from, to int) {
	t.Helper()
	n := to - from + 1
	var want []string
	for p := 1; p <= n; p++ {
		want = append(want, fmt.Sprintf("%d/%d", p, n))
	}
	slices.Sort(want)
	eventually(t, 60*time.Second, fmt.Sprintf("waiters w%02d..w%02d to show their places", from, to), func() (bool, string) {
		var got []string
		for i := from; i <= to; i++ {
			got = append(got, getJob(t, env.Client, namespace, fmt.Sprintf("w%02d", i)).Annotations[locksv1alpha1.AnnotationQueuePosition])
		}
		sorted := slices.Clone(got)
		slices.Sort(sorted)
		return slices.Equal(sorted, want), fmt.Sprint(got)
	})
}

// waitRunningAfterCreate creates a Job of lock billing and waits until it runs.
func waitRunningAfterCreate(t *testing.T, namespace, name string) *batchv1.Job {
	t.Helper()
	create(t, makeJob(name, namespace).lock("billing").obj())
	return waitRunning(t, env.Client, 20*time.Second, namespace, name)
}

// One namespace that creates many gated Jobs at once gets only its share of
// the controllers' work (and of the API writes that come with it): each of
// its waiting Jobs takes a reconcile to show its place, so the places shown
// stay within the share's burst and rate; another namespace's Job starts
// and its waiter shows its place meanwhile; and every one of the busy
// namespace's Jobs shows its place in the end (put back, not dropped).
func TestOneNamespaceGetsOnlyItsShareOfReconciles(t *testing.T) {
	const qps, burst = 1, 1
	rdb := redistest.Start(t)
	startManager(t, managerOptions{namespaceQPS: qps, namespaceBurst: burst})
	c := env.Client
	busy, quiet := newNamespace(t, nil), newNamespace(t, nil)

	start := time.Now()
	create(t, makeLock("billing", busy, rdb.Addr).ttl(600).obj())
	const waiters = 12
	createJobs(t, busy, "billing", "w%02d", waiters+1)
	shown := func() int {
		var jobs batchv1.JobList
		if err := c.List(context.Background(), &jobs, client.InNamespace(busy)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, j := range jobs.Items {
			if j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "" {
				n++
			}
		}
		return n
	}
	// Checked until the quiet namespace's Jobs are through: the tokens the
	// bucket can have given since the start, plus one for a reconcile in
	// flight, bound the busy namespace's waiters shown.
	check := func() {
		t.Helper()
		elapsed := time.Since(start)
		bound := burst + int(elapsed.Seconds()*qps) + 1
		if n := shown(); n > bound {
			t.Fatalf("namespace %s shows %d waiters' places %v after its Jobs were created; its share is at most %d reconciles (burst %d, %d/s)", busy, n, elapsed.Round(time.Millisecond), bound, burst, qps)
		}
	}
	create(t, makeLock("billing", quiet, rdb.Addr).ttl(600).obj())
	create(t, makeJob("q0", quiet).lock("billing").obj())
	eventually(t, 20*time.Second, "the quiet namespace's first Job to run", func() (bool, string) {
		check()
		return running(getJob(t, c, quiet, "q0")), ""
	})
	create(t, makeJob("q1", quiet).lock("billing").obj())
	eventually(t, 20*time.Second, "the quiet namespace's waiter to show its place", func() (bool, string) {
		check()
		j := getJob(t, c, quiet, "q1")
		return j.Annotations[locksv1alpha1.AnnotationQueuePosition] == "1/1", fmt.Sprint(j.Annotations)
	})
	t.Logf("busy namespace: %d of %d waiters shown after %v", shown(), waiters, time.Since(start).Round(time.Millisecond))
	// Put back, not dropped: every waiter of the busy namespace shows its place.
	eventually(t, 60*time.Second, "every waiter of the busy namespace to show its place", func() (bool, string) {
		n := shown()
		return n == waiters, fmt.Sprintf("%d of %d", n, waiters)
	})
}

// A namespace over its share still has a lost lease acted on at once: the
// holder's Job carries its fencing token, so its reconciles are never put
// back, and onLost Terminate suspends it while the namespace's next turn is
// far off (one every 20 s here, with waiters already given the turns ahead).
func TestLostLeaseStopsItsJobAtOnceOverTheShare(t *testing.T) {
	rdb := redistest.Start(t)
	m := startManager(t, managerOptions{namespaceQPS: 0.05, namespaceBurst: 6})
	c := env.Client
	ns := newNamespace(t, nil)
	dl := makeLock("billing", ns, rdb.Addr).ttl(6).obj()
	dl.Spec.OnLost = locksv1alpha1.OnLostTerminate
	create(t, dl)
	holder := waitRunningAfterCreate(t, ns, "h0")
	createJobs(t, ns, "billing", "w%02d", 6)
	eventually(t, 20*time.Second, "the namespace's share to be used up (a waiter put back)", func() (bool, string) {
		m.jobs.budget.mu.Lock()
		defer m.jobs.budget.mu.Unlock()
		return len(m.jobs.budget.turns) > 0, fmt.Sprint(m.jobs.budget.turns)
	})

	// The lease disappears from Redis (say, a failover lost it).
	key := backend.KeyPrefix + "{" + backend.EngineKey(ns, "", "billing/ledger") + "}:lock"
	if n, err := rdb.Client().Del(context.Background(), key).Result(); err != nil || n != 1 {
		t.Fatalf("delete the lease %s: %d, %v", key, n, err)
	}
	// Found at the next renewal (every TTL/3: 2 s), then acted on.
	eventually(t, 10*time.Second, "the holder stopped (suspended, lost lease recorded)", func() (bool, string) {
		j := getJob(t, c, ns, holder.Name)
		return ptr.Deref(j.Spec.Suspend, false) && j.Annotations[locksv1alpha1.AnnotationLost] != "", fmt.Sprint(j.Spec.Suspend, j.Annotations)
	})
}
