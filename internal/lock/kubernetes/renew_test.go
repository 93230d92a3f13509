package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// TestDeadSessionsAreCollected: a process that held a lease and died
// leaves its session behind; once another Locker has seen it unchanged for
// its TTL, it deletes it (and the lease it carried is free), while its own
// live session and another process's live one stay.
func TestDeadSessionsAreCollected(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	cfg := Config{Prefix: "collect"}
	dead := newTestLocker(t, cfg)
	if _, err := dead.TryAcquire(ctx, lock.Request{Keys: []string{"collect/a"}, TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	_ = dead.Close() // a crash: nothing released, nothing deleted
	alive := newTestLocker(t, cfg)
	held, err := alive.TryAcquire(ctx, lock.Request{Keys: []string{"collect/b"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	collector := newTestLocker(t, cfg, func(o *options) { o.collectEvery = 0 })
	mine, err := collector.TryAcquire(ctx, lock.Request{Keys: []string{"collect/c"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sessions := func() int {
		list, err := collector.leases.List(ctx, metav1.ListOptions{LabelSelector: collector.selector(roleSession)})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	if n := sessions(); n != 3 {
		t.Fatalf("%d sessions, want 3 (dead, alive, collector)", n)
	}
	// The first pass sees the dead session; a pass after its TTL deletes it.
	collector.RenewAll(ctx, nil, time.Minute)
	time.Sleep(400 * time.Millisecond)
	collector.RenewAll(ctx, nil, time.Minute)
	if n := sessions(); n != 2 {
		t.Fatalf("%d sessions after the dead one's TTL, want 2 (alive, collector)", n)
	}
	if _, err := alive.Renew(ctx, held, time.Minute); err != nil {
		t.Fatalf("the live session's lease: %v", err)
	}
	if _, err := collector.Renew(ctx, mine, time.Minute); err != nil {
		t.Fatalf("the collector's own lease: %v", err)
	}
	if _, err := alive.TryAcquire(ctx, lock.Request{Keys: []string{"collect/a"}, TTL: time.Minute}); err != nil {
		t.Fatalf("the dead session's key: %v, want it free", err)
	}
}
