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
// branch and its request size, in every operation, as a mutex and as a
// semaphore.
func TestMaxKeysFitOneTransaction(t *testing.T) {
	m := etcdtest.Start(t)
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprintf("limit-%d", limit), func(t *testing.T) { maxKeysFit(t, m, limit) })
	}
}

func maxKeysFit(t *testing.T, m *etcdtest.Member, limit int) {
	l := newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: fmt.Sprintf("/limits-%d/", limit)})
	ctx := ctxT(t, time.Minute)
	keys := make([]string, lock.MaxKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns/some-namespace/%0280d", i)
	}
	blocker, err := l.TryAcquire(ctx, lock.Request{Keys: keys[7:8], TTL: 10 * time.Second, Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	var others []*lock.Lease
	for range limit - 1 {
		// A semaphore's other slots of key 7, so that it is full.
		other, err := l.TryAcquire(ctx, lock.Request{Keys: keys[7:8], TTL: 10 * time.Second, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, other)
	}
	if err != nil {
		t.Fatal(err)
	}
	req := lock.Request{Keys: keys, TTL: 10 * time.Second, Owner: ownerToken(t), Holder: "many", Queue: true, Limit: limit}
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
		if !s.Held || (s.Fence != lease.Fence && s.Key != keys[7]) || len(s.Waiters) != 0 {
			t.Fatalf("Inspect(%s) = %+v, want held with fence %d and no waiters", s.Key, s, lease.Fence)
		}
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, o := range others {
		if err := l.Release(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}
