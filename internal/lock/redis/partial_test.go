package redis

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// Redlock under partial failure: one node slow, stale or behind.

// newOwner returns a fresh owner token.
func newOwner(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// queuedOn counts the waiters in key's queue on one server.
func queuedOn(t *testing.T, s *redistest.Server, key string) int64 {
	t.Helper()
	n, err := s.Client().ZCard(context.Background(), "{"+key+"}:queue").Result()
	if err != nil {
		t.Fatalf("ZCARD on %s: %v", s.Addr, err)
	}
	return n
}

// TestRedlockWinnerLeavesMinorityQueue: a queued Redlock request that one
// node refuses but a majority grants must not stay queued on the refusing
// node. Otherwise every later acquirer leaves its own entry there behind the
// previous one, and one stale lock on one node takes that node away from the
// key for good: with another node down the key can no longer be taken.
func TestRedlockWinnerLeavesMinorityQueue(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	const key = "phantom"
	// A lock of a crashed client, left on node 0 only.
	if err := servers[0].Client().Set(ctx, "{"+key+"}:lock", "crashed-owner", 500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithWaiterTTL(5*time.Second))
	cycle := func(i int) {
		t.Helper()
		lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: newOwner(t), Holder: fmt.Sprintf("cycle-%d", i), Queue: true})
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := l.Release(ctx, lease); err != nil {
			t.Fatalf("cycle %d: release: %v", i, err)
		}
	}
	// Steady traffic while the stale lock lives, and one cycle after it expired.
	i := 0
	for ; ; i++ {
		cycle(i)
		n, err := servers[0].Client().Exists(ctx, "{"+key+"}:lock").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cycle(i + 1)
	t.Logf("%d cycles; node 0 queue after them: %d waiters (every acquirer returned)", i+2, queuedOn(t, servers[0], key))

	// Node 0 must be usable again: with node 1 down, nodes 0 and 2 are a majority.
	servers[1].Kill()
	defer servers[1].Restart()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: newOwner(t), Holder: "after", Queue: true})
	if err != nil {
		t.Fatalf("queued acquisition with node 1 down, the stale lock on node 0 expired: %v; want a lease (nodes 0 and 2 are a majority)", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// pausedSetup starts 3 nodes, takes and releases key once (so that every
// node has its fence counter: see TestRedlockGrantReturnsWithoutPausedNode),
// pauses node 2 (SIGSTOP) and returns a Locker whose per-node timeout is far
// longer than the test.
func pausedSetup(t *testing.T, key string) ([]*redistest.Server, *Locker) {
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithNodeTimeout(10*time.Minute))
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	servers[2].Pause()
	t.Cleanup(servers[2].Resume)
	return servers, l
}

// tryWithin runs TryAcquire under a context of a few seconds and fails the
// test when it has not returned by then (it is waiting for the paused node).
// The context is shorter than what one call to a paused node costs even
// with the long node timeout: go-redis ends a read after its own ReadTimeout
// (3s by default), so a call to a paused node takes about 5s here.
func tryWithin(t *testing.T, l *Locker, req lock.Request) (*lock.Lease, error) {
	t.Helper()
	const within = 4 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	type out struct {
		lease *lock.Lease
		err   error
	}
	done := make(chan out, 1)
	start := time.Now()
	go func() {
		lease, err := l.TryAcquire(ctx, req)
		if ctx.Err() != nil {
			// It returned only because its context ended.
			err = fmt.Errorf("returned at the end of its context (%w); result: %w", ctx.Err(), err)
			lease = nil
		}
		done <- out{lease, err}
	}()
	select {
	case o := <-done:
		t.Logf("TryAcquire returned after %v: %v", time.Since(start).Round(time.Microsecond), o.err)
		return o.lease, o.err
	case <-time.After(within + time.Second):
		t.Fatal("TryAcquire did not return by its context's deadline: it waits for the paused node although the outcome was decided")
		return nil, nil
	}
}

// TestRedlockBusyReturnsWithoutPausedNode: with one node paused and the key
// held on the two others, the outcome is decided by their answers: the
// attempt returns the *lock.HeldError without waiting for the paused node
// (nor releasing anything on it: it granted nothing).
func TestRedlockBusyReturnsWithoutPausedNode(t *testing.T) {
	servers, l := pausedSetup(t, "busy")
	ctx := context.Background()
	for _, s := range servers[:2] {
		if err := s.Client().Set(ctx, "{busy}:lock", "other-owner", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := tryWithin(t, l, lock.Request{Keys: []string{"busy"}, TTL: time.Hour})
	var held *lock.HeldError
	if !errors.As(err, &held) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire of a key held on 2 of 3 nodes, the third paused: %v; want a *lock.HeldError, not a context error", err)
	}
}

// TestRedlockGrantReturnsWithoutPausedNode: a free key is granted by the two
// live nodes without waiting for the paused one; Close then ends the
// call still waiting for the paused node instead of leaking it. (The key was
// used before: on a key's first acquisition the nodes issue different
// tokens, and the attempt waits for every node so that the lease's token is
// the largest issued and written back to all of them.)
func TestRedlockGrantReturnsWithoutPausedNode(t *testing.T) {
	_, l := pausedSetup(t, "free")
	lease, err := tryWithin(t, l, lock.Request{Keys: []string{"free"}, TTL: time.Hour})
	if err != nil {
		t.Fatalf("TryAcquire of a free key with 2 of 3 nodes live: %v; want a lease", err)
	}
	if lease.Expires.Before(time.Now().Add(50 * time.Minute)) {
		t.Fatalf("lease expires %v: the attempt spent its validity waiting", lease.Expires)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Logf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return: it waits for the call to the paused node")
	}
	if n := l.bg.running(); n != 0 {
		t.Fatalf("%d background goroutines still running after Close", n)
	}
}

// TestRedlockAttemptLatencyWithPausedNode prints what a busy attempt costs
// with one node paused and the default per-node timeout (not asserted).
func TestRedlockAttemptLatencyWithPausedNode(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	l, err := New(Config{Addrs: addrs(servers)}) // DefaultNodeTimeout
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers[:2] {
		if err := s.Client().Set(ctx, "{lat}:lock", "other-owner", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	servers[2].Pause()
	defer servers[2].Resume()
	const n = 10
	start := time.Now()
	for range n {
		if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"lat"}, TTL: time.Minute}); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("TryAcquire: %v, want ErrNotAcquired", err)
		}
	}
	t.Logf("busy attempt with 1 of 3 nodes paused, node timeout %v: %v per attempt", DefaultNodeTimeout, (time.Since(start) / n).Round(time.Microsecond))
}

// TestRedlockPrunedWaiterLosesItsPlace: a Redlock waiter that missed its
// heartbeats is pruned and, when it calls again, queues behind the waiters
// that joined meanwhile (docs/safety.md, "FIFO queues").
func TestRedlockPrunedWaiterLosesItsPlace(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	const waiterTTL = 200 * time.Millisecond
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithWaiterTTL(waiterTTL))
	holder, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"q"}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	w := lock.Request{Keys: []string{"q"}, TTL: time.Minute, Holder: "w", Owner: newOwner(t), Queue: true}
	var held *lock.HeldError
	if _, err := l.TryAcquire(ctx, w); !errors.As(err, &held) || held.Position != 0 {
		t.Fatalf("W joins: %v, want a HeldError at position 0", err)
	}
	// W misses its heartbeats past the waiter TTL.
	time.Sleep(2 * waiterTTL)
	v := lock.Request{Keys: []string{"q"}, TTL: time.Minute, Holder: "v", Owner: newOwner(t), Queue: true}
	if _, err := l.TryAcquire(ctx, v); !errors.As(err, &held) || held.Position != 0 {
		t.Fatalf("V joins after W was pruned: %v, want a HeldError at position 0", err)
	}
	if _, err := l.TryAcquire(ctx, w); !errors.As(err, &held) || held.Position != 1 {
		t.Fatalf("W calls again after it was pruned: %v, want a HeldError at position 1 (behind V)", err)
	}
	for i, s := range servers {
		q, err := s.Client().ZRange(ctx, "{q}:queue", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(q) != 2 || q[0] != v.Owner || q[1] != w.Owner {
			t.Fatalf("node %d: queue %q, want V then W", i, q)
		}
	}
	if err := l.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockNodesAgreeOnTicketOrder: a node that missed a waiter's join
// (down, then back empty) must still order it before a waiter that joined
// later, once the first waiter heartbeats. With per-node ticket counters the
// restarted node hands the later waiter a ticket that ties with or beats the
// earlier one's.
func TestRedlockNodesAgreeOnTicketOrder(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithWaiterTTL(5*time.Second))
	holder, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"t"}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	// Owners ordered against the join order, so that a tie puts Y first.
	x := lock.Request{Keys: []string{"t"}, TTL: time.Minute, Holder: "x", Owner: "owner-b-x", Queue: true}
	y := lock.Request{Keys: []string{"t"}, TTL: time.Minute, Holder: "y", Owner: "owner-a-y", Queue: true}
	servers[2].Kill()
	if _, err := l.TryAcquire(ctx, x); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("X joins with node 2 down: %v", err)
	}
	servers[2].Restart()
	waitReachable(t, l)
	if err := servers[2].Client().Set(ctx, "{t}:lock", holder.Owner, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, y); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Y joins: %v", err)
	}
	if _, err := l.TryAcquire(ctx, x); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("X heartbeats: %v", err)
	}
	for i, s := range servers {
		q, err := s.Client().ZRange(ctx, "{t}:queue", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(q) != 2 || q[0] != x.Owner || q[1] != y.Owner {
			t.Fatalf("node %d: queue %q, want X then Y on every node", i, q)
		}
	}
}

// TestRedlockWriteBackCountsOnlyHolders: the fence write-back counts a node
// only when raise.lua says the owner still holds the keys there. Here the
// lock key vanishes from nodes 1 and 2 between the grant and the write-back:
// only node 0 holds the lease, and no lease may be reported.
func TestRedlockWriteBackCountsOnlyHolders(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			servers := redistest.StartN(t, 3)
			ctx := context.Background()
			ahead := time.Now().Add(time.Hour).UnixMicro()
			if err := servers[0].Client().Set(ctx, "{wb}:fence", ahead, 0).Err(); err != nil {
				t.Fatal(err)
			}
			l := newTestLocker(t, Config{Addrs: addrs(servers)})
			l.beforeWriteBack = func() {
				for _, s := range servers[1:] {
					if err := s.Client().Del(ctx, "{wb}:lock", "{wb}:slots", "{wb}:slotfences", "{wb}:slotmeta").Err(); err != nil {
						t.Error(err)
					}
				}
			}
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"wb"}, TTL: time.Minute, Limit: limit})
			if err == nil {
				t.Fatalf("got lease %+v although only node 0 holds it after the write-back", lease)
			}
			if !errors.Is(err, lock.ErrQuorum) {
				t.Fatalf("TryAcquire: %v, want a quorum error", err)
			}
		})
	}
}

// TestRedlockMembersMustBeDistinct: two Redlock members that are the same
// server (same address written differently, or a name resolving to the same
// address) are refused, naming the field and both entries.
func TestRedlockMembersMustBeDistinct(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		field string
	}{
		{[]string{"localhost:6379", "127.0.0.1:6379", "127.0.0.1:6380"}, "Addrs[1]"},
		{[]string{"127.0.0.1:6379", "10.0.0.1:6379", "LOCALHOST:6379"}, "Addrs[2]"},
		{[]string{"[::1]:6379", "localhost:6379", "127.0.0.1:6380"}, "Addrs[1]"},
		{[]string{"[::ffff:10.0.0.1]:6379", "10.0.0.2:6379", "10.0.0.1:6379"}, "Addrs[2]"},
		{[]string{"10.0.0.1:6379", "10.0.0.1:06379", "10.0.0.2:6379"}, "Addrs[1]"},
		{[]string{"[2001:db8::1]:6379", "[2001:db8:0:0::1]:6379", "10.0.0.2:6379"}, "Addrs[1]"},
	} {
		err := Config{Addrs: c.addrs}.Validate()
		var ce *lock.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%q: %v, want a lock.ConfigError on %s", c.addrs, err, c.field)
			continue
		}
		if i := strings.Index(c.field, "["); !strings.Contains(err.Error(), c.addrs[c.field[i+1]-'0']) {
			t.Errorf("%q: %q does not name the entry", c.addrs, err)
		}
	}
	// Distinct servers are accepted.
	if err := (Config{Addrs: []string{"127.0.0.1:6379", "127.0.0.2:6379", "localhost:6380"}}).Validate(); err != nil {
		t.Errorf("distinct members refused: %v", err)
	}

	// Names are resolved when the Locker pings.
	l, err := New(Config{Addrs: []string{"redis-a.test:6379", "127.0.0.1:6379", "redis-c.test:6379"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "redis-a.test":
			return []netip.Addr{netip.MustParseAddr("10.1.1.1")}, nil
		case "redis-c.test":
			return []netip.Addr{netip.MustParseAddr("10.1.1.2"), netip.MustParseAddr("::ffff:127.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	err = l.Ping(context.Background())
	var ce *lock.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Addrs[2]" || !strings.Contains(err.Error(), "redis-c.test:6379") || !strings.Contains(err.Error(), "127.0.0.1:6379") {
		t.Fatalf("Ping with two members resolving to 127.0.0.1:6379: %v, want a lock.ConfigError on Addrs[2] naming both", err)
	}
}

// TestFenceLimitIsTheLargestValidToken: the largest token a lease may carry
// is lock.MaxFence - 1 (below MaxFence, as lock.Lease says), in the script as
// in Go: a counter one below it issues it; a counter at it refuses without
// issuing (or recording) anything beyond it.
func TestFenceLimitIsTheLargestValidToken(t *testing.T) {
	if maxToken != lock.MaxFence-1 {
		t.Fatalf("maxToken %d, want MaxFence - 1", maxToken)
	}
	s := redistest.Start(t)
	ctx := context.Background()
	c := s.Client()
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	if err := c.Set(ctx, "{max}:fence", maxToken-1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"max"}, TTL: time.Minute})
	if err != nil || lease.Fence != maxToken {
		t.Fatalf("counter at maxToken - 1: %+v, %v; want a lease with fence %d", lease, err, maxToken)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, lock.Request{Keys: []string{"max"}, TTL: time.Minute})
	if err == nil {
		t.Fatalf("counter at maxToken: got lease %+v, want a refusal", lease)
	}
	if !strings.Contains(err.Error(), "would exceed") {
		t.Fatalf("counter at maxToken: %v, want the script's refusal", err)
	}
	got, err := c.Get(ctx, "{max}:fence").Int64()
	if err != nil || got != maxToken {
		t.Fatalf("counter after the refusal: %d, %v; want it unchanged at %d", got, err, maxToken)
	}
	st, err := l.Inspect(ctx, []string{"max"})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Held || st[0].Fence >= lock.MaxFence {
		t.Fatalf("Inspect after the refusal: %+v, want a free key whose last token is below MaxFence", st[0])
	}
}

// TestRedlockInspectShowsAMaybeHeldKeyAsHeld: with a node away, a lease that
// the answering nodes show on fewer nodes than a majority may still hold the
// key through the missing node. Inspect must not call such a key free (no
// other lease can take it meanwhile); it names the holder, unconfirmed. With
// every node answering, the same minority is what it is: the key is free.
func TestRedlockInspectShowsAMaybeHeldKeyAsHeld(t *testing.T) {
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"maybe"}, TTL: time.Minute, Holder: "nightly"})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	inspect := func(what string) lock.KeyState {
		t.Helper()
		states, err := l.Inspect(ctx, []string{"maybe"})
		if err != nil {
			t.Fatalf("%s: Inspect: %v", what, err)
		}
		return states[0]
	}
	if st := inspect("all nodes"); !st.Held || st.Holders[0].Unconfirmed {
		t.Fatalf("all nodes: Inspect = held %v, holders %+v; want held, confirmed", st.Held, st.Holders)
	}

	// Node 1 loses the lease; node 2 goes away. Node 0 still shows it, and
	// node 2 may too: the key cannot be taken.
	if err := servers[1].Client().Del(ctx, "{maybe}:lock").Err(); err != nil {
		t.Fatal(err)
	}
	servers[2].Kill()
	st := inspect("node 2 away")
	if !st.Held || st.Holder != "nightly" || st.Fence != lease.Fence || st.HolderCount != 1 || !st.Holders[0].Unconfirmed {
		t.Fatalf("node 2 away: Inspect = held %v, holder %q, fence %d, %d holder(s) %+v; want held by %q with fence %d, one holder, unconfirmed",
			st.Held, st.Holder, st.Fence, st.HolderCount, st.Holders, "nightly", lease.Fence)
	}
	if time.Until(st.Expires) < 30*time.Second {
		t.Fatalf("node 2 away: Expires in %v; want about a minute (node 0's lease)", time.Until(st.Expires))
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"maybe"}, TTL: time.Minute, Holder: "other"}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire by another holder with node 2 away: %v; want it refused, as Inspect says", err)
	}

	// Node 2 comes back empty: the lease is on one node of three, and the
	// key is free.
	servers[2].Restart()
	waitReachable(t, l)
	if st := inspect("node 2 back, empty"); st.Held || st.HolderCount != 0 {
		t.Fatalf("node 2 back, empty: Inspect = held %v, holders %+v; want free", st.Held, st.Holders)
	}
}

// TestRedlockInspectCountsNoMoreMaybeHoldersThanTheLimit: with Redlock
// nodes away, a semaphore's slot seen on too few answering nodes may still
// be held through the missing ones (unconfirmed), but no more than the
// limit can hold at once. Five nodes, two slots (a quorum of four): three
// owners each hold a slot on two of the three nodes that answer (as crashed
// attempts leave them), so each could be completed by the two missing
// nodes. Inspect reports two of them, the oldest; before, it counted three
// holders of a two-slot semaphore.
func TestRedlockInspectCountsNoMoreMaybeHoldersThanTheLimit(t *testing.T) {
	servers := redistest.StartN(t, 5)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()
	// A slot on some of the nodes, as a standalone Locker on each node takes
	// it (the same keys as Redlock's on that node).
	single := make([]*Locker, 3)
	for i := range single {
		single[i] = newTestLocker(t, Config{Addrs: []string{servers[i].Addr}})
	}
	take := func(holder string, nodes ...int) {
		t.Helper()
		owner := newOwner(t)
		for _, i := range nodes {
			req := lock.Request{Keys: []string{"pool"}, TTL: time.Minute, Holder: holder, Owner: owner, Limit: 2}
			if _, err := single[i].TryAcquire(ctx, req); err != nil {
				t.Fatalf("TryAcquire by %s on node %d: %v", holder, i, err)
			}
		}
	}
	take("first", 0, 2)
	take("second", 0, 1)
	take("third", 1, 2)
	servers[3].Kill()
	servers[4].Kill()
	states, err := l.Inspect(ctx, []string{"pool"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	st := states[0]
	var got []string
	for _, h := range st.Holders {
		if !h.Unconfirmed {
			t.Errorf("holder %q reported confirmed; want unconfirmed (on two of five nodes)", h.Holder)
		}
		got = append(got, h.Holder)
	}
	if want := []string{"first", "second"}; st.HolderCount != 2 || !slices.Equal(got, want) {
		t.Fatalf("Inspect with nodes 3 and 4 away = %d holder(s) %q; want %d, %q (the limit, the oldest)", st.HolderCount, got, len(want), want)
	}
}

// TestRedlockSemaphoreHoldersNeverShareAToken: two semaphore holders whose
// acquisitions crossed on the nodes (each node issues its own tokens, in its
// own order) can each find their largest token on a different node, and the
// same value on both: the fault run found two holders of a Redlock-3
// semaphore with one token. Here the nodes issue, as standalone acquisitions
// do, first (X-1, X, X-9) and second (X, X-1, X-8): both leases' token is X
// before the write-back. The write-back must give them two tokens, each above
// every token a node issued; before, both kept X.
func TestRedlockSemaphoreHoldersNeverShareAToken(t *testing.T) {
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()
	counter := l.redisKeys([]string{"pool"}, "fence")[0]
	x := time.Now().UnixMicro() + int64(time.Hour/time.Microsecond) // far above every node's clock
	first := lock.Request{Keys: []string{"pool"}, TTL: time.Minute, Holder: "first", Owner: newOwner(t), Limit: 2}
	second := lock.Request{Keys: []string{"pool"}, TTL: time.Minute, Holder: "second", Owner: newOwner(t), Limit: 2}
	var took [2][]result[acquireReply]
	// take has node i run the acquisitions in order, from a counter at c.
	take := func(i int, c int64, order ...int) {
		t.Helper()
		if err := servers[i].Client().Set(ctx, counter, c, 0).Err(); err != nil {
			t.Fatal(err)
		}
		one := newTestLocker(t, Config{Addrs: []string{servers[i].Addr}})
		for _, who := range order {
			req := []lock.Request{first, second}[who]
			lease, err := one.TryAcquire(ctx, req)
			if err != nil {
				t.Fatalf("TryAcquire by %s on node %d: %v", req.Holder, i, err)
			}
			took[who] = append(took[who], result[acquireReply]{node: l.nodes[i], val: acquireReply{ok: true, fence: lease.Fence}})
		}
	}
	take(0, x-2, 0, 1) // first X-1, second X
	take(1, x-2, 1, 0) // second X-1, first X
	take(2, x-10, 0, 1)
	agreed1, fence1, err1 := l.writeBack(ctx, first, took[0], x, testNodeTimeout)
	agreed2, fence2, err2 := l.writeBack(ctx, second, took[1], x, testNodeTimeout)
	if err1 != nil || err2 != nil || agreed1 != 3 || agreed2 != 3 {
		t.Fatalf("write-backs: first %d node(s), %v; second %d node(s), %v; want both on all 3", agreed1, err1, agreed2, err2)
	}
	if fence1 == fence2 || fence1 <= x || fence2 <= x {
		t.Fatalf("after the write-backs the holders' tokens are %d and %d; want two tokens, each above %d (every token the nodes issued)", fence1, fence2, x)
	}
	// Every node records each holder's token as its slot's.
	for i, s := range servers {
		got, err := s.Client().ZRangeWithScores(ctx, l.redisKeys([]string{"pool"}, "slotfences")[0], 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{first.Owner: fence1, second.Owner: fence2}
		for _, z := range got {
			if f, ok := want[z.Member.(string)]; !ok || int64(z.Score) != f {
				t.Errorf("node %d: slot of %v has token %d; want %d", i, z.Member, int64(z.Score), f)
			}
		}
	}
}

// TestRedlockLateGrantFromANodeAheadIsReleased: a node whose fence counter
// is ahead answers late (it was paused), granting the lease with a larger
// token than the one the quorum agreed on. The late write-back records the
// lease's token there (raise.lua, by the token that node issued), so the
// lease's release, scoped to its token, frees the key on that node too.
// Before, the write-back, scoped to tokens at most the lease's, left the
// node's larger token in place, and the release left the key held there
// until its TTL: with a majority of nodes down, nobody could acquire.
func TestRedlockLateGrantFromANodeAheadIsReleased(t *testing.T) {
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithNodeTimeout(10*time.Minute))
	ctx := context.Background()
	warm, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"late"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, warm); err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := servers[2].Client().Set(ctx, "{late}:fence", ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	servers[2].Pause()
	lease, err := tryWithin(t, l, lock.Request{Keys: []string{"late"}, TTL: time.Minute})
	// At once, well within go-redis's read timeout: the paused node's
	// answer arrives, late.
	servers[2].Resume()
	if err != nil {
		t.Fatalf("TryAcquire with node 2 paused: %v", err)
	}
	if lease.Fence >= ahead {
		t.Fatalf("the lease got fence %d, the paused node's (ahead %d): want the quorum's", lease.Fence, ahead)
	}
	// The release waits for the late answer's settling on node 2 (chains).
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, l)
	if n, err := servers[2].Client().Exists(ctx, "{late}:lock").Result(); err != nil || n != 0 {
		v, _ := servers[2].Client().Get(ctx, "{late}:lock").Result()
		t.Fatalf("after the release, node 2 (the late one) still holds the key (EXISTS = %d, %v; value %q)", n, err, v)
	}
}
