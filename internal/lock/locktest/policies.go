package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// RunPolicies runs the conformance cases of the queue policies as subtests
// of t: Request.Replace (contention ReplaceQueued: a newer waiter drops the
// older ones of its keys, which are told so) and Request.Preempt (contention
// CancelInProgress: a newer waiter stops the holders, whose leases are no
// longer renewed but never shortened). They are rules of the store's queue,
// so they hold between Lockers (operators) that share the store. newLocker
// is as for Run.
func RunPolicies(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...Option) {
	s := caseSuite(newLocker, opts)
	t.Run("ReplaceDropsOlderWaiters", s.replaceDropsOlder)
	t.Run("ReplaceTakesAFreeKeyAtOnce", s.replaceTakesFree)
	t.Run("ReplaceOnEveryKey", s.replaceEveryKey)
	t.Run("ReplaceOnASemaphore", s.replaceSemaphore)
	t.Run("AcquireEndsWhenReplaced", s.acquireEndsWhenReplaced)
	t.Run("PreemptStopsTheHolder", s.preemptStopsHolder)
	t.Run("PreemptedLeaseIsNeverShortened", s.preemptNeverShortens)
	t.Run("PreemptedOwnerCannotTakeTheKeyAgain", s.preemptedOwnerAgain)
	t.Run("RenewAllReportsPreemption", s.renewAllPreempted)
	t.Run("InvalidPolicies", s.invalidPolicies)
}

// caseSuite is the suite of the queue-rule cases (RunPolicies,
// RunPriority): a waiter TTL of a second unless opts say otherwise.
func caseSuite(newLocker func(t *testing.T) lock.Locker, opts []Option) *suite {
	s := &suite{cfg: config{waiterTTL: time.Second, rounds: 10, racers: 100}, newLocker: newLocker}
	for _, o := range opts {
		o(&s.cfg)
	}
	return s
}

// queueOnce makes one queued TryAcquire that must be refused with the key
// busy, and returns what its HeldError says.
func queueOnce(t *testing.T, l lock.Locker, req lock.Request) lock.HeldError {
	t.Helper()
	_, err := l.TryAcquire(ctxT(t, 10*time.Second), req)
	return *wantHeldError(t, err, req.Keys[0])
}

// wantReplaced makes one TryAcquire of req, which a newer request replaced.
func wantReplaced(t *testing.T, l lock.Locker, req lock.Request) {
	t.Helper()
	lease, err := l.TryAcquire(ctxT(t, 10*time.Second), req)
	if lease != nil || !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("TryAcquire of %s after a newer request replaced it: lease %+v, error %v; want no lease and an error matching ErrReplaced", req.Holder, lease, err)
	}
	if errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of %s after it was replaced: %v; want ErrReplaced only, not ErrNotAcquired (it is no longer queued)", req.Holder, err)
	}
}

// wantQueue checks that key's queue holds exactly the holders named, in order.
func wantQueue(t *testing.T, l lock.Locker, key string, holders ...string) {
	t.Helper()
	st, err := inspect1(ctxT(t, 10*time.Second), l, key)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range st.Waiters {
		got = append(got, w.Holder)
	}
	if st.Queued != len(holders) || len(got) != len(holders) {
		t.Fatalf("queue of %s: %d waiting %q; want %q", key, st.Queued, got, holders)
	}
	for i := range holders {
		if got[i] != holders[i] {
			t.Fatalf("queue of %s: %q; want %q", key, got, holders)
		}
	}
}

// replaceDropsOlder: behind a holder, a waiter with Replace drops the two
// older waiters, who are told so when they call again; a waiter that comes
// after it queues behind it, and is not dropped when it calls again; it is
// the one that takes the key at the release.
func (s *suite) replaceDropsOlder(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	req := func(name string, replace bool) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: longTTL, Holder: name, Owner: owner(t), Queue: true, Replace: replace}
	}
	w1, w2, r, late := req("w1", false), req("w2", false), req("r", true), req("late", false)
	queueOnce(t, s.newLocker(t), w1)
	queueOnce(t, s.newLocker(t), w2)
	wantQueue(t, l, key, "w1", "w2")
	rl := s.newLocker(t)
	if he := queueOnce(t, rl, r); he.Holder != "holder" {
		t.Fatalf("refusal of r: %s, want the key held by holder", heldFields(&he))
	}
	wantQueue(t, l, key, "r")
	wantReplaced(t, s.newLocker(t), w1)
	wantReplaced(t, s.newLocker(t), w2)
	queueOnce(t, s.newLocker(t), late)
	// r calls again to keep its place: late came after it and stays.
	if he := queueOnce(t, rl, r); he.Position != 0 {
		t.Fatalf("r calling again: %s, want it at the head (position 0)", heldFields(&he))
	}
	wantQueue(t, l, key, "r", "late")
	mustRelease(t, l, h)
	got := mustAcquire(t, rl, r)
	if got.Fence <= h.Fence {
		t.Fatalf("r's token %d, want more than the holder's %d", got.Fence, h.Fence)
	}
	wantQueue(t, l, key, "late")
	mustRelease(t, rl, got)
}

// replaceTakesFree: when the key is free but a waiter is at the head (the
// holder just left), a request with Replace drops it and takes the key.
func (s *suite) replaceTakesFree(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	w := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "w", Owner: owner(t), Queue: true}
	queueOnce(t, l, w)
	mustRelease(t, l, h)
	r := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true}
	got := mustAcquire(t, s.newLocker(t), r)
	wantReplaced(t, l, w)
	st, err := inspect1(ctxT(t, 10*time.Second), l, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Holder != "r" || st.Queued != 0 {
		t.Fatalf("Inspect = %+v, want held by r with nobody queued", st)
	}
	mustRelease(t, l, got)
}

// replaceEveryKey: a request for two keys drops the older waiters of each.
func (s *suite) replaceEveryKey(t *testing.T) {
	l := s.newLocker(t)
	ks := keys(t, 2)
	h := mustAcquire(t, l, lock.Request{Keys: ks, TTL: longTTL, Holder: "holder"})
	w0 := lock.Request{Keys: ks[:1], TTL: longTTL, Holder: "w0", Owner: owner(t), Queue: true}
	w1 := lock.Request{Keys: ks[1:], TTL: longTTL, Holder: "w1", Owner: owner(t), Queue: true}
	queueOnce(t, l, w0)
	queueOnce(t, l, w1)
	r := lock.Request{Keys: ks, TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true}
	queueOnce(t, l, r)
	wantQueue(t, l, ks[0], "r")
	wantQueue(t, l, ks[1], "r")
	wantReplaced(t, l, w0)
	wantReplaced(t, l, w1)
	mustRelease(t, l, h)
	mustRelease(t, l, mustAcquire(t, l, r))
}

// replaceSemaphore: on a full semaphore, a request with Replace drops the
// older waiter and takes the first slot that frees.
func (s *suite) replaceSemaphore(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	slot := func(name string) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: longTTL, Holder: name, Owner: owner(t), Limit: 2}
	}
	a := mustAcquire(t, l, slot("a"))
	b := mustAcquire(t, l, slot("b"))
	w := slot("w")
	w.Queue = true
	queueOnce(t, l, w)
	r := slot("r")
	r.Queue, r.Replace = true, true
	queueOnce(t, l, r)
	wantQueue(t, l, key, "r")
	wantReplaced(t, l, w)
	mustRelease(t, l, a)
	got := mustAcquire(t, l, r)
	if got.Fence <= b.Fence {
		t.Fatalf("r's token %d, want more than every earlier slot's (b: %d)", got.Fence, b.Fence)
	}
	mustRelease(t, l, got)
	mustRelease(t, l, b)
}

// acquireEndsWhenReplaced: a blocking Acquire that waits in the queue ends
// with ErrReplaced when a newer request with Replace takes its place, well
// before its context ends.
func (s *suite) acquireEndsWhenReplaced(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	done := make(chan error, 1)
	ctx := ctxT(t, 60*time.Second)
	go func() {
		_, err := s.newLocker(t).Acquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "old", Queue: true})
		done <- err
	}()
	eventually(t, 10*time.Second, "old queued", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, l, key)
		return err == nil && st.Queued == 1, err
	})
	queueOnce(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true})
	select {
	case err := <-done:
		if !errors.Is(err, lock.ErrReplaced) || ctx.Err() != nil {
			t.Fatalf("Acquire of the replaced waiter: %v; want an error matching ErrReplaced before its context ends", err)
		}
	case <-ctx.Done():
		t.Fatal("the replaced waiter's Acquire did not end within 60s")
	}
	wantQueue(t, l, key, "r")
	mustRelease(t, l, h)
}

// preemptStopsHolder: a request with Preempt is refused while the holder
// holds; the holder's next renewal fails with ErrPreempted but the lease
// still holds the key (nobody else takes it) until the holder releases it;
// then the request takes the key with a larger token, and its own lease
// renews as any other.
func (s *suite) preemptStopsHolder(t *testing.T) {
	hl, rl := s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 30*time.Second)
	key := keys(t, 1)[0]
	h := mustAcquire(t, hl, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	r := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true, Preempt: true}
	if he := queueOnce(t, rl, r); he.Holder != "holder" {
		t.Fatalf("refusal of r: %s, want the key held by holder", heldFields(&he))
	}
	if _, err := hl.Renew(ctx, h, longTTL); !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the preempted lease: %v; want an error matching ErrPreempted and not ErrLost (the lease still holds)", err)
	}
	st, err := inspect1(ctx, rl, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Holder != "holder" || st.Fence != h.Fence {
		t.Fatalf("Inspect after the preemption = %+v; want still held by holder (token %d) until it releases", st, h.Fence)
	}
	queueOnce(t, rl, r)
	mustRelease(t, hl, h)
	got := mustAcquire(t, rl, r)
	if got.Fence <= h.Fence {
		t.Fatalf("r's token %d, want more than the preempted holder's %d", got.Fence, h.Fence)
	}
	if _, err := rl.Renew(ctx, got, longTTL); err != nil {
		t.Fatalf("Renew of the lease taken after the preemption: %v; a later lease is not preempted", err)
	}
	mustRelease(t, rl, got)
}

// preemptNeverShortens: a preempted holder that does not release keeps its
// key until its lease's TTL ends, and no longer: the request (blocking
// Acquire) gets it only after the holder's Expires.
func (s *suite) preemptNeverShortens(t *testing.T) {
	hl, rl := s.newLocker(t), s.newLocker(t)
	key := keys(t, 1)[0]
	ttl := 3 * time.Second
	h := mustAcquire(t, hl, lock.Request{Keys: []string{key}, TTL: ttl, Holder: "holder"})
	got, err := rl.Acquire(ctxT(t, 30*time.Second), lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "r", Queue: true, Replace: true, Preempt: true})
	returned := time.Now()
	if err != nil {
		t.Fatalf("Acquire with Preempt: %v", err)
	}
	if returned.Before(h.Expires) {
		t.Fatalf("the preempting request had the key at %s, before the holder's lease expired at %s: a preempted lease must never be shortened",
			returned.Format(time.RFC3339Nano), h.Expires.Format(time.RFC3339Nano))
	}
	if got.Fence <= h.Fence {
		t.Fatalf("token %d, want more than the preempted holder's %d", got.Fence, h.Fence)
	}
	if _, err := hl.Renew(ctxT(t, 10*time.Second), h, ttl); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the preempted lease after its TTL: %v, want ErrLost", err)
	}
	mustRelease(t, rl, got)
}

// preemptedOwnerAgain: the owner of a preempted lease does not escape the
// preemption by acquiring its key again (which would replace its lease
// with a new, unpreempted one) while the preempting request waits.
func (s *suite) preemptedOwnerAgain(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	hreq := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder", Owner: owner(t)}
	h := mustAcquire(t, l, hreq)
	queueOnce(t, s.newLocker(t), lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true, Preempt: true})
	lease, err := l.TryAcquire(ctx, hreq)
	if lease != nil || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the preempted owner acquiring its key again: lease %+v, error %v; want it refused (ErrNotAcquired)", lease, err)
	}
	st, err := inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Fence != h.Fence {
		t.Fatalf("Inspect = %+v; want still held by the preempted lease (token %d)", st, h.Fence)
	}
	mustRelease(t, l, h)
}

// renewAllPreempted: RenewAll tells the preempted lease from the others.
func (s *suite) renewAllPreempted(t *testing.T) {
	l := s.newLocker(t)
	ks := keys(t, 2)
	a := mustAcquire(t, l, lock.Request{Keys: ks[:1], TTL: longTTL, Holder: "a"})
	b := mustAcquire(t, l, lock.Request{Keys: ks[1:], TTL: longTTL, Holder: "b"})
	queueOnce(t, s.newLocker(t), lock.Request{Keys: ks[:1], TTL: longTTL, Holder: "r", Owner: owner(t), Queue: true, Replace: true, Preempt: true})
	out, errs := l.RenewAll(ctxT(t, 10*time.Second), []*lock.Lease{a, b}, longTTL)
	if !errors.Is(errs[0], lock.ErrPreempted) || out[0] != nil {
		t.Errorf("RenewAll of the preempted lease: %+v, %v; want ErrPreempted", out[0], errs[0])
	}
	if errs[1] != nil || out[1] == nil {
		t.Errorf("RenewAll of the other lease: %v; want it renewed", errs[1])
	}
	mustRelease(t, l, a)
	mustRelease(t, l, b)
}

// invalidPolicies: the combinations that make no sense are refused before
// anything reaches the store.
func (s *suite) invalidPolicies(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 10*time.Second)
	k := keys(t, 1)[0]
	base := lock.Request{Keys: []string{k}, TTL: longTTL, Owner: owner(t)}
	for name, mod := range map[string]func(*lock.Request){
		"replace without queue":   func(r *lock.Request) { r.Replace = true },
		"preempt without replace": func(r *lock.Request) { r.Queue, r.Preempt = true, true },
		"preempt on a semaphore":  func(r *lock.Request) { r.Queue, r.Replace, r.Preempt, r.Limit = true, true, true, 2 },
	} {
		req := base
		mod(&req)
		if _, err := l.TryAcquire(ctx, req); !errors.Is(err, lock.ErrInvalidRequest) {
			t.Errorf("%s: %v, want an error matching ErrInvalidRequest", name, err)
		}
	}
	st, err := inspect1(ctx, l, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held || st.Queued != 0 {
		t.Fatalf("after invalid requests Inspect = %+v, want untouched", st)
	}
}
