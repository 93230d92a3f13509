package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// mustTry makes one TryAcquire of req that must succeed.
func mustTry(t *testing.T, l *Locker, req lock.Request) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctxFor(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("TryAcquire of %s: %v", req.Holder, err)
	}
	return lease
}

// mustRefuse makes one TryAcquire of req that the keys must refuse, and
// returns what its HeldError says.
func mustRefuse(t *testing.T, l *Locker, req lock.Request) lock.HeldError {
	t.Helper()
	_, err := l.TryAcquire(ctxFor(t, 10*time.Second), req)
	var he *lock.HeldError
	if !errors.As(err, &he) {
		t.Fatalf("TryAcquire of %s: %v, want a *lock.HeldError", req.Holder, err)
	}
	return *he
}

// newOwner returns a new owner token.
func newOwner(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestPolicyMarksSurviveServerRestart: the marks are rows committed with
// the acquisition that set them: after a crash and restart of the server,
// and through new Lockers (new processes, new connections), the replaced
// waiter is still told so and the preempted lease is still not renewed,
// while it keeps its token and its key until it is released.
func TestPolicyMarksSurviveServerRestart(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	ctx := ctxFor(t, time.Minute)
	// Marks last two waiter TTLs: long enough for the restart.
	opt := WithWaiterTTL(30 * time.Second)
	key := "marks-restart"
	hreq := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder", Owner: newOwner(t)}
	h := mustTry(t, newTestLocker(t, cfg, opt), hreq)
	w := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "w", Owner: newOwner(t), Queue: true}
	mustRefuse(t, newTestLocker(t, cfg, opt), w)
	r := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: newOwner(t), Queue: true, Replace: true, Preempt: true}
	mustRefuse(t, newTestLocker(t, cfg, opt), r)

	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	hl := newTestLocker(t, cfg, opt)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := hl.Renew(ctx, h, time.Minute)
		if errors.Is(err, lock.ErrBackendUnavailable) {
			return false, nil
		}
		if !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
			return false, err
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("Renew of the preempted lease after the restart: %v; want ErrPreempted", err)
	}
	if _, err := newTestLocker(t, cfg, opt).TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the replaced waiter after the restart: %v; want ErrReplaced only", err)
	}
	// The holder's owner does not escape by acquiring again.
	if he := mustRefuse(t, newTestLocker(t, cfg, opt), hreq); he.Fence != h.Fence {
		t.Fatalf("the preempted owner acquiring again: %v; want refused, the key held with token %d", &he, h.Fence)
	}
	rl := newTestLocker(t, cfg, opt)
	mustRefuse(t, rl, r)
	if err := hl.Release(ctx, h); err != nil {
		t.Fatalf("Release of the preempted lease: %v", err)
	}
	got := mustTry(t, rl, r)
	if got.Fence <= h.Fence {
		t.Fatalf("r's token %d, want more than the preempted holder's %d", got.Fence, h.Fence)
	}
	if _, err := rl.Renew(ctx, got, time.Minute); err != nil {
		t.Fatalf("Renew of the lease taken after the preemption: %v", err)
	}
}

// TestReplacedMarkEnds: a replacement mark lasts two waiter TTLs of the
// replacing request, then the owner queues again, behind the request that
// replaced it, and the mark's row is gone.
func TestReplacedMarkEnds(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	l := newTestLocker(t, cfg) // waiter TTL 1s
	key := "marks-end"
	mustTry(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	w := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "w", Owner: newOwner(t), Queue: true}
	mustRefuse(t, l, w)
	r := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: newOwner(t), Queue: true, Replace: true}
	mustRefuse(t, l, r)
	if _, err := l.TryAcquire(ctxFor(t, 10*time.Second), w); !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("the replaced waiter within the waiter TTL: %v; want ErrReplaced", err)
	}
	var he *lock.HeldError
	err := wait.PollUntilContextTimeout(ctxFor(t, 30*time.Second), 200*time.Millisecond, 10*time.Second, false, func(ctx context.Context) (bool, error) {
		mustRefuse(t, l, r) // r keeps its place
		_, err := l.TryAcquire(ctx, w)
		if errors.Is(err, lock.ErrReplaced) {
			return false, nil
		}
		if errors.As(err, &he) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("the replaced waiter after its mark: %v; want it queued again", err)
	}
	if he.Position != 1 || he.Waiters != 2 {
		t.Fatalf("the replaced waiter queued again: %v (position %d of %d); want behind r", he, he.Position, he.Waiters)
	}
	var marks int
	if err := s.Conn(t).QueryRow(ctxFor(t, 10*time.Second), "SELECT count(*) FROM lockwarden.replaced").Scan(&marks); err != nil || marks != 0 {
		t.Fatalf("replacement marks left: %d, %v; want the ended one pruned", marks, err)
	}
}

// TestPreemptStopsSemaphoreHolders: a request with Preempt on a key whose
// slots are taken stops every slot holder (RenewAll says so for each), and
// takes the key once they are released.
func TestPreemptStopsSemaphoreHolders(t *testing.T) {
	s := pgtest.Start(t)
	l := newTestLocker(t, configFor(s))
	ctx := ctxFor(t, 30*time.Second)
	key := "preempt-slots"
	slot := func(name string) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: name, Owner: newOwner(t), Limit: 2}
	}
	a, b := mustTry(t, l, slot("a")), mustTry(t, l, slot("b"))
	r := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: newOwner(t), Queue: true, Replace: true, Preempt: true}
	mustRefuse(t, l, r)
	out, errs := l.RenewAll(ctx, []*lock.Lease{a, b}, time.Minute)
	for i, err := range errs {
		if out[i] != nil || !errors.Is(err, lock.ErrPreempted) {
			t.Fatalf("RenewAll of slot %d: %+v, %v; want ErrPreempted", i, out[i], err)
		}
	}
	for _, le := range []*lock.Lease{a, b} {
		if err := l.Release(ctx, le); err != nil {
			t.Fatal(err)
		}
	}
	got := mustTry(t, l, r)
	if got.Fence <= b.Fence {
		t.Fatalf("r's token %d, want more than the slots' (%d)", got.Fence, b.Fence)
	}
}

// TestUpgradeFromSchemaVersion3 is a rolling upgrade across migration 4: an
// operator of version 3 (its acquire, without the flags, and its renew, as
// that code calls them) keeps running beside this version. Its waiter is
// dropped by a request with Replace and is then refused without a place
// (it cannot tell ErrReplaced); its lease, preempted, is not extended by its
// renewal, which it reads as lost (a non-zero result), and stays held until
// released; this version renews nothing of it either (ErrPreempted).
func TestUpgradeFromSchemaVersion3(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "upgrade3"
	migrateTo(t, cfg, 3)
	raw := s.Conn(t)
	holder, waiter := newOwner(t), newOwner(t)
	keys := []string{"upgrade3"}
	type result struct {
		ok             bool
		fence          int64
		busy, position int32
	}
	v3Acquire := func(owner string, queue bool) result {
		t.Helper()
		var r result
		if err := raw.QueryRow(ctx, "SELECT o_ok, o_fence, o_busy, o_position FROM upgrade3.acquire($1, $2, 'v3', 30000, $3, 1000, $4, 0)",
			encodeKeys(keys), ownerDigest(owner), queue, lock.MaxFence-1).Scan(&r.ok, &r.fence, &r.busy, &r.position); err != nil {
			t.Fatalf("acquire through schema version 3: %v", err)
		}
		return r
	}
	h := v3Acquire(holder, false)
	if !h.ok {
		t.Fatalf("acquire through schema version 3: %+v", h)
	}
	if w := v3Acquire(waiter, true); w.ok || w.position != 0 {
		t.Fatalf("a version-3 waiter: %+v; want queued at the head", w)
	}

	upgraded := newTestLocker(t, cfg)
	r := lock.Request{Keys: keys, TTL: 30 * time.Second, Holder: "r", Owner: newOwner(t), Queue: true, Replace: true, Preempt: true}
	if he := mustRefuse(t, upgraded, r); he.Position != 0 || he.Waiters != 1 {
		t.Fatalf("the request with Replace and Preempt: %v (position %d of %d); want alone at the head", &he, he.Position, he.Waiters)
	}
	if w := v3Acquire(waiter, true); w.ok || w.busy != 1 || w.position != -1 {
		t.Fatalf("the replaced version-3 waiter: %+v; want refused without a place", w)
	}
	var lost int32
	if err := raw.QueryRow(ctx, "SELECT o_lost FROM upgrade3.renew(ARRAY[1], $1, ARRAY[$2], ARRAY[$3::bigint], 30000)",
		encodeKeys(keys), ownerDigest(holder), h.fence).Scan(&lost); err != nil || lost == 0 {
		t.Fatalf("version 3's renewal of the preempted lease: %d, %v; want a non-zero result (not renewed)", lost, err)
	}
	lease := &lock.Lease{Keys: keys, Owner: holder, Holder: "v3", Fence: h.fence, TTL: 30 * time.Second}
	if _, err := upgraded.Renew(ctx, lease, 30*time.Second); !errors.Is(err, lock.ErrPreempted) {
		t.Fatalf("Renew after the upgrade of the preempted version-3 lease: %v; want ErrPreempted", err)
	}
	if st, err := upgraded.Inspect(ctx, keys); err != nil || !st[0].Held || st[0].Fence != h.fence {
		t.Fatalf("Inspect of the preempted lease: %+v, %v; want still held with token %d", st, err, h.fence)
	}
	if err := upgraded.Release(ctx, lease); err != nil {
		t.Fatalf("Release of the preempted version-3 lease: %v", err)
	}
	got := mustTry(t, upgraded, r)
	if got.Fence <= h.fence {
		t.Fatalf("r's token %d, want more than %d", got.Fence, h.fence)
	}
}

// TestPolicyMarksLostAreSetAgain: a failover to an asynchronous standby can
// lose the last commits, among them the one that set the marks (the
// standby's tables are as they were before it). The rules apply on every
// call of the request, so its next call sets them again: until then the
// holder renews and the old waiter keeps its place, as on the standby;
// afterwards the waiter is replaced and the lease preempted.
func TestPolicyMarksLostAreSetAgain(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	l := newTestLocker(t, cfg)
	ctx := ctxFor(t, 30*time.Second)
	key := "marks-lost"
	h := mustTry(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder", Owner: newOwner(t)})
	w := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "w", Owner: newOwner(t), Queue: true}
	mustRefuse(t, l, w)

	raw := s.Conn(t)
	exec := func(q string) {
		t.Helper()
		if _, err := raw.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// What the standby has: the tables before the request's commit.
	exec("CREATE TABLE lockwarden.standby_waiters AS SELECT * FROM lockwarden.waiters")
	r := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: newOwner(t), Queue: true, Replace: true, Preempt: true}
	mustRefuse(t, l, r)
	// The promotion: the request's commit is gone.
	exec("DELETE FROM lockwarden.waiters")
	exec("INSERT INTO lockwarden.waiters SELECT * FROM lockwarden.standby_waiters")
	exec("DELETE FROM lockwarden.replaced")
	exec("UPDATE lockwarden.locks SET preempted = 0")

	h, err := l.Renew(ctx, h, time.Minute)
	if err != nil {
		t.Fatalf("Renew with the preemption lost: %v; want renewed", err)
	}
	if he := mustRefuse(t, l, w); he.Position != 0 {
		t.Fatalf("the waiter with the replacement lost: %v (position %d); want at the head again", &he, he.Position)
	}
	// The request's next call (Acquire calls again within a third of its
	// waiter TTL) sets both marks again.
	if he := mustRefuse(t, l, r); he.Position != 0 || he.Waiters != 1 {
		t.Fatalf("the request calling again: %v (position %d of %d); want alone at the head", &he, he.Position, he.Waiters)
	}
	if _, err := l.TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("the waiter after the request called again: %v; want ErrReplaced", err)
	}
	if _, err := l.Renew(ctx, h, time.Minute); !errors.Is(err, lock.ErrPreempted) {
		t.Fatalf("Renew after the request called again: %v; want ErrPreempted", err)
	}
}
