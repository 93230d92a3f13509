package redis

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// acquireSoon retries TryAcquire while the backend recovers from a fault.
func acquireSoon(t *testing.T, l *Locker, req lock.Request) *lock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b := wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 200 * time.Millisecond}
	for {
		lease, err := l.TryAcquire(ctx, req)
		if err == nil {
			return lease
		}
		if !errors.Is(err, lock.ErrBackendUnavailable) && !errors.Is(err, lock.ErrQuorum) && !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("acquire %q: %v", req.Keys, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("acquire %q: %v (last attempt: %v)", req.Keys, ctx.Err(), err)
		case <-time.After(b.Step()):
		}
	}
}

// TestFencesSurviveEmptyRestarts acquires 1,000 times while nodes are killed
// and restarted without persistence, so they come back without their fence
// counters: every fencing token must still be larger than the one before.
func TestFencesSurviveEmptyRestarts(t *testing.T) {
	const n = 1000
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Start(t)
		l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
		var last int64
		for i := range n {
			if i%100 == 50 {
				s.Kill()
				s.Restart()
			}
			lease := acquireSoon(t, l, lock.Request{Keys: []string{"k"}, TTL: time.Minute})
			if lease.Fence <= last || lease.Fence >= lock.MaxFence {
				t.Fatalf("acquisition %d: fence %d, want in (%d, MaxFence)", i, lease.Fence, last)
			}
			last = lease.Fence
			if err := l.Release(context.Background(), lease); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
	})
	t.Run("redlock-5", func(t *testing.T) {
		servers := redistest.StartN(t, 5)
		l := newTestLocker(t, Config{Addrs: addrs(servers)})
		rng := rand.New(rand.NewPCG(1, 2))
		var down []*redistest.Server
		var last int64
		for i := range n {
			switch i % 100 {
			case 10: // two random nodes die: 3 of 5 remain, exactly a majority
				for _, j := range rng.Perm(len(servers))[:2] {
					servers[j].Kill()
					down = append(down, servers[j])
				}
			case 50: // they come back empty
				for _, s := range down {
					s.Restart()
				}
				down = nil
				// go-redis refuses to dial a node for up to a second after
				// many failed dials; wait until the Locker reaches all five
				// again, so the next kill leaves a majority.
				waitReachable(t, l)
			}
			keys := []string{"a"}
			if i%3 == 0 {
				keys = []string{"a", "b"}
			}
			lease := acquireSoon(t, l, lock.Request{Keys: keys, TTL: time.Minute})
			if lease.Fence <= last || lease.Fence >= lock.MaxFence {
				t.Fatalf("acquisition %d: fence %d, want in (%d, MaxFence)", i, lease.Fence, last)
			}
			last = lease.Fence
			if err := l.Release(context.Background(), lease); err != nil && !errors.Is(err, lock.ErrQuorum) {
				t.Fatalf("release %d: %v", i, err)
			}
		}
	})
}

// waitReachable waits until every node answers through the Locker's own clients.
func waitReachable(t *testing.T, l *Locker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, n := range l.nodes {
			if n.client.Ping(ctx).Err() != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("nodes not reachable again: %v", err)
	}
}
