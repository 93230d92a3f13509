package controllers

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// storeCall is one call the controllers made to a backend.
type storeCall struct {
	at     time.Time
	method string
	// holder is the request's or lease's holder string (TryAcquire, Renew, Release).
	holder string
	// acquired tells whether a TryAcquire acquired.
	acquired bool
}

// callLog records the calls made through the backend clients it wraps.
type callLog struct {
	mu    sync.Mutex
	calls []storeCall
	// inner are the clients wrapped, by the address of their store
	// (storeAddr).
	inner map[string]backend.Locker
}

func (c *callLog) add(method, holder string, acquired bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, storeCall{at: time.Now(), method: method, holder: holder, acquired: acquired})
}

// since returns the calls recorded from index i on.
func (c *callLog) since(i int) []storeCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls[i:])
}

func (c *callLog) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// wrap is a managerOptions.wrapLocker.
func (c *callLog) wrap(cfg backend.Config, l backend.Locker) backend.Locker {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner = map[string]backend.Locker{}
	}
	c.inner[storeAddr(cfg)] = l
	return &countingLocker{Locker: l, log: c}
}

// observer returns the client wrapped for the store at addr (storeAddr),
// unwrapped (its calls are not counted), or nil before there is one. The
// manager has clients of other tests' stores too (their leftover locks).
func (c *callLog) observer(addr string) backend.Locker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inner[addr]
}

// storeAddr names the store of a client configuration by its first address.
func storeAddr(cfg backend.Config) string {
	if len(cfg.Endpoints) == 0 {
		return ""
	}
	return cfg.Endpoints[0]
}

// countingLocker records every call to a backend client (besides Ping,
// Watch and Close, which are not per-lock work) and passes it on, optional
// interfaces included.
type countingLocker struct {
	backend.Locker
	log *callLog
}

func (l *countingLocker) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	lease, err := l.Locker.TryAcquire(ctx, req)
	l.log.add("TryAcquire", req.Holder, err == nil)
	return lease, err
}

func (l *countingLocker) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	l.log.add("Acquire", req.Holder, false)
	return l.Locker.Acquire(ctx, req)
}

func (l *countingLocker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	l.log.add("Renew", lease.Holder, false)
	return l.Locker.Renew(ctx, lease, ttl)
}

func (l *countingLocker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	l.log.add("RenewAll", "", false)
	return l.Locker.RenewAll(ctx, leases, ttl)
}

func (l *countingLocker) Release(ctx context.Context, lease *lock.Lease) error {
	l.log.add("Release", lease.Holder, false)
	return l.Locker.Release(ctx, lease)
}

func (l *countingLocker) Dequeue(ctx context.Context, keys []string, owner string) error {
	l.log.add("Dequeue", "", false)
	return l.Locker.Dequeue(ctx, keys, owner)
}

func (l *countingLocker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	l.log.add("Inspect", "", false)
	return l.Locker.Inspect(ctx, keys)
}

func (l *countingLocker) InspectMany(ctx context.Context, keys [][]string) ([][]lock.KeyState, []error) {
	l.log.add("InspectMany", "", false)
	return lock.InspectMany(ctx, l.Locker, keys)
}

func (l *countingLocker) CheckServers(ctx context.Context) ([]lock.Finding, error) {
	if cc, ok := l.Locker.(lock.ConfigChecker); ok {
		return cc.CheckServers(ctx)
	}
	return nil, nil
}

// herdWaitRequeue is the waiting Jobs' periodic requeue in the handover
// tests: long enough that no periodic attempt falls in a handover, well
// below the waiter TTL (30 s) so that no waiter loses its place.
const herdWaitRequeue = 20 * time.Second

// TestHandoverWakesOnlyTheNextWaiter: 100 Jobs wait for one mutex, on each
// kind of store (through a LockBackend). When the holder finishes, the
// store's next waiter starts, woken by the release; the waiter behind it
// shows its new place at once; and the handover costs a few store calls, not
// one or more per waiter: at most free slots (1) + 2 acquisition attempts,
// whatever the number of waiters. The counts are logged per handover
// (LOCKWARDEN_HERD_WAITERS sets the number of waiters; docs/benchmarks.md
// has the figures for 100).
func TestHandoverWakesOnlyTheNextWaiter(t *testing.T) {
	waiters := envInt(t, "LOCKWARDEN_HERD_WAITERS", 100)
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { testHandover(t, sc, waiters) })
	}
}

func testHandover(t *testing.T, sc storeCase, waiters int) {
	const free = 1
	calls := &callLog{}
	startManager(t, managerOptions{wrapLocker: calls.wrap, waitRequeue: herdWaitRequeue})
	ns := newNamespace(t, nil)
	c := env.Client
	addr := sc.setup(t, ns)
	dl := makeLock("billing", ns).obj()
	dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: "store"}}
	create(t, dl)
	create(t, makeJob("holder", ns).lock("billing").obj())
	current := waitRunning(t, c, 20*time.Second, ns, "holder")

	// The key's state, read through the manager's own backend client,
	// not counted.
	key := backend.EngineKey(ns, "", "billing/ledger")
	inspect := func(timeout time.Duration, what string, done func(lock.KeyState) (bool, string)) lock.KeyState {
		t.Helper()
		var s lock.KeyState
		eventually(t, timeout, what, func() (bool, string) {
			observer := calls.observer(addr)
			if observer == nil {
				return false, "no backend client yet"
			}
			states, err := observer.Inspect(context.Background(), []string{key})
			if err != nil {
				return false, err.Error()
			}
			s = states[0]
			return done(s)
		})
		return s
	}

	createJobs(t, ns, "billing", "w-%03d", waiters)
	created := time.Now()
	inspect(60*time.Second, fmt.Sprintf("%d waiters in the queue", waiters), func(s lock.KeyState) (bool, string) {
		return s.Queued == waiters, fmt.Sprintf("%d queued", s.Queued)
	})
	// Let the reconciles that follow each waiter's first attempt (the
	// update of its annotations) settle.
	quiet(t, calls, 500*time.Millisecond, 10*time.Second)

	names := map[string]bool{}
	for i := range waiters {
		names[fmt.Sprintf("w-%03d", i)] = true
	}
	for handover := 1; handover <= 2; handover++ {
		s := inspect(10*time.Second, "the key's state", func(lock.KeyState) (bool, string) { return true, "" })
		if len(s.Waiters) == 0 {
			t.Fatalf("nobody waits: %+v", s)
		}
		next := holder.Decode(s.Waiters[0].Holder).Name
		mark := calls.len()
		complete(t, c, current)
		// Woken by the release notification, not by a periodic requeue.
		current = waitRunning(t, c, 5*time.Second, ns, next)
		delete(names, next)
		// The waiters behind it moved up, and the ones at the head of the
		// queue show it at once (without trying the store).
		if len(s.Waiters) > 1 {
			second, want := holder.Decode(s.Waiters[1].Holder).Name, fmt.Sprintf("1/%d", queueLength(s)-1)
			eventually(t, 3*time.Second, second+" at queue position "+want, func() (bool, string) {
				got := getJob(t, c, ns, second).Annotations[locksv1alpha1.AnnotationQueuePosition]
				return got == want, got
			})
		}
		quiet(t, calls, time.Second, 15*time.Second)
		r := countHandover(calls.since(0), mark, current.Name)
		t.Logf("%s: handover %d with %d waiters (%s -> %s), %v after the waiters were created: release to acquisition %v: %s; release to quiet (%v): %s; periodic attempts set aside: %d, first attempts (joins) set aside: %d",
			sc.name, handover, queueLength(s), holder.Decode(s.Holder).Name, next, time.Since(created).Round(time.Millisecond), r.acquiredAfter.Round(time.Millisecond), r.untilAcquired, r.tail.Round(time.Millisecond), r.total, r.periodic, r.joins)
		if r.acquiredAfter == 0 {
			t.Fatalf("handover %d: no acquisition by %s recorded", handover, next)
		}
		if got := r.total.n["TryAcquire"]; got > free+2 {
			t.Errorf("handover %d: %d acquisition attempts, want at most %d (free slots + 2)", handover, got, free+2)
		}
		// The FIFO order held: only the store's head runs.
		for n := range names {
			if running(getJob(t, c, ns, n)) {
				t.Fatalf("%s runs besides %s, the head of the queue", n, next)
			}
		}
	}
}

// callCounts counts calls by method.
type callCounts struct{ n map[string]int }

func (c callCounts) String() string {
	var parts []string
	for m, n := range c.n {
		parts = append(parts, fmt.Sprintf("%s=%d", m, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// handoverCounts are the store calls of one handover.
type handoverCounts struct {
	// untilAcquired: from the release of the holder to the next holder's
	// acquisition; total: from the release until the calls stopped.
	untilAcquired, total callCounts
	acquiredAfter, tail  time.Duration
	// periodic is the number of acquisition attempts left out of the
	// counts: a waiter's periodic one (see isPeriodic).
	periodic int
	// joins is the number of first attempts left out of the counts: a
	// waiter joining the queue (its Job's first reconcile came late on a
	// loaded machine), which no release caused.
	joins int
}

// countHandover counts the calls from the first Release at or after index
// from on, until the acquisition by the Job next and in all. The calls
// before from give each waiter's previous attempt, to tell its first
// attempt (joining the queue) and its periodic one (isPeriodic) from one a
// wake-up caused.
func countHandover(calls []storeCall, from int, next string) handoverCounts {
	r := handoverCounts{untilAcquired: callCounts{n: map[string]int{}}, total: callCounts{n: map[string]int{}}}
	start := -1
	for i := from; i < len(calls); i++ {
		if calls[i].method == "Release" {
			start = i
			break
		}
	}
	if start < 0 {
		return r
	}
	last := map[string]time.Time{}
	for _, c := range calls[:start] {
		if c.method == "TryAcquire" {
			last[c.holder] = c.at
		}
	}
	t0 := calls[start].at
	acquired := false
	for _, c := range calls[start:] {
		if c.method == "TryAcquire" {
			prev, seen := last[c.holder]
			last[c.holder] = c.at
			waiter := !c.acquired && holder.Decode(c.holder).Name != next
			switch {
			case waiter && !seen:
				r.joins++
				continue
			case waiter && isPeriodic(prev, c.at):
				r.periodic++
				continue
			}
		}
		r.total.n[c.method]++
		if !acquired {
			r.untilAcquired.n[c.method]++
		}
		if c.method == "TryAcquire" && c.acquired && holder.Decode(c.holder).Name == next && !acquired {
			acquired = true
			r.acquiredAfter = c.at.Sub(t0)
		}
		r.tail = c.at.Sub(t0)
	}
	return r
}

// isPeriodic tells whether a waiter's attempt at, after its previous one
// at prev, may be its periodic one: a waiting Job tries again
// herdWaitRequeue after it started its last attempt (no jitter), whatever
// wakes the others; prev is when that attempt returned, hence the margin.
// (The attempts of the Job whose turn it is, and those that acquire, are
// always counted.)
func isPeriodic(prev, at time.Time) bool {
	return at.Sub(prev) >= herdWaitRequeue-250*time.Millisecond
}

// quiet waits until no store call was made for d (at most timeout).
func quiet(t *testing.T, calls *callLog, d, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		calls.mu.Lock()
		var last time.Time
		if n := len(calls.calls); n > 0 {
			last = calls.calls[n-1].at
		}
		calls.mu.Unlock()
		if since := time.Since(last); since >= d {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("store calls did not stop for %v within %v", d, timeout)
		} else {
			time.Sleep(d - since)
		}
	}
}

// createJobs creates n Jobs of lock, named by format and their index, ten at a time.
func createJobs(t *testing.T, ns, lockName, format string, n int) {
	t.Helper()
	sem := make(chan struct{}, 10)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs <- env.Client.Create(context.Background(), makeJob(fmt.Sprintf(format, i), ns).lock(lockName).obj())
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestGoneHeadWaiterDoesNotHoldUpTheNext: the Job at the head of the queue
// is deleted without lockwarden's finalizer, so nothing takes it out of the
// queue. When the holder finishes, the release finds it gone, removes its
// entry and wakes the next waiter at once, rather than after the entry's
// waiter TTL (30 s) and a periodic requeue.
func TestGoneHeadWaiterDoesNotHoldUpTheNext(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{waitRequeue: herdWaitRequeue})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("holder", ns).lock("billing").obj())
	h := waitRunning(t, c, 10*time.Second, ns, "holder")
	create(t, makeJob("w1", ns).lock("billing").obj())
	waitPosition(t, ns, "w1", "1/1")
	create(t, makeJob("w2", ns).lock("billing").obj())
	waitPosition(t, ns, "w2", "2/2")

	w1 := getJob(t, c, ns, "w1")
	w1.Finalizers = nil
	if err := c.Update(context.Background(), w1); err != nil {
		t.Fatalf("remove the finalizer of w1: %v", err)
	}
	if err := c.Delete(context.Background(), w1, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "w1 gone", func() (bool, string) {
		err := c.Get(context.Background(), nn(ns, "w1"), &batchv1.Job{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if n := inQueue(t, rdb, ns, "billing/ledger"); n != 2 {
		t.Fatalf("Redis holds %d waiters, want 2 (the gone w1 still ahead of w2)", n)
	}

	complete(t, c, h)
	waitRunning(t, c, 5*time.Second, ns, "w2")
	if n := inQueue(t, rdb, ns, "billing/ledger"); n != 0 {
		t.Errorf("Redis holds %d waiters after w2 started, want 0", n)
	}
}
