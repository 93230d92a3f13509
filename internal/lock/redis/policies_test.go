package redis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The marks of the queue rules are Redis keys of the lock key: a replaced
// zset (owner -> until, server milliseconds, two waiter TTLs) and a
// preempted token (with the TTL of the holding it stopped). They live in
// Redis, not in the Locker: a new connection (a restarted operator) is told
// of them as the Locker that made them would be, and a replacement mark
// ends with its time, after which the owner queues again.
func TestPolicyMarksLiveInRedis(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c := s.Client()
	cfg := Config{Addrs: []string{s.Addr}}
	l := newTestLocker(t, cfg)
	oh, ow := mustOwner(t), mustOwner(t)
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"p"}, TTL: time.Minute, Holder: "holder", Owner: oh})
	if err != nil {
		t.Fatal(err)
	}
	w := lock.Request{Keys: []string{"p"}, TTL: time.Minute, Holder: "w", Owner: ow, Queue: true}
	if _, err := l.TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w queueing: %v, want ErrNotAcquired", err)
	}
	r := lock.Request{Keys: []string{"p"}, TTL: time.Minute, Holder: "r", Owner: mustOwner(t), Queue: true, Replace: true, Preempt: true}
	if _, err := l.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("r queueing: %v, want ErrNotAcquired", err)
	}
	now := serverMillis(t, c)
	until, err := c.ZScore(ctx, "{p}:replaced", ow).Result()
	if err != nil || int64(until) < now+1500 || int64(until) > now+2000 {
		t.Fatalf("replaced mark of w = %v, %v; want about two waiter TTLs (2s) after %d", until, err, now)
	}
	if pttl, err := c.PTTL(ctx, "{p}:replaced").Result(); err != nil || pttl <= 0 || pttl > 2*time.Second {
		t.Fatalf("PTTL of the replaced zset = %v, %v; want at most two waiter TTLs", pttl, err)
	}
	if got, err := c.Get(ctx, "{p}:preempted").Int64(); err != nil || got != h.Fence {
		t.Fatalf("preempted mark = %d, %v; want the holder's token %d", got, err, h.Fence)
	}
	if pttl, err := c.PTTL(ctx, "{p}:preempted").Result(); err != nil || pttl <= 50*time.Second || pttl > time.Minute {
		t.Fatalf("PTTL of the preempted mark = %v, %v; want the holder's (about a minute)", pttl, err)
	}
	leaseTTL, err := c.PTTL(ctx, "{p}:lock").Result()
	if err != nil {
		t.Fatal(err)
	}

	// A restarted operator: new connections, same owners.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	again := newTestLocker(t, cfg)
	if _, err := again.TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w after a reconnect: %v, want ErrReplaced only", err)
	}
	if _, err := again.Renew(ctx, h, time.Minute); !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after a reconnect: %v, want ErrPreempted and not ErrLost", err)
	}
	if pttl, err := c.PTTL(ctx, "{p}:lock").Result(); err != nil || pttl > leaseTTL {
		t.Fatalf("PTTL of the preempted lease after the refused renewal = %v, %v; want no more than before (%v)", pttl, err, leaseTTL)
	}

	// Two waiter TTLs later the mark has ended: w queues again (at the
	// head: r did not keep its place meanwhile).
	time.Sleep(2100 * time.Millisecond)
	var held *lock.HeldError
	if _, err := again.TryAcquire(ctx, w); !errors.As(err, &held) || held.Position != 0 {
		t.Fatalf("w once its mark ended: %v, want refused and queued (position 0)", err)
	}
	if err := again.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// serverMillis is the server's clock in milliseconds.
func serverMillis(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// On Redlock a waiter replaced on a minority of the nodes (a newer request
// with Replace reached only them) still waits: no quorum can tell it so, and
// it keeps its place on the others. Replaced on a majority, it is told so
// (ErrReplaced) and leaves the queue of the node that missed the drop.
func TestRedlockReplacedOnAMinority(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "holder", Owner: mustOwner(t)}); err != nil {
		t.Fatal(err)
	}
	ow := mustOwner(t)
	w := lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "w", Owner: ow, Queue: true}
	if _, err := l.TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w queueing: %v, want ErrNotAcquired", err)
	}
	// replaceOn runs a request with Replace on node i alone.
	replaceOn := func(i int) {
		one := newTestLocker(t, Config{Addrs: addrs(servers[i : i+1])})
		r := lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "r", Owner: mustOwner(t), Queue: true, Replace: true}
		if _, err := one.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("r on node %d: %v, want ErrNotAcquired", i, err)
		}
	}
	queuedOn := func(i int) bool {
		_, err := servers[i].Client().ZScore(ctx, "{m}:queue", ow).Result()
		return err == nil
	}

	replaceOn(0)
	if queuedOn(0) {
		t.Fatal("w still queued on the node the replacing request reached")
	}
	if _, err := l.TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("w replaced on one node of three: %v, want ErrNotAcquired (it still waits)", err)
	}
	if !queuedOn(1) || !queuedOn(2) {
		t.Fatal("w left the queues of the nodes the replacing request did not reach")
	}

	replaceOn(1)
	if _, err := l.TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w replaced on two nodes of three: %v, want ErrReplaced only", err)
	}
	if queuedOn(2) {
		t.Fatal("w replaced on a majority is still queued on the node that missed the drop")
	}
}

// On Redlock a preemption that reached a minority of the nodes does not
// stop the renewals (a quorum still renews); on a majority it does, with
// ErrPreempted, not ErrLost, and nothing is shortened.
func TestRedlockPreemptedOnAMinority(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"q"}, TTL: time.Minute, Holder: "holder", Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	preemptOn := func(i int) {
		one := newTestLocker(t, Config{Addrs: addrs(servers[i : i+1])})
		r := lock.Request{Keys: []string{"q"}, TTL: time.Minute, Holder: "r", Owner: mustOwner(t), Queue: true, Replace: true, Preempt: true}
		if _, err := one.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("r on node %d: %v, want ErrNotAcquired", i, err)
		}
	}
	preemptOn(0)
	renewed, err := l.Renew(ctx, h, time.Minute)
	if err != nil {
		t.Fatalf("Renew preempted on one node of three: %v, want renewed by the other two", err)
	}
	preemptOn(1)
	before, err := servers[0].Client().PTTL(ctx, "{q}:lock").Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Renew(ctx, renewed, time.Minute); !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew preempted on two nodes of three: %v, want ErrPreempted and not ErrLost", err)
	}
	for i, s := range servers[:2] {
		pttl, err := s.Client().PTTL(ctx, "{q}:lock").Result()
		if err != nil || pttl <= 0 || (i == 0 && pttl > before) {
			t.Fatalf("node %d: PTTL of the preempted lease = %v, %v; want it still held, not extended", i, pttl, err)
		}
	}
	if err := l.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
}

// In Sentinel mode a refused request with Replace waits for the replica like
// a grant: its marks are on the replica when the refusal is reported, so
// that a failover right after it keeps them.
func TestSentinelReplaceMarksReachTheReplica(t *testing.T) {
	ctx := context.Background()
	master := redistest.Start(t, redistest.WithPassword("m4ster"))
	sentinels := redistest.StartSentinels(t, master, 1, "mymaster")
	l := newTestLocker(t, Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName, Password: "m4ster"})
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"s"}, TTL: time.Minute, Holder: "holder", Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	ow := mustOwner(t)
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"s"}, TTL: time.Minute, Holder: "w", Owner: ow, Queue: true}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w queueing: %v", err)
	}
	r := lock.Request{Keys: []string{"s"}, TTL: time.Minute, Holder: "r", Owner: mustOwner(t), Queue: true, Replace: true, Preempt: true}
	if _, err := l.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("r queueing: %v", err)
	}
	replica := sentinels.Data[1].Client()
	if _, err := replica.ZScore(ctx, "{s}:replaced", ow).Result(); err != nil {
		t.Fatalf("replaced mark on the replica right after the refusal: %v", err)
	}
	if got, err := replica.Get(ctx, "{s}:preempted").Int64(); err != nil || got != h.Fence {
		t.Fatalf("preempted mark on the replica right after the refusal = %d, %v; want %d", got, err, h.Fence)
	}
}

// The queue rules work with the minimal ACL of docs/backends.md: their
// scripts use no command outside it.
func TestMinimalACLPolicies(t *testing.T) {
	s := redistest.Start(t)
	if err := s.SetUser(context.Background(), "locks", "secret", minimalACL...); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Addrs: []string{s.Addr}, Prefix: "lockwarden:", Username: "locks", Password: "secret"}
	locktest.RunPolicies(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second))
}

// The Redlock write-back (raise.lua, semraise.lua) gives a lease a larger
// token: a lease or slot preempted at its old token stays preempted (the
// mark moves with it), and one that was not stays free of the mark.
func TestRaiseCarriesThePreemption(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	for _, tc := range []struct {
		limit     int
		preempted bool
	}{{1, true}, {1, false}, {2, true}, {2, false}} {
		preempted := tc.preempted
		key := fmt.Sprintf("raise-%d-%v", tc.limit, preempted)
		owner := mustOwner(t)
		lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "h", Owner: owner, Limit: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		mark := lease.Fence
		if !preempted {
			mark = lease.Fence - 1
		}
		if err := c.Set(ctx, "{"+key+"}:preempted", mark, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		raised := lease.Fence + 10
		if n, err := l.raiseOn(ctx, l.nodes[0], lock.Request{Keys: []string{key}, Owner: owner, Limit: tc.limit}, raised, 0); err != nil || n != 1 {
			t.Fatalf("raise = %d, %v; want 1 key held", n, err)
		}
		want := mark
		if preempted {
			want = raised
		}
		if got, err := c.Get(ctx, "{"+key+"}:preempted").Int64(); err != nil || got != want {
			t.Fatalf("limit %d, preempted %v: mark after the raise = %d, %v; want %d", tc.limit, preempted, got, err, want)
		}
		next := *lease
		next.Fence = raised
		_, err = l.Renew(ctx, &next, time.Minute)
		if preempted != errors.Is(err, lock.ErrPreempted) || (!preempted && err != nil) {
			t.Fatalf("limit %d, preempted %v: Renew after the raise: %v", tc.limit, preempted, err)
		}
	}
}
