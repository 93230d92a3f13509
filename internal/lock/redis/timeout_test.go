package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestANodeTimeoutAboveGoRedisDefaultIsTheBound: go-redis bounds a read by
// its own read timeout (5s by default) as well as by the context. A node
// timeout set above it must be the bound: a node that answers after 5.3s
// (paused, then resumed) is answered within an 8s node timeout, not cut off
// at 5s. Before the Locker set go-redis's timeouts, this failed with
// "i/o timeout" after 5s.
func TestANodeTimeoutAboveGoRedisDefaultIsTheBound(t *testing.T) {
	s := redistest.Start(t)
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}}, WithNodeTimeout(8*time.Second))
	ctx := context.Background()
	if err := l.Ping(ctx); err != nil { // a pooled connection, before the pause
		t.Fatalf("Ping: %v", err)
	}
	const slow = 5300 * time.Millisecond
	s.Pause()
	t.Cleanup(s.Resume)
	resume := time.AfterFunc(slow, s.Resume)
	defer resume.Stop()
	start := time.Now()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"slow-node"}, TTL: time.Minute, Holder: "patient"})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("TryAcquire on a node answering after %v, node timeout 8s: %v (after %v)", slow, err, took)
	}
	if took < slow {
		t.Fatalf("TryAcquire answered after %v, before the node was resumed (%v): the test did not slow the node", took, slow)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
