package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// writeCounter counts the API writes (POST, PUT, PATCH, DELETE) made
// through a rest.Config it wraps.
type writeCounter struct {
	mu     sync.Mutex
	writes int
	next   http.RoundTripper
}

func (c *writeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		c.mu.Lock()
		c.writes++
		c.mu.Unlock()
	}
	return c.next.RoundTrip(r)
}

func (c *writeCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// countingLocker returns a Locker whose API writes c counts.
func countingLocker(t *testing.T, prefix string) (*Locker, *writeCounter) {
	c := &writeCounter{}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.next = rt; return c }
	return newTestLocker(t, Config{Client: clientFor(t, cfg), Prefix: prefix}), c
}

// TestRenewAllWritesOncePerSession: renewing 100 leases of one TTL is one
// API write (their session), and renewing them again is one more; the
// keys are read, not written. A store that renewed each lease (as the
// other stores do) writes 100 times.
func TestRenewAllWritesOncePerSession(t *testing.T) {
	needEnv(t)
	l, c := countingLocker(t, "renew-o1")
	ctx := context.Background()
	const n, ttl = 100, time.Minute
	leases := make([]*lock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.TryAcquire(ctx, lock.Request{Keys: []string{fmt.Sprintf("renew/%d", i)}, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		before := c.count()
		renewed, errs := l.RenewAll(ctx, leases, ttl)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: RenewAll[%d]: %v", round, i, err)
			}
		}
		if w := c.count() - before; w != 1 {
			t.Fatalf("round %d: renewing %d leases made %d API writes, want 1 (their session)", round, n, w)
		}
		leases = renewed
	}
	// A lease renewed with another TTL moves to that TTL's session: one
	// write for the new session and one for its key.
	before := c.count()
	if _, err := l.Renew(ctx, leases[0], 2*ttl); err != nil {
		t.Fatal(err)
	}
	if w := c.count() - before; w > 3 {
		t.Fatalf("moving one lease to another TTL made %d API writes, want at most 3 (the old session, the new one, the key)", w)
	}
}

func TestLockerReadsItsClock(t *testing.T) {
	needEnv(t)
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		return newTestLocker(t, Config{Prefix: "clock"}, WithClock(c))
	})
}

// BenchmarkRenewAll measures one renewal round of held leases
// (LOCKWARDEN_BENCH_LEASES, default 1000): one list of the keys and one
// session write.
func BenchmarkRenewAll(b *testing.B) {
	if env == nil {
		b.Skip("needs kube-apiserver and etcd")
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	l := newTestLocker(b, Config{Client: clientFor(b, cfg), Prefix: "bench"})
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), b.Name())
}
