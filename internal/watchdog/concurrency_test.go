package watchdog_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// waitFor gives up after a while that no scheduling delay explains.
const waitFor = 10 * time.Second

func receive(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitFor):
		t.Fatalf("%s: nothing within %v", what, waitFor)
	}
}

// untilExpires waits until the watchdog holds for ref a lease expiring at want
// (its renewal was answered and recorded).
func untilExpires(t *testing.T, w *watchdog.Watchdog, name string, want time.Time) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		l, _, ok := w.Holding(job(name))
		if ok && l.Expires.Equal(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s: held %v, expiring at %v; want it renewed until %v", name, ok, l.Expires, want)
		}
		runtime.Gosched()
	}
}

// TestABlockedBackendDoesNotDelayAnother: while one backend does not answer
// a renewal, the leases of another backend are still renewed on every tick
// that finds them due; and the blocked backend's leases are not sent to it
// again while its call is in flight.
func TestABlockedBackendDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	w := watchdog.New(nil, watchdog.WithClock(clk), watchdog.WithTick(time.Second))
	stuck, healthy := newFakeLocker(clk), newFakeLocker(clk)
	stuckCalled, unblock := make(chan struct{}, 10), make(chan struct{})
	stuck.inFlight = func() {
		stuckCalled <- struct{}{}
		<-unblock
	}
	healthyCalled := make(chan struct{}, 10)
	healthy.inFlight = func() { healthyCalled <- struct{}{} }
	w.Hold(job("stuck"), stuck, leaseOn("stuck", ttl))
	w.Hold(job("healthy"), healthy, leaseOn("healthy", ttl))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- w.Start(ctx) }()
	defer func() {
		close(unblock)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start = %v", err)
		}
	}()
	for !clk.HasWaiters() { // until Start has made its ticker
		runtime.Gosched()
	}

	// t0+10s: both leases are due; the stuck backend does not answer.
	clk.Step(ttl / 3)
	receive(t, stuckCalled, "first renewal on the stuck backend")
	receive(t, healthyCalled, "first renewal on the healthy backend")
	untilExpires(t, w, "healthy", t0.Add(ttl/3+ttl))

	// t0+20s: the healthy lease is due again, the stuck call still in flight.
	clk.Step(ttl / 3)
	receive(t, healthyCalled, "renewal on the healthy backend while the other one is stuck")
	untilExpires(t, w, "healthy", t0.Add(2*ttl/3+ttl))

	// The stuck backend's lease is due too, but its call is still in
	// flight: a look now sends nothing to it (nor waits for it).
	looked := make(chan struct{})
	go func() {
		w.RenewDue(ctx)
		close(looked)
	}()
	receive(t, looked, "RenewDue while a batch of the stuck backend is in flight")
	if n := len(stuckCalled); n != 0 {
		t.Errorf("%d more RenewAll calls to the stuck backend while its first was in flight, want none", n)
	}
}

// TestMaxBatchesBoundsTheCallsInFlight: with room for one call in flight, a
// second backend's due batch waits until the first is answered.
func TestMaxBatchesBoundsTheCallsInFlight(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	w := watchdog.New(nil, watchdog.WithClock(clk), watchdog.WithMaxBatches(1))
	a, b := newFakeLocker(clk), newFakeLocker(clk)
	called, unblock := make(chan struct{}, 10), make(chan struct{})
	a.inFlight = func() {
		called <- struct{}{}
		<-unblock
	}
	b.inFlight = a.inFlight
	w.Hold(job("a"), a, leaseOn("a", ttl))
	w.Hold(job("b"), b, leaseOn("b", ttl))
	clk.Step(ttl / 3)

	first := make(chan struct{})
	go func() {
		w.RenewDue(t.Context())
		close(first)
	}()
	receive(t, called, "the first batch")
	// The other batch found no room: this look starts nothing and returns.
	w.RenewDue(t.Context())
	if n := len(called); n != 0 {
		t.Fatalf("%d more calls in flight, want at most 1 at a time", n)
	}
	unblock <- struct{}{}
	receive(t, first, "RenewDue after its batch was answered")
	// Now the waiting batch goes.
	second := make(chan struct{})
	go func() {
		w.RenewDue(t.Context())
		close(second)
	}()
	receive(t, called, "the batch that waited for room")
	close(unblock)
	receive(t, second, "RenewDue after its batch was answered")
	if got := len(a.Calls()) + len(b.Calls()); got != 2 {
		t.Errorf("%d RenewAll calls in all, want 2: one per backend", got)
	}
}
