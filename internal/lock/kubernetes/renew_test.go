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
	// A prefix of its own: only this run's sessions are listed.
	cfg := Config{Prefix: "collect-" + newName()}
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

// readCounter counts the API reads (GET requests, lists included) made
// through a rest.Config it wraps.
type readCounter struct {
	mu    sync.Mutex
	reads int
	next  http.RoundTripper
}

func (c *readCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		c.mu.Lock()
		c.reads++
		c.mu.Unlock()
	}
	return c.next.RoundTrip(r)
}

// TestInspectManyAnswersAsInspect: InspectMany of 60 locks (one held, one
// queued on, the others free or never used) reports what Inspect reports for
// each, in a few reads (one list of the keys, and the holders' sessions)
// rather than one read per lock; an invalid set fails alone.
func TestInspectManyAnswersAsInspect(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	c := &readCounter{}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.next = rt; return c }
	l := newTestLocker(t, Config{Client: clientFor(t, cfg), Prefix: "inspect-many"})
	other := newTestLocker(t, Config{Prefix: "inspect-many"}, WithWaiterTTL(30*time.Second))
	const locks = 60
	keys := make([][]string, locks)
	for i := range keys {
		keys[i] = []string{fmt.Sprintf("im/%d", i), fmt.Sprintf("im/%d/b", i)}
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: keys[0], TTL: time.Minute, Holder: "first"}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, lock.Request{Keys: keys[0][:1], TTL: time.Minute, Holder: "waiter", Owner: "waiter-owner", Queue: true}); err == nil {
		t.Fatal("the waiter took a held key")
	}
	for i := 2; i < locks; i += 2 {
		lease, err := other.TryAcquire(ctx, lock.Request{Keys: keys[i], TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
	}
	before := c.reads
	states, errs := l.InspectMany(ctx, append(keys, nil))
	if reads := c.reads - before; reads > 3 {
		t.Errorf("InspectMany of %d locks made %d reads, want a list and the sessions' reads", locks, reads)
	}
	if errs[locks] == nil {
		t.Error("an empty set of keys: no error")
	}
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("locks[%d]: %v", i, errs[i])
		}
		want, err := l.Inspect(ctx, keys[i])
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(states[i]) != fmt.Sprint(want) {
			t.Fatalf("locks[%d]: InspectMany = %+v, Inspect = %+v", i, states[i], want)
		}
	}
	if !states[0][0].Held || states[0][0].Holder != "first" || states[0][0].Queued != 1 || states[2][0].Held || states[2][0].Fence == 0 {
		t.Fatalf("InspectMany = %+v / %+v: want the first lock held with one waiter, the third free with a token", states[0], states[2])
	}
}
