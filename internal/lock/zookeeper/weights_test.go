package zookeeper

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestWeightsOfThePreviousRelease: a slot node and a waiter node as the
// previous release wrote them (no weight in their data) take one slot each:
// on a limit of 4 they leave room for a weight of 2 beside them, not 3;
// Inspect reports the old slot's weight as 1; the old waiter calling again
// through this release takes the last slot with its weight of 1; and the
// nodes this release writes carry their weight.
func TestWeightsOfThePreviousRelease(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/weights-upgrade"}
	// The waiters keep their place for 30 s: the test takes seconds.
	l := newTestLocker(t, cfg, WithWaiterTTL(30*time.Second))
	raw := rawConn(t, e.Addrs())
	key := testKey("previous-release")
	req := func(holder string, weight int, queue bool) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: holder, Limit: 4, Weight: weight, Queue: queue}
	}
	read := func(p string, v any) []byte {
		t.Helper()
		b, _, err := raw.Get(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return b
	}

	// What the previous release's slot left: its data without a weight.
	oldSlot := req("old-slot", 1, false)
	old := mustTry(t, ctx, l, oldSlot)
	slot := l.nodePath(key, slotName(ownerHash(oldSlot.Owner)))
	var d holderData
	if b := read(slot, &d); d.Weight != 1 {
		t.Fatalf("slot node of weight 1: %s; want weight 1 in its data", b)
	}
	d.Weight = 0
	if b := mustJSON(d); bytes.Contains(b, []byte("weight")) {
		t.Fatalf("the previous release's slot data %s names a weight", b)
	} else if _, err := raw.Set(slot, b, -1); err != nil {
		t.Fatal(err)
	}
	// And its waiter, queued behind the slots (ranked name, no weight).
	oldWaiter := req("old-waiter", 1, true)
	ticket, _, err := l.serverNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiter := l.nodePath(key, waiterName(time.Now().UnixMicro(), ticket, ownerHash(oldWaiter.Owner)))
	wd := mustJSON(waiterData{Owner: ownerHash(oldWaiter.Owner), Holder: oldWaiter.Holder})
	if bytes.Contains(wd, []byte("weight")) {
		t.Fatalf("the previous release's waiter data %s names a weight", wd)
	}
	if _, err := raw.Create(waiter, wd, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	// 1 (the old slot) + 1 (the old waiter) + 3 > 4.
	var he *lock.HeldError
	if _, err := l.TryAcquire(ctx, req("three", 3, false)); !errors.As(err, &he) || he.Holders != 1 || he.Waiters != 1 {
		t.Fatalf("weight 3 beside the previous release's slot and waiter on a limit of 4: %v; want refused, 1 holder and 1 waiter", err)
	}
	two := mustTry(t, ctx, l, req("two", 2, false)) // 1 + 1 + 2
	if two.Weight != 2 {
		t.Fatalf("lease of weight 2: Weight %d", two.Weight)
	}
	var nd holderData
	if b := read(l.nodePath(key, slotName(ownerHash(two.Owner))), &nd); nd.Weight != 2 || nd.Limit != 4 {
		t.Fatalf("slot node of weight 2: %s; want weight 2 and limit 4", b)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, h := range st[0].Holders {
		got[h.Holder] = h.Weight
	}
	if st[0].HolderCount != 2 || got["old-slot"] != 1 || got["two"] != 2 || st[0].Queued != 1 {
		t.Fatalf("Inspect: %+v; want the old slot of weight 1, the new one of weight 2 and the old waiter", st[0])
	}

	// The old waiter calls again through this release: 1 + 2 + 1 fit.
	ol := newTestLocker(t, cfg, WithWaiterTTL(30*time.Second))
	w := mustTry(t, ctx, ol, oldWaiter)
	if ok, _, err := raw.Exists(waiter); err != nil || ok {
		t.Fatalf("the old waiter's node after it took its slot: exists %v, %v; want it gone", ok, err)
	}
	// The key is full: a waiter joins, its weight in its node's data.
	queued := req("queued", 2, true)
	wantRefused(t, ctx, l, queued, "weight 2 on a full key")
	children, _, err := raw.Children(l.keyPath(key))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range children {
		if _, _, h, ok := parseRanked(c); ok && h == ownerHash(queued.Owner) {
			var qd waiterData
			if b := read(l.nodePath(key, c), &qd); qd.Weight != 2 {
				t.Fatalf("waiter node of weight 2: %s; want weight 2 in its data", b)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no waiter node of the queued request among %q", children)
	}
	for _, lease := range []*lock.Lease{old, two} {
		if err := l.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := ol.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := l.Dequeue(ctx, queued.Keys, queued.Owner); err != nil {
		t.Fatal(err)
	}
}
