package zookeeper

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Store-specific cases of priority with aging (Request.Boost) that the
// shared suite cannot reach: waiters an earlier release queued, and the
// arrival node's chain.

// TestLegacyWaiterGoesFirst: a waiter node an earlier release made (its
// ticket only, no rank) stays ahead of the waiters that join after the
// upgrade, a boosted one too, keeps its name when its owner calls again
// through the new release, and takes the key first.
func TestLegacyWaiterGoesFirst(t *testing.T) {
	e, cfg, ctx := policyServer(t)
	key := testKey("legacy-waiter")
	l := newTestLocker(t, cfg)
	h := mustTry(t, ctx, l, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})

	// What an earlier release's join left: a ticket from the ticket node,
	// the waiter node in its session.
	old := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "old", Queue: true}
	ticket, _, err := l.serverNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, e.Addrs())
	legacy := l.nodePath(key, legacyWaiterName(ticket, ownerHash(old.Owner)))
	data := mustJSON(waiterData{Owner: ownerHash(old.Owner), Holder: old.Holder})
	if _, err := raw.Create(legacy, data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	boosted := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "boosted", Queue: true, Boost: lock.MaxBoost}
	bl := newTestLocker(t, cfg)
	var he *lock.HeldError
	if _, err := bl.TryAcquire(ctx, boosted); !errors.As(err, &he) || he.Position != 1 || he.Waiters != 2 {
		t.Fatalf("the boosted waiter behind the legacy one: %v; want position 1 of 2", err)
	}
	ol := newTestLocker(t, cfg)
	if _, err := ol.TryAcquire(ctx, old); !errors.As(err, &he) || he.Position != 0 {
		t.Fatalf("the legacy waiter calling again through the new release: %v; want position 0", err)
	}
	if ok, _, err := raw.Exists(legacy); err != nil || !ok {
		t.Fatalf("the legacy waiter's node after its owner called again: exists %v, %v; want it kept under its name", ok, err)
	}

	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, ctx, bl, boosted, "the boosted waiter at the release, behind the legacy one")
	got := mustTry(t, ctx, ol, old)
	if err := ol.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
	got = mustTry(t, ctx, bl, boosted)
	if err := bl.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// TestArrivalNeverGoesBack: the arrival node hands out arrivals after the
// last one even when the ensemble's clock is behind it (a leader whose
// clock is late, after an election), so equal boosts stay in arrival
// order. A Locker's next join is two writes, as before ranks (the arrival
// node's, at the version it knows, without reading it first, and the
// waiter node's create).
func TestArrivalNeverGoesBack(t *testing.T) {
	e, cfg, ctx := policyServer(t)
	key := testKey("arrival")
	l := newTestLocker(t, cfg)
	h := mustTry(t, ctx, l, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})

	// The last arrival, as a leader a minute ahead would have handed out.
	ahead := time.Now().Add(time.Minute).UnixMicro()
	raw := rawConn(t, e.Addrs())
	if _, err := raw.Set(l.arrivalPath, []byte(strconv.FormatInt(ahead, 10)), -1); err != nil {
		t.Fatal(err)
	}
	var reqs []lock.Request
	for _, name := range []string{"a", "b", "c"} {
		reqs = append(reqs, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: name, Queue: true})
	}
	wantRefused(t, ctx, newTestLocker(t, cfg), reqs[0], "a joining")
	wantRefused(t, ctx, l, reqs[1], "b joining")
	if w := writesDuring(t, ctx, l, func() { wantRefused(t, ctx, l, reqs[2], "c joining") }); w != 2 {
		t.Errorf("a join through a Locker that joined before: %d writes; want 2", w)
	}
	_, st, err := raw.Get(l.arrivalPath)
	if err != nil {
		t.Fatal(err)
	}
	if !l.arrival.known || l.arrival.version != st.Version {
		t.Errorf("the Locker's arrival version after its join: %d (known %v); the node's: %d", l.arrival.version, l.arrival.known, st.Version)
	}

	children, _, err := raw.Children(l.keyPath(key))
	if err != nil {
		t.Fatal(err)
	}
	ranks := map[string]int64{}
	for _, n := range children {
		if rank, _, hash, ok := parseRanked(n); ok {
			ranks[hash] = rank
		}
	}
	// The node's data plus one is the last arrival (its write's mtime is
	// earlier); each join hands out the one after.
	for i, r := range reqs {
		if got, want := ranks[ownerHash(r.Owner)], ahead+2+int64(i); got != want {
			t.Errorf("rank of %s, after an arrival a minute ahead: %d; want %d", r.Holder, got, want)
		}
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestRacingJoinsRankInTicketOrder: Lockers (operators) that join one queue
// at once, without boosts, get arrivals that grow with their tickets, so the
// queue's order is their arrival order: the arrival node's version check
// serializes them, and each that loses the race writes again.
func TestRacingJoinsRankInTicketOrder(t *testing.T) {
	_, cfg, ctx := policyServer(t)
	key := testKey("racing-joins")
	l := newTestLocker(t, cfg)
	h := mustTry(t, ctx, l, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})
	const n = 20
	lockers := make([]*Locker, n)
	for i := range lockers {
		lockers[i] = newTestLocker(t, cfg)
	}
	errs := parallel(n, func(i int) error {
		_, err := lockers[i].TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "w", Queue: true})
		if !errors.Is(err, lock.ErrNotAcquired) {
			return err
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("waiter %d joining: %v; want ErrNotAcquired", i, err)
		}
	}
	views, err := l.readKeys(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	ws := views[0].waiters
	if len(ws) != n {
		t.Fatalf("%d waiter nodes; want %d", len(ws), n)
	}
	for i := 1; i < n; i++ {
		if ws[i].rank <= ws[i-1].rank || ws[i].ticket <= ws[i-1].ticket {
			t.Fatalf("waiters %d and %d in queue order: ranks %d, %d, tickets %d, %d; want both growing", i-1, i, ws[i-1].rank, ws[i].rank, ws[i-1].ticket, ws[i].ticket)
		}
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}
