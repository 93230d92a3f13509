package watchdog_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// These tests are about the renewal of a lease close to or past its
// expiry: a call that can only come back after the lease expired, and a
// lease found expired before a renewal was sent.

// deadlineLocker records the time left before each call's context ends.
type deadlineLocker struct {
	*fakeLocker
	mu   sync.Mutex
	left []time.Duration // -1: no deadline
}

func (d *deadlineLocker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.mu.Lock()
	d.left = append(d.left, left)
	d.mu.Unlock()
	return d.fakeLocker.RenewAll(ctx, leases, ttl)
}

// TestACallEndsByTheTimeItsFirstLeaseExpires: a renewal that comes back
// after a lease expired cannot keep it, so the call's context ends no later
// than the earliest expiry of the leases it carries, whatever the backend's
// own timeouts (etcd: 5 s per request).
func TestACallEndsByTheTimeItsFirstLeaseExpires(t *testing.T) {
	t.Parallel()
	w, clk, _ := newWatchdog(t)
	backend := &deadlineLocker{fakeLocker: newFakeLocker(clk)}
	// One call: "due" is due, the others within a sixth of the TTL; "soon"
	// expires first, 18s from now.
	w.Hold(job("due"), backend, leaseOn("due", 20*time.Second))
	w.Hold(job("soon"), backend, leaseOn("soon", 18*time.Second))
	w.Hold(job("later"), backend, leaseOn("later", 24*time.Second))
	w.RenewDue(t.Context())

	if diff := cmp.Diff([]renewCall{{Keys: []string{"due", "later", "soon"}, TTL: ttl}}, backend.Calls()); diff != "" {
		t.Fatalf("RenewAll calls (-want,+got):\n%s", diff)
	}
	backend.mu.Lock()
	defer backend.mu.Unlock()
	if left := backend.left[0]; left < 0 || left > 18*time.Second {
		t.Errorf("the call's context ends %v after it started (negative: never), want no later than the first expiry, 18s after", left)
	}
}

// TestALeaseThatExpiresWhileItsRenewalsFailIsNotSentAgain: once a lease whose
// renewals failed has expired, the watchdog reports it lost with the last
// failure, and sends it to the backend no more.
func TestALeaseThatExpiresWhileItsRenewalsFailIsNotSentAgain(t *testing.T) {
	t.Parallel()
	w, clk, lost := newWatchdog(t)
	backend := newFakeLocker(clk)
	timeout := errors.New("i/o timeout")
	backend.answer = func(*lock.Lease, time.Duration) (*lock.Lease, error) { return nil, timeout }
	w.Hold(job("a"), backend, leaseOn("a", ttl))

	clk.Step(ttl / 3)
	w.RenewDue(t.Context()) // fails; the lease is still valid
	clk.Step(2 * ttl / 3)
	w.RenewDue(t.Context()) // expired: reported lost, not sent
	clk.Step(ttl)
	w.RenewDue(t.Context())

	if got := len(backend.Calls()); got != 1 {
		t.Errorf("%d RenewAll calls, want 1: none once the lease expired", got)
	}
	if diff := cmp.Diff([]holder.Ref{job("a")}, lost.Refs()); diff != "" {
		t.Fatalf("leases reported lost (-want,+got):\n%s", diff)
	}
	if err := lost.lost[0].Err; !errors.Is(err, lock.ErrLost) || !errors.Is(err, timeout) {
		t.Errorf("Lost.Err = %v, want it to match lock.ErrLost and carry the last failure", err)
	}
	if _, _, ok := w.Holding(job("a")); ok {
		t.Error("the expired lease is still held")
	}
}
