package watchdog_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// These tests are about one tenant's backend that stalls renewals (a
// PostgreSQL or etcd server the tenant runs and stops, or a row it keeps
// locked) next to the leases of other tenants on healthy backends.

// stalledLocker is a backend that answers no renewal: RenewAll returns,
// with lock.ErrBackendUnavailable for every lease, only when its context
// ends or the test releases it.
type stalledLocker struct {
	lock.Locker
	release  chan struct{}
	released sync.Once

	mu       sync.Mutex
	inFlight int
	maxIn    int // the most calls it had in flight at once
	calls    int
}

func newStalledLocker(t *testing.T) *stalledLocker {
	s := &stalledLocker{release: make(chan struct{})}
	t.Cleanup(s.answer)
	return s
}

// answer makes every call in flight, and every later one, return at once.
func (s *stalledLocker) answer() { s.released.Do(func() { close(s.release) }) }

func (s *stalledLocker) RenewAll(ctx context.Context, leases []*lock.Lease, _ time.Duration) ([]*lock.Lease, []error) {
	s.mu.Lock()
	s.calls++
	s.inFlight++
	s.maxIn = max(s.maxIn, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
	case <-s.release:
	}
	errs := make([]error, len(leases))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: no answer", lock.ErrBackendUnavailable)
	}
	return make([]*lock.Lease, len(leases)), errs
}

// stats returns the calls made so far, and the most in flight at once.
func (s *stalledLocker) stats() (calls, maxInFlight int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.maxIn
}

func attacker(i int) holder.Ref {
	return holder.Ref{Kind: "DistributedLock", Namespace: "attacker", Name: fmt.Sprintf("l%03d", i)}
}

// TestAStalledBackendDoesNotStarveAnotherTenantsLease: one tenant holds 200
// leases on a backend that stalls every renewal, each lease in its own
// RenewAll call (its own TTL), due and expiring before the other tenant's
// lease; the other tenant's lease on a healthy backend is renewed every time
// it is due, before it expires, and never reported lost.
func TestAStalledBackendDoesNotStarveAnotherTenantsLease(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	lost := &lostRecorder{}
	w := watchdog.New(lost.record, watchdog.WithClock(clk), watchdog.WithTick(time.Second))
	stalled := newStalledLocker(t)
	const hostile = 200
	for i := range hostile {
		// A TTL of its own makes each lease its own call. The expiries are
		// spread over the next minute: at any time dozens are due, and
		// more urgent than the victim's lease.
		ttl := ttl + time.Duration(i)*time.Millisecond
		expires := t0.Add(time.Second + time.Duration(i)*300*time.Millisecond)
		w.Hold(attacker(i), stalled, &lock.Lease{Keys: []string{attacker(i).Name}, Owner: "o", Fence: 1, TTL: ttl, Acquired: t0, Expires: expires})
	}
	victim := holder.Ref{Kind: "Job", Namespace: "victim", Name: "nightly"}
	healthy := newFakeLocker(clk)
	// renewedAt records, for every renewal of the victim's lease, when it
	// happened and until when the renewed lease was valid.
	var mu sync.Mutex
	type renewal struct{ at, validUntil time.Time }
	var renewals []renewal
	healthy.answer = func(l *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		renewals = append(renewals, renewal{at: clk.Now(), validUntil: l.Expires})
		r := *l
		r.TTL, r.Expires = ttl, clk.Now().Add(ttl)
		return &r, nil
	}
	w.Hold(victim, healthy, leaseOn("ledger", ttl))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- w.Start(ctx) }()
	defer func() {
		cancel()
		stalled.answer() // Start waits for the calls in flight
		if err := <-done; err != nil {
			t.Errorf("Start = %v", err)
		}
	}()
	for !clk.HasWaiters() { // until Start has made its ticker
		runtime.Gosched()
	}

	for round := range 3 {
		l, _, ok := w.Holding(victim)
		if !ok {
			t.Fatalf("round %d: the victim's lease is no longer held; lost: %v", round, lost.Refs())
		}
		// Move to when the victim's lease is due, a tick at a time, then
		// stop the clock well before the lease expires: the renewal must
		// come with no more time passing.
		for clk.Now().Before(l.Expires.Add(-2 * ttl / 3)) {
			clk.Step(time.Second)
		}
		deadline := time.Now().Add(waitFor)
		for {
			if got, _, ok := w.Holding(victim); ok && got.Expires.After(l.Expires) {
				break
			}
			if slices.Contains(lost.Refs(), victim) || time.Now().After(deadline) {
				calls, most := stalled.stats()
				t.Fatalf("round %d at %v: the victim's lease, expiring at %v, was not renewed (lost: %v) while %d calls to the stalled backend were made, %d in flight at most",
					round, clk.Now().Sub(t0), l.Expires.Sub(t0), slices.Contains(lost.Refs(), victim), calls, most)
			}
			runtime.Gosched()
		}
	}
	if slices.Contains(lost.Refs(), victim) {
		t.Errorf("the victim's lease was reported lost")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, r := range renewals {
		if !r.at.Before(r.validUntil) {
			t.Errorf("renewal %d at %v came after the lease expired at %v", i, r.at.Sub(t0), r.validUntil.Sub(t0))
		}
	}
	if calls, _ := stalled.stats(); calls == 0 {
		t.Error("no renewal was sent to the stalled backend: the test did not stall anything")
	}
}

// TestFreePlacesGoToTheEarliestExpiryFirst: with room for one call at a
// time, the due batches are sent in the order their leases expire.
func TestFreePlacesGoToTheEarliestExpiryFirst(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	w := watchdog.New(nil, watchdog.WithClock(clk), watchdog.WithMaxBatches(1))
	var mu sync.Mutex
	var order []string
	// All due now (less than two thirds of the TTL left), each on its own backend.
	validFor := map[string]time.Duration{"in-12s": 12 * time.Second, "in-3s": 3 * time.Second, "in-20s": 20 * time.Second, "in-7s": 7 * time.Second, "in-16s": 16 * time.Second}
	for key, d := range validFor {
		b := newFakeLocker(clk)
		b.inFlight = func() {
			mu.Lock()
			order = append(order, key)
			mu.Unlock()
		}
		w.Hold(job(key), b, leaseOn(key, d))
	}
	for range validFor {
		w.RenewDue(t.Context())
	}
	want := []string{"in-3s", "in-7s", "in-12s", "in-16s", "in-20s"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("renewal order (-want,+got):\n%s", diff)
	}
}

// TestABackendHasAtMostItsShareOfTheCallsInFlight: a backend whose calls do
// not come back has at most WithMaxBatchesPerBackend of them in flight,
// however many of its batches are due; another backend's lease is renewed
// meanwhile.
func TestABackendHasAtMostItsShareOfTheCallsInFlight(t *testing.T) {
	t.Parallel()
	const perBackend = 2
	clk := clocktesting.NewFakeClock(t0)
	lost := &lostRecorder{}
	w := watchdog.New(lost.record, watchdog.WithClock(clk), watchdog.WithMaxBatchesPerBackend(perBackend))
	stalled := newStalledLocker(t)
	for i := range 6 {
		ttl := ttl + time.Duration(i)*time.Second // a call per lease
		w.Hold(attacker(i), stalled, &lock.Lease{Keys: []string{attacker(i).Name}, Owner: "o", Fence: 1, TTL: ttl, Acquired: t0, Expires: t0.Add(ttl / 2)})
	}
	healthy := newFakeLocker(clk)
	w.Hold(job("healthy"), healthy, leaseOn("healthy", ttl))
	clk.Step(ttl / 3) // everything is due

	var looks sync.WaitGroup
	defer looks.Wait()
	defer stalled.answer()
	for range 3 {
		looks.Go(func() { w.RenewDue(t.Context()) })
	}
	untilExpires(t, w, "healthy", t0.Add(ttl/3+ttl))
	// Let every look start what it would start.
	deadline := time.Now().Add(waitFor)
	for calls, _ := stalled.stats(); calls < perBackend; calls, _ = stalled.stats() {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls to the stalled backend, want %d", calls, perBackend)
		}
		runtime.Gosched()
	}
	w.RenewDue(t.Context()) // a look that finds the backend at its bound starts nothing, and returns
	if calls, most := stalled.stats(); most > perBackend || calls > perBackend {
		t.Errorf("%d calls to the stalled backend, %d in flight at once; want at most %d", calls, most, perBackend)
	}
	if refs := lost.Refs(); len(refs) != 0 {
		t.Errorf("lost %v", refs)
	}
}
