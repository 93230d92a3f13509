package zookeeper

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// Store-specific cases of priority with aging (Request.Boost) that the
// shared suite cannot reach: waiters an earlier release queued, and the
// arrival node's chain.

// heldKey is a key held by a Locker on the standalone server, for waiters
// to queue behind.
type heldKey struct {
	e     *zktest.Ensemble
	cfg   Config
	ctx   context.Context
	key   string
	l     *Locker // the holder's, also for reads
	lease *lock.Lease
}

func newHeldKey(t *testing.T, name string) *heldKey {
	t.Helper()
	e, cfg, ctx := policyServer(t)
	k := &heldKey{e: e, cfg: cfg, ctx: ctx, key: testKey(name), l: newTestLocker(t, cfg)}
	k.lease = mustTry(t, ctx, k.l, lock.Request{Keys: []string{k.key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})
	return k
}

// waiter is a queued request for the key by a new owner.
func (k *heldKey) waiter(t *testing.T, holder string, boost time.Duration) lock.Request {
	return lock.Request{Keys: []string{k.key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: holder, Queue: true, Boost: boost}
}

// release releases lease through l.
func (k *heldKey) release(t *testing.T, l *Locker, lease *lock.Lease) {
	t.Helper()
	if err := l.Release(k.ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestLegacyWaiterGoesFirst: a waiter node an earlier release made (its
// ticket only, no rank) stays ahead of the waiters that join after the
// upgrade, a boosted one too, keeps its name when its owner calls again
// through the new release, and takes the key first.
func TestLegacyWaiterGoesFirst(t *testing.T) {
	k := newHeldKey(t, "legacy-waiter")
	ctx := k.ctx
	// What an earlier release's join left: a ticket from the ticket node,
	// the waiter node in its session.
	old := k.waiter(t, "old", 0)
	ticket, _, err := k.l.serverNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, k.e.Addrs())
	legacy := k.l.nodePath(k.key, legacyWaiterName(ticket, ownerHash(old.Owner)))
	data := mustJSON(waiterData{Owner: ownerHash(old.Owner), Holder: old.Holder})
	if _, err := raw.Create(legacy, data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	boosted := k.waiter(t, "boosted", lock.MaxBoost)
	bl := newTestLocker(t, k.cfg)
	var he *lock.HeldError
	if _, err := bl.TryAcquire(ctx, boosted); !errors.As(err, &he) || he.Position != 1 || he.Waiters != 2 {
		t.Fatalf("the boosted waiter behind the legacy one: %v; want position 1 of 2", err)
	}
	ol := newTestLocker(t, k.cfg)
	if _, err := ol.TryAcquire(ctx, old); !errors.As(err, &he) || he.Position != 0 {
		t.Fatalf("the legacy waiter calling again through the new release: %v; want position 0", err)
	}
	if ok, _, err := raw.Exists(legacy); err != nil || !ok {
		t.Fatalf("the legacy waiter's node after its owner called again: exists %v, %v; want it kept under its name", ok, err)
	}

	k.release(t, k.l, k.lease)
	wantRefused(t, ctx, bl, boosted, "the boosted waiter at the release, behind the legacy one")
	k.release(t, ol, mustTry(t, ctx, ol, old))
	k.release(t, bl, mustTry(t, ctx, bl, boosted))
}

// TestArrivalNeverGoesBack: the arrival node hands out arrivals after the
// last one even when the ensemble's clock is behind it (a leader whose
// clock is late, after an election), so equal boosts stay in arrival
// order. A Locker's next join is two writes, as before ranks (the arrival
// node's, at the version it knows, without reading it first, and the
// waiter node's create).
func TestArrivalNeverGoesBack(t *testing.T) {
	k := newHeldKey(t, "arrival")
	ctx, l := k.ctx, k.l
	// The last arrival, as a leader a minute ahead would have handed out.
	ahead := time.Now().Add(time.Minute).UnixMicro()
	raw := rawConn(t, k.e.Addrs())
	if _, err := raw.Set(l.arrivalPath, []byte(strconv.FormatInt(ahead, 10)), -1); err != nil {
		t.Fatal(err)
	}
	reqs := []lock.Request{k.waiter(t, "a", 0), k.waiter(t, "b", 0), k.waiter(t, "c", 0)}
	wantRefused(t, ctx, newTestLocker(t, k.cfg), reqs[0], "a joining")
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

	ranks := map[string]int64{}
	for _, w := range k.waiters(t) {
		ranks[w.hash] = w.rank
	}
	// The node's data plus one is the last arrival (its write's mtime is
	// earlier); each join hands out the one after.
	for i, r := range reqs {
		if got, want := ranks[ownerHash(r.Owner)], ahead+2+int64(i); got != want {
			t.Errorf("rank of %s, after an arrival a minute ahead: %d; want %d", r.Holder, got, want)
		}
	}
	k.release(t, l, k.lease)
}

// TestRacingJoinsRankInTicketOrder: Lockers (operators) that join one queue
// at once, without boosts, get arrivals that grow with their tickets, so the
// queue's order is their arrival order: the arrival node's version check
// serializes them, and each that loses the race writes again.
func TestRacingJoinsRankInTicketOrder(t *testing.T) {
	k := newHeldKey(t, "racing-joins")
	const n = 20
	lockers := make([]*Locker, n)
	reqs := make([]lock.Request, n)
	for i := range lockers {
		lockers[i], reqs[i] = newTestLocker(t, k.cfg), k.waiter(t, "w", 0)
	}
	errs := parallel(n, func(i int) error {
		if _, err := lockers[i].TryAcquire(k.ctx, reqs[i]); !errors.Is(err, lock.ErrNotAcquired) {
			return err
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("waiter %d joining: %v; want ErrNotAcquired", i, err)
		}
	}
	ws := k.waiters(t)
	if len(ws) != n {
		t.Fatalf("%d waiter nodes; want %d", len(ws), n)
	}
	for i := 1; i < n; i++ {
		if ws[i].rank <= ws[i-1].rank || ws[i].ticket <= ws[i-1].ticket {
			t.Fatalf("waiters %d and %d in queue order: ranks %d, %d, tickets %d, %d; want both growing", i-1, i, ws[i-1].rank, ws[i].rank, ws[i-1].ticket, ws[i].ticket)
		}
	}
	k.release(t, k.l, k.lease)
}

// waiters are the key's waiter nodes, in queue order.
func (k *heldKey) waiters(t *testing.T) []*waiterView {
	t.Helper()
	views, err := k.l.readKeys(k.ctx, []string{k.key})
	if err != nil {
		t.Fatal(err)
	}
	return views[0].waiters
}
