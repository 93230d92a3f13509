package etcd

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestWaiterPlaceOrder: a place survives its encoding, and the encodings
// (followed by the owner tag) sort as the places do: by rank, then arrival;
// values of earlier versions (an owner tag first) sort after all of them.
func TestWaiterPlaceOrder(t *testing.T) {
	places := []place{
		{rank: math.MinInt64, arrival: 0},
		{rank: -1, arrival: 5},
		{rank: 0, arrival: 0},
		{rank: 0, arrival: 1},
		{rank: 1_700_000_000_000_000, arrival: 1_700_000_000_000_000},
		{rank: 1_700_000_000_000_000, arrival: 1_700_000_000_000_001},
		{rank: math.MaxInt64, arrival: math.MaxInt64},
	}
	tag := ownerTag("owner")
	var values []string
	for _, p := range places {
		v := encodeWaiter(tag, p, waiterRecord{Holder: "w", Lease: 7, Since: 1})
		var rec waiterRecord
		got, ranked, err := decodeWaiter([]byte(v), &rec)
		if err != nil || !ranked || got != p || rec.Holder != "w" || rec.Lease != 7 {
			t.Fatalf("decode(encode(%+v)) = %+v, ranked %v, record %+v, error %v", p, got, ranked, rec, err)
		}
		if b := headBound([]byte(v)); b == "" || v <= b || !strings.HasSuffix(b, tag) {
			t.Fatalf("head bound %q of %q: want a prefix ending with the tag, below the value", b, v)
		}
		values = append(values, v)
	}
	values = append(values, encodeValue("00"+tag[2:], waiterRecord{Holder: "earlier version"}))
	if !slices.IsSorted(values) {
		t.Fatalf("encoded places do not sort as the places: %q", values)
	}
	var rec waiterRecord
	if _, ranked, err := decodeWaiter([]byte(values[len(values)-1]), &rec); err != nil || ranked || rec.Holder != "earlier version" {
		t.Fatalf("value of an earlier version: ranked %v, record %+v, error %v; want unranked", ranked, rec, err)
	}
	if headBound([]byte(values[len(values)-1])) != "" {
		t.Fatal("a value of an earlier version has a head bound")
	}
}

// TestWaiterOfAnEarlierVersion: a waiter key written by an earlier version
// (no place in its value, joined first) is served after the ranked waiters
// while its owner runs that version, and does not block them; once its
// owner calls again with this one, it is ranked by the time it joined,
// keeping its CreateRevision (its arrival ticket for Replace), ahead of the
// waiters that joined after it.
func TestWaiterOfAnEarlierVersion(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/upgrade/"}
	l := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second))
	ctx := ctxT(t, time.Minute)
	key := "ns/upgrade/job"
	h := mustTake(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "holder"})

	// The earlier version's waiter: "T {json}" on its own waiter lease.
	cli := l.etcd()
	g, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	oldToken := ownerToken(t)
	oldKey := l.waiterKey(key, ownerTag(oldToken))
	joined := time.Now().Add(-2 * time.Second)
	put, err := cli.Put(ctx, oldKey, encodeValue(ownerTag(oldToken), waiterRecord{Holder: "old", Lease: int64(g.ID), Since: joined.UnixMilli()}), clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}

	wantOrder := func(when string, holders ...string) {
		t.Helper()
		st, err := l.Inspect(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, w := range st[0].Waiters {
			got = append(got, w.Holder)
		}
		if !slices.Equal(got, holders) {
			t.Fatalf("%s: queue %q, want %q", when, got, holders)
		}
	}
	newReq := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "new", Queue: true}
	_, err = l.TryAcquire(ctx, newReq)
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Position != 0 || he.Waiters != 2 {
		t.Fatalf("a ranked waiter next to one of an earlier version: %v; want position 0 of 2", err)
	}
	wantOrder("while the earlier version's owner has not called again", "new", "old")

	// Its owner calls again with this version: ranked by when it joined.
	oldReq := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: oldToken, Holder: "old", Queue: true}
	mustQueue(t, l, oldReq)
	wantOrder("once its owner called again", "old", "new")
	got, err := cli.Get(ctx, oldKey)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the upgraded waiter key: %v, %v", got, err)
	}
	var rec waiterRecord
	p, ranked, err := decodeWaiter(got.Kvs[0].Value, &rec)
	switch {
	case err != nil || !ranked:
		t.Fatalf("the upgraded waiter value %q: ranked %v, error %v", got.Kvs[0].Value, ranked, err)
	case got.Kvs[0].CreateRevision != put.Header.Revision:
		t.Fatalf("the upgraded waiter key was created again (revision %d, joined at %d)", got.Kvs[0].CreateRevision, put.Header.Revision)
	case p.arrival != joined.UnixMilli()*1000 || p.rank != p.arrival:
		t.Fatalf("the upgraded waiter's place %+v, want rank and arrival when it joined (%d)", p, joined.UnixMilli()*1000)
	}

	// On a free key, the earlier version's waiter queued first does not
	// block a ranked one.
	other := "ns/upgrade/other"
	if _, err := cli.Put(ctx, l.waiterKey(other, ownerTag(oldToken)), encodeValue(ownerTag(oldToken), waiterRecord{Holder: "old", Lease: int64(g.ID), Since: joined.UnixMilli()}), clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	otherReq := lock.Request{Keys: []string{other}, TTL: time.Minute, Owner: ownerToken(t), Holder: "ranked", Queue: true}
	mustQueue(t, l, otherReq)
	if err := l.Release(ctx, mustTake(t, l, otherReq)); err != nil {
		t.Fatal(err)
	}

	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, newReq); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the newer waiter behind the upgraded one: %v; want ErrNotAcquired", err)
	}
	lease := mustTake(t, l, oldReq)
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	lease = mustTake(t, l, newReq)
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// skewedClock is the host clock off by d.
type skewedClock struct{ d time.Duration }

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.d) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestEqualBoostsStayFIFOAcrossSkewedClocks: Lockers whose clocks are an
// hour ahead, right, and an hour behind join one after the other: the
// arrivals follow the queue, not the clocks, so they keep the order they
// came in.
func TestEqualBoostsStayFIFOAcrossSkewedClocks(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/skew/"}
	key := "ns/skew/job"
	l := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second))
	h := mustTake(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "holder"})
	names := []string{"ahead", "right", "behind", "ahead again"}
	skews := []time.Duration{time.Hour, 0, -time.Hour, time.Hour}
	for i, name := range names {
		w := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second), WithClock(skewedClock{skews[i]}))
		mustQueue(t, w, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: name, Queue: true})
	}
	st, err := l.Inspect(ctxT(t, 10*time.Second), []string{key})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range st[0].Waiters {
		got = append(got, w.Holder)
	}
	if !slices.Equal(got, names) {
		t.Fatalf("queue %q, want the order they joined in, %q", got, names)
	}
	if err := l.Release(ctxT(t, 10*time.Second), h); err != nil {
		t.Fatal(err)
	}
}

// TestHeadCheckSeesABoostedNewcomer: a waiter that read itself at the head
// of a free key does not take it when a boosted request joined ahead of it
// since (the range compare of the values), and does once that one left.
func TestHeadCheckSeesABoostedNewcomer(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/headcheck/"}
	l := newTestLocker(t, cfg, WithWaiterTTL(10*time.Second))
	ctx := ctxT(t, time.Minute)
	key := "ns/head/job"
	h := mustTake(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "holder"})
	head := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "head", Queue: true}
	mustQueue(t, l, head)

	// What the head's attempt reads: itself at the head, behind the holder.
	s, err := l.sessionFor(ctx, head.TTL, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tag := ownerTag(head.Owner)
	value := encodeValue(tag, holderRecord{Holder: head.Holder, Lease: int64(s.id), TTLMilli: head.TTL.Milliseconds(), Session: true, Attempt: 1})
	resp, err := l.acquireTxn(ctx, head, tag, value, s.id, nil)
	if err != nil {
		t.Fatal(err)
	}
	views, err := l.parseViews(head, tag, resp)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded || views[0].pos != 0 || views[0].ownBound == "" {
		t.Fatalf("the head's read: succeeded %v, view %+v; want it refused, at the head, ranked", resp.Succeeded, views[0])
	}
	heads := []headCheck{{rev: views[0].ownRev, bound: views[0].ownBound}}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}

	// A boosted request joins ahead of it in between.
	boosted := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: ownerToken(t), Holder: "boosted", Queue: true, Boost: time.Hour}
	mustQueue(t, newTestLocker(t, cfg, WithWaiterTTL(10*time.Second)), boosted)
	resp, err = l.acquireTxn(ctx, head, tag, value, s.id, heads)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded {
		t.Fatal("the head took the key although a boosted waiter joined ahead of it since its read")
	}

	if err := l.Dequeue(ctx, boosted.Keys, boosted.Owner); err != nil {
		t.Fatal(err)
	}
	resp, err = l.acquireTxn(ctx, head, tag, value, s.id, heads)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded {
		t.Fatal("the head did not take the key once the boosted waiter left")
	}
}
