package zookeeper

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestMultiKeyOppositeOrders: requests for the same keys in opposite orders,
// queued or not, on several Lockers, all get their turn (no deadlock, since a
// lease takes all its keys in one transaction and every waiter has one ticket
// for all its queues) and never overlap.
func TestMultiKeyOppositeOrders(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/multikey"}
	a, b, c := testKey("a"), testKey("b"), testKey("c")
	orders := [][]string{{a, b, c}, {c, b, a}, {b, a}, {c, a}}
	const rounds = 8
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, len(orders)*rounds)
	for i, keys := range orders {
		l := newTestLocker(t, cfg)
		wg.Go(func() {
			for r := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				lease, err := l.Acquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second, Holder: fmt.Sprintf("g%d", i), Queue: (i+r)%2 == 0})
				cancel()
				if err != nil {
					errs <- fmt.Errorf("requester %d round %d: %w", i, r, err)
					return
				}
				// Every request shares a key with every other: one at a time.
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("requester %d round %d: %d holders of overlapping keys at once", i, r, n)
				}
				inside.Add(-1)
				if err := l.Release(context.Background(), lease); err != nil {
					errs <- fmt.Errorf("requester %d round %d release: %w", i, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
