package etcd

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestMaxKeysFitOneTransaction: a queued request for lock.MaxKeys long keys
// stays within etcd's default limit of 128 operations per transaction
// branch and its request size, in every operation.
func TestMaxKeysFitOneTransaction(t *testing.T) {
	m := etcdtest.Start(t)
	l := newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: "/limits/"})
	ctx := ctxT(t, time.Minute)
	keys := make([]string, lock.MaxKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns/some-namespace/%0280d", i)
	}
	blocker, err := l.TryAcquire(ctx, lock.Request{Keys: keys[7:8], TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := lock.Request{Keys: keys, TTL: 10 * time.Second, Owner: ownerToken(t), Holder: "many", Queue: true}
	_, err = l.TryAcquire(ctx, req)
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Key != keys[7] || he.Position != 0 || he.Waiters != 1 {
		t.Fatalf("TryAcquire of %d keys, one held = %v; want a HeldError for key 7 at position 0", len(keys), err)
	}
	if err := l.Release(ctx, blocker); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire of %d keys: %v", len(keys), err)
	}
	if _, err := l.Renew(ctx, lease, 10*time.Second); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if _, err := l.Renew(ctx, lease, 20*time.Second); err != nil {
		t.Fatalf("Renew with another TTL: %v", err)
	}
	st, err := l.Inspect(ctx, keys)
	if err != nil || len(st) != len(keys) {
		t.Fatalf("Inspect: %v, %d states", err, len(st))
	}
	for _, s := range st {
		if !s.Held || s.Fence != lease.Fence || len(s.Waiters) != 0 {
			t.Fatalf("Inspect(%s) = %+v, want held with fence %d and no waiters", s.Key, s, lease.Fence)
		}
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}
