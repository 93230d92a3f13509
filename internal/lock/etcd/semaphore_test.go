package etcd

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestReleaseWithTheLimitChanged: a lease released with another limit than
// it was acquired with (the lock's maxHolders changed while it held; the
// operator rebuilds the lease from the lock as it is now) is still released,
// as a mutex and as a semaphore; on a session it would otherwise stay held
// for as long as the operator lives. The token still decides: a release
// with another token touches nothing.
func TestReleaseWithTheLimitChanged(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/limit-changed/"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxT(t, time.Minute)
	for _, c := range []struct {
		name          string
		acquired, now int
	}{{"mutex-released-as-semaphore", 1, 3}, {"semaphore-released-as-mutex", 3, 1}} {
		t.Run(c.name, func(t *testing.T) {
			key := c.name
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: c.acquired})
			if err != nil {
				t.Fatal(err)
			}
			rebuilt := &lock.Lease{Keys: lease.Keys, Owner: lease.Owner, Fence: lease.Fence, Limit: c.now}
			wrong := *rebuilt
			wrong.Fence++
			if err := l.Release(ctx, &wrong); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("Release with another token = %v, want ErrNotHeld", err)
			}
			if err := l.Release(ctx, rebuilt); err != nil {
				t.Fatalf("Release with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
			}
			if _, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute}); err != nil {
				t.Fatalf("the key after the release: %v", err)
			}
		})
	}
}

// TestSlotsAndWaitersOfAnEarlierVersion: a slot and a waiter the previous
// release wrote (values without a weight) each count as one slot: beside
// them a request of weight 3 on a limit of 4 waits behind the old waiter,
// and one of weight 2 takes its slots; Inspect reports the old slot's
// weight as 1.
func TestSlotsAndWaitersOfAnEarlierVersion(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/upgrade-weights/"}
	l := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second))
	ctx := ctxT(t, time.Minute)
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	const limit = 4
	key := "ns/upgrade/semaphore"
	cli := l.etcd()
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}

	// What the previous release left: a slot of the semaphore, and a waiter
	// ranked ahead of everyone who joins now, neither with a weight.
	oldSlot, oldWaiter := ownerTag(ownerToken(t)), ownerTag(ownerToken(t))
	slotValue := encodeValue(oldSlot, holderRecord{Holder: "old slot", Lease: int64(g.ID), TTLMilli: time.Minute.Milliseconds(), Acquired: time.Now().UnixMilli(), Session: true, Attempt: 1, Limit: limit})
	joined := time.Now().Add(-2 * time.Second)
	waiterValue := encodeWaiter(oldWaiter, place{rank: joined.UnixMicro(), arrival: joined.UnixMicro()}, waiterRecord{Holder: "old waiter", Lease: int64(g.ID), Since: joined.UnixMilli()})
	if strings.Contains(slotValue+waiterValue, "weight") {
		t.Fatalf("the previous release's values carry a weight: %q, %q", slotValue, waiterValue)
	}
	if _, err := cli.Put(ctx, l.slotKey(key, oldSlot), slotValue, clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, l.waiterKey(key, oldWaiter), waiterValue, clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}

	// 1 held + 1 ahead + 3 > 4: both count, as one slot each at least.
	heavy := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "heavy", Queue: true, Limit: limit, Weight: 3}
	mustQueue(t, l, heavy)
	_, err = l.TryAcquire(ctx, heavy)
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Position != 1 || he.Waiters != 2 || he.Holders != 1 {
		t.Fatalf("weight 3 beside the old slot, behind the old waiter: %v; want refused at position 1 of 2, 1 holder", err)
	}
	if err := l.Dequeue(ctx, heavy.Keys, heavy.Owner); err != nil {
		t.Fatal(err)
	}

	// 1 held + 1 ahead + 2 = 4: no more than one slot each.
	two := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "two", Queue: true, Limit: limit, Weight: 2}
	mustQueue(t, l, two)
	lease := mustTake(t, l, two)
	if lease.Weight != 2 {
		t.Errorf("lease of weight 2: Weight %d", lease.Weight)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	weights := map[string]int{}
	for _, h := range st[0].Holders {
		weights[h.Holder] = h.Weight
	}
	if st[0].HolderCount != 2 || weights["old slot"] != 1 || weights["two"] != 2 || st[0].Queued != 1 {
		t.Fatalf("Inspect: %d holders, weights %v, %d queued; want the old slot of weight 1, two of weight 2, the old waiter queued", st[0].HolderCount, weights, st[0].Queued)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestWaiterAsksForAnotherWeight: a waiter that calls again asking for
// another number of slots has its value written again with that weight,
// keeping its key's CreateRevision (its arrival ticket) and its place, so
// the waiters behind it count what it asks for now.
func TestWaiterAsksForAnotherWeight(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/reweigh/"}
	l := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second))
	ctx := ctxT(t, time.Minute)
	const limit = 4
	key := "ns/reweigh/semaphore"
	h := mustTake(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "holder", Limit: limit, Weight: 3})
	w := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "waiter", Queue: true, Limit: limit, Weight: 4}
	mustQueue(t, l, w)
	read := func() (waiterRecord, place, int64) {
		t.Helper()
		got, err := l.etcd().Get(ctx, l.waiterKey(key, ownerTag(w.Owner)))
		if err != nil || len(got.Kvs) != 1 {
			t.Fatalf("the waiter key: %v, %v", got, err)
		}
		var rec waiterRecord
		p, ranked, err := decodeWaiter(got.Kvs[0].Value, &rec)
		if err != nil || !ranked {
			t.Fatalf("the waiter value %q: ranked %v, error %v", got.Kvs[0].Value, ranked, err)
		}
		return rec, p, got.Kvs[0].CreateRevision
	}
	rec, p, rev := read()
	if rec.slots() != 4 {
		t.Fatalf("the waiter's value records weight %d, want 4", rec.slots())
	}
	w.Weight = 2
	mustQueue(t, l, w)
	rec2, p2, rev2 := read()
	if rec2.slots() != 2 || p2 != p || rev2 != rev {
		t.Fatalf("after asking for 2: weight %d, place %+v, created at %d; want weight 2, place %+v, created at %d", rec2.slots(), p2, rev2, p, rev)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	lease := mustTake(t, l, w)
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}
