package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

func TestSemaphoreStandalone(t *testing.T) {
	s := redistest.Start(t)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: []string{s.Addr}, Prefix: "sem:"}), locktest.WithWaiterTTL(time.Second))
}

func TestSemaphoreSentinel(t *testing.T) {
	master := redistest.Start(t, redistest.WithPassword("m4ster"))
	sentinels := redistest.StartSentinels(t, master, 3, "mymaster")
	cfg := Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName, Password: "m4ster", DB: 2}
	locktest.RunSemaphore(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}

func TestSemaphoreRedlock3(t *testing.T) {
	servers := redistest.StartN(t, 3)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: addrs(servers), DB: 1}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}

func TestSemaphoreRedlock5(t *testing.T) {
	servers := redistest.StartN(t, 5)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: addrs(servers)}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}

func TestSemaphoreQuorumFormula(t *testing.T) {
	cases := []struct{ nodes, limit, want int }{
		{1, 1, 1}, {1, 5, 1},
		{3, 0, 2}, {3, 1, 2}, {3, 2, 3}, {3, 1000, 3},
		{5, 1, 3}, {5, 2, 4}, {5, 3, 4}, {5, 4, 5},
		{7, 1, 4}, {7, 2, 5}, {7, 3, 6}, {7, 5, 6}, {7, 6, 7},
	}
	for _, c := range cases {
		l := &Locker{nodes: make([]*node, c.nodes)}
		if got := l.quorumFor(c.limit); got != c.want {
			t.Errorf("quorumFor(limit %d) on %d nodes = %d, want %d", c.limit, c.nodes, got, c.want)
		}
		// N+1 leases on q nodes each need more slots than M nodes of N have.
		if n := max(c.limit, 1); c.nodes > 1 && (n+1)*c.want <= c.nodes*n {
			t.Errorf("%d nodes, limit %d: quorum %d lets %d leases fit", c.nodes, c.limit, c.want, n+1)
		}
	}
}

// TestRedlockSemaphoreNeedsMoreThanMajority: with 2 slots on 3 masters, a
// slot held on 2 nodes (a majority) is not enough. Two leases planted on
// nodes {0,1} and {1,2} fill node 1; a third client can still get nodes 0
// and 2, a majority, and must be refused: with a majority rule all three
// would hold the semaphore of 2 at once. With a node down, a semaphore of 2
// on 3 nodes cannot be taken at all, and the error says 2 of 3 agreed, 3
// needed, while a mutex still can.
func TestRedlockSemaphoreNeedsMoreThanMajority(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	plant := func(holder string, nodes ...int) {
		t.Helper()
		owner, err := lock.NewOwnerToken()
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range nodes {
			one := newTestLocker(t, Config{Addrs: []string{servers[i].Addr}})
			if _, err := one.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Owner: owner, Holder: holder, Limit: 2}); err != nil {
				t.Fatalf("plant %s on node %d: %v", holder, i, err)
			}
		}
	}
	plant("a", 0, 1)
	plant("b", 1, 2)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "c", Limit: 2})
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("third lease of a semaphore of 2 with node 1 full: %v, want ErrNotAcquired", err)
	}
	st, err := l.Inspect(ctx, []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	// Neither planted lease holds 3 nodes: Redlock counts neither.
	if st[0].HolderCount != 0 || st[0].Held {
		t.Fatalf("Inspect = %+v: leases on 2 of 3 nodes hold nothing for a semaphore of 2", st[0])
	}
	// The refused client left nothing behind on nodes 0 and 2.
	for _, i := range []int{0, 2} {
		one := newTestLocker(t, Config{Addrs: []string{servers[i].Addr}})
		st, err := one.Inspect(ctx, []string{"k"})
		if err != nil {
			t.Fatal(err)
		}
		if st[0].HolderCount != 1 {
			t.Fatalf("node %d: Inspect = %+v: want only the planted lease", i, st[0])
		}
	}

	servers[2].Kill()
	defer servers[2].Restart()
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{"k2"}, TTL: time.Minute, Holder: "c", Limit: 2})
	var qe *QuorumError
	if !errors.As(err, &qe) || qe.Agreed != 2 || qe.Needed != 3 || qe.Total != 3 {
		t.Fatalf("semaphore of 2 with 1 of 3 nodes down: %v, want a QuorumError with 2 of 3 agreed, 3 needed", err)
	}
	if !strings.Contains(err.Error(), "2 of 3 nodes agreed, 3 needed") {
		t.Fatalf("error %q does not say how many nodes agreed and were needed", err)
	}
	m, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k2"}, TTL: time.Minute, Holder: "mutex"})
	if err != nil {
		t.Fatalf("mutex with 2 of 3 nodes up: %v", err)
	}
	if err := l.Release(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockSemaphoreLeavesQueueOfRefusingNode: a queued semaphore request
// that one node refuses (its slots are full there) but a quorum grants holds
// the lease, and must not stay queued on the refusing node, where it would
// keep a place ahead of the next waiters until its waiter TTL ran out.
func TestRedlockSemaphoreLeavesQueueOfRefusingNode(t *testing.T) {
	servers := redistest.StartN(t, 5)
	ctx := context.Background()
	node0 := newTestLocker(t, Config{Addrs: []string{servers[0].Addr}})
	for range 2 {
		if _, err := node0.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "planted", Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	owner, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "w", Owner: owner, Queue: true, Limit: 2})
	if err != nil {
		t.Fatalf("semaphore of 2 on 4 of 5 nodes (4 needed): %v", err)
	}
	st, err := node0.Inspect(ctx, []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Queued != 0 || st[0].HolderCount != 2 {
		t.Fatalf("refusing node: Inspect = %+v, want the 2 planted holders and nobody queued", st[0])
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockSemaphoreFenceWriteBack: when one node's counter is ahead, it
// issues a larger token than the others; the lease takes the largest, and the
// write-back records it as the slot's fence and counter on every node, so
// that Inspect on any quorum reports it and the next token is larger.
func TestRedlockSemaphoreFenceWriteBack(t *testing.T) {
	servers := redistest.StartN(t, 3)
	ctx := context.Background()
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := servers[0].Client().Set(ctx, "{k}:fence", ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Fence != ahead+1 {
		t.Fatalf("fence %d, want %d (the node ahead)", lease.Fence, ahead+1)
	}
	for i, s := range servers {
		st, err := newTestLocker(t, Config{Addrs: []string{s.Addr}}).Inspect(ctx, []string{"k"})
		if err != nil {
			t.Fatal(err)
		}
		if len(st[0].Holders) != 1 || st[0].Holders[0].Fence != lease.Fence {
			t.Fatalf("node %d: Inspect = %+v, want the slot with fence %d", i, st[0], lease.Fence)
		}
		if c, err := s.Client().Get(ctx, "{k}:fence").Int64(); err != nil || c < lease.Fence {
			t.Fatalf("node %d: counter %d (%v), want at least %d", i, c, err, lease.Fence)
		}
	}
	next, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "b", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence <= lease.Fence {
		t.Fatalf("next fence %d, want > %d", next.Fence, lease.Fence)
	}
}
