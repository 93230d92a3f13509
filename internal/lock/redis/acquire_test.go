package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// connectionsReceived reads a server's total_connections_received.
func connectionsReceived(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatalf("INFO stats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("cannot parse %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatal("INFO stats has no total_connections_received")
	return 0
}

// TestAcquireFreeKeyDoesNotSubscribe: a blocking Acquire of a free key takes
// it with its first try, without the pub/sub subscription (a new connection).
func TestAcquireFreeKeyDoesNotSubscribe(t *testing.T) {
	s := redistest.Start(t)
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	var watched atomic.Int32
	l.beforeWatch = func() { watched.Add(1) }
	ctx := context.Background()
	req := lock.Request{Keys: []string{"free"}, TTL: time.Minute}
	mustRelease := func(lease *lock.Lease, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		if err := l.Release(ctx, lease); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	mustRelease(l.TryAcquire(ctx, req)) // the pool's connection
	c := s.Client()
	before := connectionsReceived(t, c)
	for range 5 {
		mustRelease(l.Acquire(ctx, req))
	}
	if after := connectionsReceived(t, c); after != before {
		t.Fatalf("%d new connections for 5 Acquire calls on a free key, want none", after-before)
	}
	if n := watched.Load(); n != 0 {
		t.Fatalf("Acquire on a free key subscribed %d times, want 0", n)
	}
}

// TestAcquireSeesReleaseBeforeSubscription: a release that lands after
// Acquire's first failed try but before its subscription is active is not
// missed: Acquire tries again once subscribed, instead of sleeping until the
// fallback backoff or the holder's TTL.
func TestAcquireSeesReleaseBeforeSubscription(t *testing.T) {
	servers := redistest.StartN(t, 3)
	for _, tc := range []struct {
		addrs []string
		queue bool
	}{
		{addrs(servers[:1]), false},
		{addrs(servers[:1]), true},
		{addrs(servers), false},
		{addrs(servers), true},
	} {
		t.Run(fmt.Sprintf("nodes=%d/queue=%t", len(tc.addrs), tc.queue), func(t *testing.T) {
			cfg := Config{Addrs: tc.addrs}
			holderLocker := newTestLocker(t, cfg)
			// Neither the backoff nor the holder's TTL would end the wait in time.
			slow := wait.Backoff{Duration: time.Minute, Factor: 1, Cap: time.Minute}
			l := newTestLocker(t, cfg, WithBackoff(slow), WithWaiterTTL(time.Minute))
			key := fmt.Sprintf("race-%d-%t", len(tc.addrs), tc.queue)
			ctx := context.Background()
			held, err := holderLocker.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
			if err != nil {
				t.Fatal(err)
			}
			var watched atomic.Int32
			l.beforeWatch = func() {
				watched.Add(1)
				if err := holderLocker.Release(ctx, held); err != nil {
					t.Errorf("release before the subscription: %v", err)
				}
			}
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			start := time.Now()
			lease, err := l.Acquire(actx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "waiter", Queue: tc.queue})
			if err != nil {
				t.Fatalf("Acquire after a release before its subscription: %v (after %v)", err, time.Since(start))
			}
			if n := watched.Load(); n != 1 {
				t.Fatalf("subscribed %d times, want once", n)
			}
			if err := l.Release(ctx, lease); err != nil {
				t.Fatal(err)
			}
		})
	}
}
