package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// calls counts the gRPC calls a Locker makes, by method.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[method[strings.LastIndex(method, "/")+1:]]++
}

func (c *calls) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// counting is an Option that counts the Locker's calls in c.
func counting(c *calls) Option {
	c.n = map[string]int{}
	return func(o *options) {
		o.grpc = append(o.grpc,
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				c.add(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				c.add(method)
				return streamer(ctx, desc, cc, method, opts...)
			}))
	}
}

// TestRenewAllKeepsOneSessionAlive: renewing 100 leases is one keepalive of
// the Locker's session and two read-only transactions (64 keys each), with
// no grant and no write; a lease per acquisition made 100 keepalive streams
// and 100 transactions. A lease renewed with another TTL moves to that
// TTL's session once.
func TestRenewAllKeepsOneSessionAlive(t *testing.T) {
	m := etcdtest.Start(t)
	var c calls
	l := newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: "/session-o1/"}, counting(&c))
	ctx := ctxT(t, time.Minute)
	const n, ttl = 100, time.Minute
	leases := make([]*lock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.TryAcquire(ctx, lock.Request{Keys: []string{fmt.Sprintf("renew/%d", i)}, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.snapshot()["LeaseGrant"]; got != 1 {
		t.Fatalf("%d acquisitions granted %d etcd leases, want 1 (the session)", n, got)
	}
	for round := range 2 {
		before := c.snapshot()
		renewed, errs := l.RenewAll(ctx, leases, ttl)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: RenewAll[%d]: %v", round, i, err)
			}
		}
		after := c.snapshot()
		if d := after["LeaseKeepAlive"] - before["LeaseKeepAlive"]; d != 1 {
			t.Errorf("round %d: renewing %d leases opened %d keepalive streams, want 1 (the session)", round, n, d)
		}
		if d := after["Txn"] - before["Txn"]; d != 2 {
			t.Errorf("round %d: renewing %d leases made %d transactions, want 2 reads of 64 keys at most", round, n, d)
		}
		if d := after["LeaseGrant"] - before["LeaseGrant"] + after["Put"] - before["Put"]; d != 0 {
			t.Errorf("round %d: renewing made %d grants and puts, want none", round, d)
		}
		for i, le := range renewed {
			if !le.Expires.After(leases[i].Expires) {
				t.Fatalf("round %d: lease %d Expires %v, want after %v", round, i, le.Expires, leases[i].Expires)
			}
		}
		leases = renewed
	}
	// Another TTL: a session of its own, and the lease's keys moved to it
	// in one transaction (beside the read).
	before := c.snapshot()
	moved, err := l.Renew(ctx, leases[0], 2*ttl)
	if err != nil {
		t.Fatal(err)
	}
	after := c.snapshot()
	if g, tx := after["LeaseGrant"]-before["LeaseGrant"], after["Txn"]-before["Txn"]; g != 1 || tx != 2 {
		t.Errorf("moving a lease to another TTL made %d grants and %d transactions, want 1 and 2 (read, move)", g, tx)
	}
	before = c.snapshot()
	if _, err := l.Renew(ctx, moved, 2*ttl); err != nil {
		t.Fatal(err)
	}
	after = c.snapshot()
	if k, tx := after["LeaseKeepAlive"]-before["LeaseKeepAlive"], after["Txn"]-before["Txn"]; k != 1 || tx != 1 {
		t.Errorf("renewing the moved lease made %d keepalives and %d transactions, want 1 and 1", k, tx)
	}
}

// TestSessionExpiryLosesLeases: a Locker that renews nothing for longer
// than the TTL loses its session, and the leases on it (etcd deleted their
// keys: another owner takes them); its next acquisition gets a new session.
func TestSessionExpiryLosesLeases(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/session-expiry/"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxT(t, time.Minute)
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"a"}, TTL: 2 * time.Second, Holder: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	// The key is free once etcd expired the session (its leader checks
	// every 500ms): the other owner takes it.
	var taken *lock.Lease
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		taken, err = other.TryAcquire(ctx, lock.Request{Keys: []string{"a"}, TTL: time.Minute, Holder: "other"})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the key of a session nobody kept alive stayed held: %v", err)
	}
	if _, err := l.Renew(ctx, lease, 2*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after the session expired = %v, want ErrLost", err)
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"b"}, TTL: 2 * time.Second}); err != nil {
		t.Fatalf("an acquisition after the session expired: %v, want a new session", err)
	}
	mustReleaseT(t, other, taken)
}

// TestLostReplyLeavesLaterLeaseAlone: an acquisition whose reply was lost
// is undone by the exact value it wrote, never by owner: a later
// acquisition of the same owner from another process stays
// (locktest.RunLostReply).
func TestLostReplyLeavesLaterLeaseAlone(t *testing.T) {
	m := etcdtest.Start(t)
	locktest.RunLostReply(t, m.Addr, func(t *testing.T, addr string) lock.Locker {
		return newTestLocker(t, Config{Endpoints: []string{addr}, Prefix: "/lost-reply/"}, WithOpTimeout(locktest.LostReplyTimeout))
	})
}

// TestUnusedAcquisitionsAreUndone: the keys of an acquisition whose reply
// was lost, and of a release that failed, are deleted once etcd answers
// again, while the Locker keeps its session alive (it renews another
// lease); left alone they would stay held for as long as the Locker lives.
func TestUnusedAcquisitionsAreUndone(t *testing.T) {
	m := etcdtest.Start(t)
	link := locktest.NewLink(t, m.Addr)
	cfg := Config{Endpoints: []string{link.Addr()}, Prefix: "/undo/"}
	l := newTestLocker(t, cfg, WithOpTimeout(2*time.Second))
	other := newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: cfg.Prefix})
	ctx := ctxT(t, 2*time.Minute)
	const ttl = time.Minute
	keep, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"keep"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	renewing, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewing)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			mu.Lock()
			if next, err := l.Renew(ctx, keep, ttl); err == nil {
				keep = next
			}
			mu.Unlock()
		}
	}()
	defer func() { close(stop); <-renewing }()

	heal := link.DropReplies()
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"lost", "lost-too"}, TTL: ttl, Holder: "lost"}); err == nil {
		t.Fatal("TryAcquire returned a lease although its reply was dropped")
	}
	heal()
	waitFree(t, other, "lost", "lost-too")

	held, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"released"}, TTL: ttl, Holder: "released"})
	if err != nil {
		t.Fatal(err)
	}
	heal = link.Cut()
	if err := l.Release(ctx, held); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Release through a cut link = %v, want ErrBackendUnavailable", err)
	}
	heal()
	waitFree(t, other, "released")
	mu.Lock()
	defer mu.Unlock()
	if _, err := l.Renew(ctx, keep, ttl); err != nil {
		t.Fatalf("the lease that kept the session alive: %v", err)
	}
}

// waitFree waits until no lease holds keys, as l sees them.
func waitFree(t *testing.T, l lock.Locker, keys ...string) {
	t.Helper()
	var last []lock.KeyState
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := l.Inspect(ctx, keys)
		if err != nil {
			return false, nil
		}
		last = st
		for _, s := range st {
			if s.Held {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("keys %q still held (%+v): %v", keys, last, err)
	}
}

func mustReleaseT(t *testing.T, l lock.Locker, lease *lock.Lease) {
	t.Helper()
	if err := l.Release(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
}

// TestAcquisitionsEndWithTheirSession: an acquisition on a session
// confirmed earlier expires with the session (its keepalive's start + TTL),
// not a TTL after the acquisition started; once less than half the TTL of
// the session is left, the acquisition keeps it alive first. Computing
// Expires from the acquisition's start would promise up to half a TTL that
// etcd does not keep.
func TestAcquisitionsEndWithTheirSession(t *testing.T) {
	m := etcdtest.Start(t)
	var c calls
	clk := testingclock.NewFakePassiveClock(time.Now())
	l := newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: "/session-expires/"}, counting(&c), WithClock(clk))
	ctx := ctxT(t, time.Minute)
	const ttl = 10 * time.Second
	first, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"a"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(4 * time.Second))
	second, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"b"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Expires.Equal(first.Expires) {
		t.Fatalf("an acquisition 4s after its session's grant expires at %v, want the session's %v (the first acquisition's)", second.Expires, first.Expires)
	}
	if k := c.snapshot()["LeaseKeepAlive"]; k != 0 {
		t.Fatalf("%d keepalives with more than half the TTL of the session left, want none", k)
	}
	clk.SetTime(clk.Now().Add(2 * time.Second))
	start := clk.Now()
	third, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"c"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if k := c.snapshot()["LeaseKeepAlive"]; k != 1 {
		t.Fatalf("%d keepalives with less than half the TTL of the session left, want 1", k)
	}
	if want := start.Add(ttl - drift(ttl)); !third.Expires.Equal(want) {
		t.Fatalf("an acquisition that kept its session alive expires at %v, want %v", third.Expires, want)
	}
}
