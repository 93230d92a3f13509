package locktest

import (
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// CheckClock checks that a Locker reads the clock it was given (each
// store's WithClock) for its leases: Acquired is the clock's time when the
// acquisition started, Expires at most a TTL after it, and a renewal after
// the clock moved counts from the new time. newLocker returns a Locker on
// the backend that reads c.
func CheckClock(t *testing.T, newLocker func(t *testing.T, c *testingclock.FakeClock) lock.Locker) {
	// Far from the real time, so that a store reading the real clock shows.
	start := time.Date(2031, 7, 1, 3, 0, 0, 0, time.UTC)
	c := testingclock.NewFakeClock(start)
	l := newLocker(t, c)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	lease := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "clocked"})
	if !lease.Acquired.Equal(start) {
		t.Fatalf("Acquired = %v, want the Locker's clock %v", lease.Acquired, start)
	}
	if !lease.Expires.After(start) || lease.Expires.After(start.Add(longTTL)) {
		t.Fatalf("Expires = %v, want within (%v, %v]", lease.Expires, start, start.Add(longTTL))
	}
	c.Step(3 * time.Second)
	renewed, err := l.Renew(ctx, lease, longTTL)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if now := c.Now(); !renewed.Expires.After(lease.Expires) || renewed.Expires.After(now.Add(longTTL)) {
		t.Fatalf("after the clock moved 3s, the renewal's Expires = %v, want after %v and at most %v", renewed.Expires, lease.Expires, now.Add(longTTL))
	}
	mustRelease(t, l, renewed)
}
