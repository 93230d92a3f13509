package redis

import (
	"context"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The lease metadata (holder, fence, acquired) has no TTL of its own: what an
// expired lease leaves behind must never show as the next holder's, and a
// lease taken again by its owner must not keep a TTL an earlier version gave
// its metadata.
func TestLeaseMetadataOutlivesNoLease(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	ctx := context.Background()
	s := redistest.Start(t)
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	c := s.Client()

	first, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "first"})
	if err != nil {
		t.Fatalf("first TryAcquire: %v", err)
	}
	// The lease expires without a release (its holder crashed): only the
	// lock key goes; its metadata stays.
	if err := c.Del(ctx, "{m}:lock").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, "{m}:meta").Result(); err != nil || n != 1 {
		t.Fatalf("metadata of the expired lease: EXISTS = %d, %v; want it left behind", n, err)
	}
	states, err := l.Inspect(ctx, []string{"m"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; st.Holder != "" || st.HolderCount != 0 {
		t.Fatalf("Inspect of a free key = holder %q, %d holders; want none (the old metadata must not show)", st.Holder, st.HolderCount)
	}

	second, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "second"})
	if err != nil {
		t.Fatalf("second TryAcquire: %v", err)
	}
	states, err = l.Inspect(ctx, []string{"m"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; st.Holder != "second" || st.Fence != second.Fence || st.Fence <= first.Fence {
		t.Fatalf("Inspect after the second acquisition = holder %q fence %d; want %q with fence %d (> %d)", st.Holder, st.Fence, "second", second.Fence, first.Fence)
	}

	// Metadata with a TTL, as an earlier version wrote it: the owner taking
	// its lease again (an operator rebuilding it after an upgrade) clears it.
	if err := c.PExpire(ctx, "{m}:meta", 5*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	again, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "second", Owner: second.Owner})
	if err != nil {
		t.Fatalf("TryAcquire by the owner again: %v", err)
	}
	if ttl, err := c.PTTL(ctx, "{m}:meta").Result(); err != nil || ttl != -1 {
		t.Fatalf("PTTL of the metadata after its owner took the lease again = %v, %v; want none (-1ns)", ttl, err)
	}
	if _, err := l.Renew(ctx, again, time.Minute); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := l.Release(ctx, again); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n, err := c.Exists(ctx, "{m}:lock", "{m}:meta").Result(); err != nil || n != 0 {
		t.Fatalf("after the release %d of lock and meta are left (%v); want none", n, err)
	}
}
