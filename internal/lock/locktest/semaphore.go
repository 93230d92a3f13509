package locktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// RunSemaphore runs the counting-semaphore conformance suite (lock.Request.Limit
// > 1) as subtests of t, for backends that support semaphores; others refuse
// Limit > 1 and run Run only. newLocker and opts are as for Run (WithRounds
// sets the rounds of the race, WithRacers its goroutines).
func RunSemaphore(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...Option) {
	cfg := config{waiterTTL: time.Second, rounds: 3, racers: 100}
	for _, o := range opts {
		o(&cfg)
	}
	s := &suite{cfg: cfg, newLocker: newLocker}
	t.Run("AtMostLimit", s.semAtMostLimit)
	t.Run("Race", s.semRace)
	t.Run("ReleaseFreesOneSlotAndWakes", s.semReleaseWakes)
	t.Run("FIFOAdmission", s.semFIFO)
	t.Run("FIFOAcquireOrder", s.semFIFOOrder)
	t.Run("ExpiredSlotIsFreed", s.semExpiry)
	t.Run("RenewRebuiltLease", s.semRenewRebuilt)
	t.Run("ReplacedLeaseOfSameOwnerTouchesNothing", func(t *testing.T) { s.replacedLease(t, 3) })
	t.Run("MixedWithMutex", s.semMixed)
	t.Run("MixedLimitsKeepEveryHoldersBound", s.semMixedLimits)
	t.Run("MultiKeyAllOrNothing", s.semMultiKey)
	t.Run("InspectBounds", s.semInspectBounds)
}

func semReq(key string, limit int, holder string) lock.Request {
	return lock.Request{Keys: []string{key}, TTL: longTTL, Holder: holder, Limit: limit}
}

// wantHolders checks what Inspect says about a key's holders, oldest first.
func wantHolders(t *testing.T, l lock.Locker, key string, leases ...*lock.Lease) lock.KeyState {
	t.Helper()
	st, err := inspect1(ctxT(t, 10*time.Second), l, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.HolderCount != len(leases) || len(st.Holders) != min(len(leases), lock.MaxInspectHolders) || st.Held != (len(leases) > 0) {
		t.Fatalf("Inspect(%q) = %+v: want %d holders", key, st, len(leases))
	}
	for i, h := range st.Holders {
		want := leases[min(i, len(leases)-1)]
		if h.Holder != want.Holder || h.Fence != want.Fence {
			t.Fatalf("Inspect(%q).Holders[%d] = %+v, want %q with fence %d (oldest first)", key, i, h, want.Holder, want.Fence)
		}
		if h.Expires.IsZero() || h.Acquired.IsZero() {
			t.Fatalf("Inspect(%q).Holders[%d] = %+v: want its acquisition and expiry", key, i, h)
		}
	}
	if len(leases) > 0 && (st.Holder != leases[0].Holder || st.Fence != leases[0].Fence) {
		t.Fatalf("Inspect(%q) = holder %q fence %d, want the oldest holder %q with fence %d", key, st.Holder, st.Fence, leases[0].Holder, leases[0].Fence)
	}
	return st
}

// semAtMostLimit: N leases hold a key at once, each with its own owner and a
// larger fence; the N+1th is refused with the holders counted and the
// oldest named.
func (s *suite) semAtMostLimit(t *testing.T) {
	const n = 3
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	var held []*lock.Lease
	for i := range n {
		lease := mustAcquire(t, s.newLocker(t), semReq(key, n, fmt.Sprintf("h%d", i)))
		if lease.Limit != n {
			t.Fatalf("Lease.Limit = %d, want %d", lease.Limit, n)
		}
		if i > 0 && lease.Fence <= held[i-1].Fence {
			t.Fatalf("holder %d fence %d, want > %d (the previous holder's)", i, lease.Fence, held[i-1].Fence)
		}
		held = append(held, lease)
	}
	_, err := l.TryAcquire(ctxT(t, 10*time.Second), semReq(key, n, "extra"))
	he := wantHeldError(t, err, key)
	if he.Holders != n || he.Holder != "h0" || he.Fence != held[0].Fence || he.Position != -1 {
		t.Fatalf("HeldError = %s, want Holders=%d, the oldest holder h0 with fence %d, Position -1", heldFields(he), n, held[0].Fence)
	}
	wantHolders(t, l, key, held...)
	// Another holder cannot release or renew a slot it does not hold.
	if err := l.Release(ctxT(t, 10*time.Second), &lock.Lease{Keys: []string{key}, Owner: owner(t), Limit: n}); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release by a non-owner = %v, want ErrNotHeld", err)
	}
	if _, err := l.Renew(ctxT(t, 10*time.Second), &lock.Lease{Keys: []string{key}, Owner: owner(t), Limit: n}, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew by a non-owner = %v, want ErrLost", err)
	}
	for _, le := range held {
		mustRelease(t, l, le)
	}
	if err := l.Release(ctxT(t, 10*time.Second), held[0]); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	wantHolders(t, l, key)
}

// raceTTL outlives a round of the race on a slow machine (under -race, a
// round of 100 racers on Redlock-5 has taken 18 s): the winners must hold
// until the round ends.
const raceTTL = 2 * time.Minute

// semRace: in each round many goroutines on several lockers race for a free
// key with N slots; exactly N win (the winners hold for the rest of the
// round), their fences are distinct, and a shared counter incremented by
// every holder never exceeds N.
func (s *suite) semRace(t *testing.T) {
	const n = 3
	lockers := []lock.Locker{s.newLocker(t), s.newLocker(t), s.newLocker(t), s.newLocker(t)}
	for round := range s.cfg.rounds {
		key := keys(t, 1)[0]
		ctx := ctxT(t, 30*time.Second)
		var (
			holding, peak atomic.Int32
			mu            sync.Mutex
			leases        []*lock.Lease
			errs          []error
			full          = make(chan struct{})
			once          sync.Once
			start         = make(chan struct{})
			wg            sync.WaitGroup
		)
		for g := range s.cfg.racers {
			l := lockers[g%len(lockers)]
			wg.Go(func() {
				<-start
				b := wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 1 << 30, Cap: 20 * time.Millisecond}
				for {
					select {
					case <-full:
						return
					case <-ctx.Done():
						return
					default:
					}
					req := semReq(key, n, fmt.Sprintf("racer-%d", g))
					req.TTL = raceTTL
					lease, err := l.TryAcquire(ctx, req)
					if err == nil {
						h := holding.Add(1)
						for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
						}
						mu.Lock()
						leases = append(leases, lease)
						if len(leases) >= n {
							once.Do(func() { close(full) })
						}
						mu.Unlock()
						return
					}
					if !errors.Is(err, lock.ErrNotAcquired) && !errors.Is(err, lock.ErrQuorum) && !errors.Is(err, lock.ErrBackendUnavailable) {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					select {
					case <-full:
						return
					case <-ctx.Done():
						return
					case <-time.After(b.Step()):
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: unexpected errors: %v", round, errors.Join(errs...))
		}
		for _, le := range leases {
			// Half the validity the store gave, not of the TTL: a store
			// may promise less than the TTL (ZooKeeper: its session
			// timeout, when shorter).
			if valid := le.Expires.Sub(le.Acquired); time.Until(le.Expires) < valid/2 {
				t.Fatalf("round %d took more than half the winners' validity (%v of the %v TTL): their leases may have expired", round, valid, raceTTL)
			}
		}
		if len(leases) != n || peak.Load() != n {
			t.Fatalf("round %d: %d racers hold the key (peak %d), want exactly %d", round, len(leases), peak.Load(), n)
		}
		fences := map[int64]bool{}
		for _, le := range leases {
			if fences[le.Fence] {
				t.Fatalf("round %d: fence %d issued twice (leases %+v)", round, le.Fence, leases)
			}
			fences[le.Fence] = true
		}
		slices.SortFunc(leases, func(a, b *lock.Lease) int { return cmp.Compare(a.Fence, b.Fence) })
		wantHolders(t, lockers[0], key, leases...)
		for _, le := range leases {
			mustRelease(t, lockers[1], le)
		}
	}
}

// semReleaseWakes: with every slot taken, a blocked Acquire gets the slot one
// release frees, with a larger fence than every holder's; the others still hold.
func (s *suite) semReleaseWakes(t *testing.T) {
	const n = 2
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h0 := mustAcquire(t, l, semReq(key, n, "h0"))
	h1 := mustAcquire(t, l, semReq(key, n, "h1"))
	type res struct {
		lease *lock.Lease
		err   error
	}
	done := make(chan res, 1)
	w := s.newLocker(t)
	go func() {
		req := semReq(key, n, "waiter")
		req.Queue = true
		lease, err := w.Acquire(ctxT(t, 20*time.Second), req)
		done <- res{lease, err}
	}()
	eventually(t, 10*time.Second, "the waiter queued", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, l, key)
		return err == nil && st.Queued == 1 && len(st.Waiters) == 1 && st.Waiters[0].Holder == "waiter", err
	})
	select {
	case r := <-done:
		t.Fatalf("Acquire returned while every slot was held: %+v, %v", r.lease, r.err)
	default:
	}
	mustRelease(t, l, h0)
	r := <-done
	if r.err != nil {
		t.Fatalf("Acquire after a release: %v", r.err)
	}
	if r.lease.Fence <= h1.Fence {
		t.Fatalf("waiter fence %d, want > %d", r.lease.Fence, h1.Fence)
	}
	st := wantHolders(t, l, key, h1, r.lease)
	if st.Queued != 0 || len(st.Waiters) != 0 {
		t.Fatalf("Inspect = %+v: the waiter that took the slot must leave the queue", st)
	}
	mustRelease(t, l, h1)
	mustRelease(t, w, r.lease)
}

// semFIFO: waiters take free slots in queue order, one TryAcquire at a time:
// a waiter takes a slot only when its position is below the free slots, and a
// request that does not queue never jumps the queue.
func (s *suite) semFIFO(t *testing.T) {
	const n = 3
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	var held []*lock.Lease
	for i := range n {
		held = append(held, mustAcquire(t, l, semReq(key, n, fmt.Sprintf("h%d", i))))
	}
	waiters := make([]lock.Request, 3)
	for i := range waiters {
		waiters[i] = semReq(key, n, fmt.Sprintf("w%d", i))
		waiters[i].Owner, waiters[i].Queue = owner(t), true
		_, err := l.TryAcquire(ctx, waiters[i])
		he := wantHeldError(t, err, key)
		if he.Position != i || he.Waiters != i+1 || he.Holders != n || he.Holder != "h0" {
			t.Fatalf("waiter %d: HeldError = %s, want Position %d, Waiters %d, Holders %d, Holder h0", i, heldFields(he), i, i+1, n)
		}
	}
	// Two slots free, three waiters: positions 0 and 1 may take them, not 2,
	// and not a request without a queue place.
	mustRelease(t, l, held[0])
	mustRelease(t, l, held[1])
	_, err := l.TryAcquire(ctx, semReq(key, n, "jumper"))
	he := wantHeldError(t, err, key)
	if he.Position != -1 || he.Waiters != 3 || he.Holders != 1 {
		t.Fatalf("request without a queue: HeldError = %s, want Position -1, Waiters 3, Holders 1", heldFields(he))
	}
	_, err = l.TryAcquire(ctx, waiters[2])
	he = wantHeldError(t, err, key)
	if he.Position != 2 || he.Holders != 1 {
		t.Fatalf("waiter 2 with two free slots: HeldError = %s, want Position 2, Holders 1", heldFields(he))
	}
	w1 := mustAcquire(t, l, waiters[1])
	st, err := inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Queued != 2 || st.HolderCount != 2 {
		t.Fatalf("Inspect = %+v: want 2 holders, 2 queued (w0, w2)", st)
	}
	// One slot free, w0 at the head: w2 (now position 1) waits, w0 takes it.
	_, err = l.TryAcquire(ctx, waiters[2])
	if he := wantHeldError(t, err, key); he.Position != 1 || he.Waiters != 2 {
		t.Fatalf("waiter 2 behind w0: HeldError = %s, want Position 1, Waiters 2", heldFields(he))
	}
	w0 := mustAcquire(t, l, waiters[0])
	_, err = l.TryAcquire(ctx, waiters[2])
	if he := wantHeldError(t, err, key); he.Position != 0 || he.Waiters != 1 || he.Holders != n {
		t.Fatalf("waiter 2 at the head of a full key: HeldError = %s, want Position 0, Waiters 1, Holders %d", heldFields(he), n)
	}
	wantHolders(t, l, key, held[2], w1, w0)
	if err := l.Dequeue(ctx, []string{key}, waiters[2].Owner); err != nil {
		t.Fatal(err)
	}
	for _, le := range []*lock.Lease{held[2], w1, w0} {
		mustRelease(t, l, le)
	}
}

// semFIFOOrder: blocked waiters take the slots in the order they queued, one
// per release: the waiter at position 0 takes the first freed slot.
func (s *suite) semFIFOOrder(t *testing.T) {
	const n = 2
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	held := []*lock.Lease{mustAcquire(t, l, semReq(key, n, "h0")), mustAcquire(t, l, semReq(key, n, "h1"))}
	const waiters = 3
	var (
		mu    sync.Mutex
		order []*lock.Lease
		errs  = make(chan error, waiters)
	)
	for i := range waiters {
		name := fmt.Sprintf("w%d", i)
		wl := s.newLocker(t)
		go func() {
			req := semReq(key, n, name)
			req.Queue = true
			lease, err := wl.Acquire(ctxT(t, 30*time.Second), req)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				return
			}
			mu.Lock()
			order = append(order, lease)
			mu.Unlock()
		}()
		eventually(t, 10*time.Second, name+" queued", func(ctx context.Context) (bool, error) {
			st, err := inspect1(ctx, l, key)
			return err == nil && st.Queued == i+1 && st.Waiters[i].Holder == name, err
		})
	}
	holders := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, le := range order {
			out = append(out, le.Holder)
		}
		return out
	}
	// h0's slot goes to w0, h1's to w1, and then w0's to w2.
	for i, want := range []string{"w0", "w1", "w2"} {
		rel := held[min(i, 1)]
		if i == 2 {
			mu.Lock()
			rel = order[0]
			mu.Unlock()
		}
		mustRelease(t, l, rel)
		eventually(t, 10*time.Second, want+" holds", func(ctx context.Context) (bool, error) {
			select {
			case err := <-errs:
				return false, err
			default:
			}
			got := holders()
			return len(got) == i+1, nil
		})
		if got := holders(); got[i] != want {
			t.Fatalf("slots taken in the order %v, want w0, w1, w2", got)
		}
		st, err := inspect1(ctxT(t, 10*time.Second), l, key)
		if err != nil {
			t.Fatal(err)
		}
		if st.HolderCount != n || st.Queued != waiters-1-i {
			t.Fatalf("after %s took a slot: Inspect = %+v, want %d holders and %d queued", want, st, n, waiters-1-i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, le := range order[1:] {
		mustRelease(t, l, le)
	}
}

// semExpiry: a holder that stops renewing (a crash) loses its slot by the
// backend's clock: a blocked Acquire gets it, the dead holder's Renew reports
// ErrLost and its Release ErrNotHeld.
func (s *suite) semExpiry(t *testing.T) {
	const n = 2
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	live := mustAcquire(t, l, semReq(key, n, "live"))
	req := semReq(key, n, "crashed")
	req.TTL = 300 * time.Millisecond
	dead := mustAcquire(t, s.newLocker(t), req)
	lease, err := l.Acquire(ctxT(t, 20*time.Second), semReq(key, n, "next"))
	if err != nil {
		t.Fatalf("Acquire of the crashed holder's slot: %v", err)
	}
	if lease.Fence <= dead.Fence {
		t.Fatalf("fence %d, want > %d", lease.Fence, dead.Fence)
	}
	wantHolders(t, l, key, live, lease)
	if _, err := l.Renew(ctxT(t, 10*time.Second), dead, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the expired slot = %v, want ErrLost", err)
	}
	if err := l.Release(ctxT(t, 10*time.Second), dead); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the expired slot = %v, want ErrNotHeld", err)
	}
	wantHolders(t, l, key, live, lease)
	mustRelease(t, l, live)
	mustRelease(t, l, lease)
}

// semRenewRebuilt: a lease rebuilt from its owner token, keys and limit (the
// operator after a restart) renews and releases the slot; RenewAll renews
// semaphore and mutex leases together.
func (s *suite) semRenewRebuilt(t *testing.T) {
	const n = 3
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	ks := keys(t, 2)
	req := lock.Request{Keys: ks, TTL: 2 * time.Second, Holder: "recovered", Owner: owner(t), Limit: n}
	orig := mustAcquire(t, l, req)
	other := mustAcquire(t, l, semReq(ks[0], n, "other"))
	before := wantHolders(t, l, ks[0], orig, other)
	rebuilt := &lock.Lease{Keys: ks, Owner: req.Owner, Holder: req.Holder, Fence: orig.Fence, Limit: n}
	renewed, err := s.newLocker(t).Renew(ctx, rebuilt, longTTL)
	if err != nil {
		t.Fatalf("Renew of a rebuilt semaphore lease: %v", err)
	}
	if renewed.Limit != n || renewed.Owner != req.Owner {
		t.Fatalf("renewed lease %+v: want the owner and Limit %d kept", renewed, n)
	}
	after := wantHolders(t, l, ks[0], orig, other)
	if !after.Holders[0].Expires.After(before.Holders[0].Expires.Add(5 * time.Second)) {
		t.Fatalf("expiry %v after the renewal, want about %v later than %v", after.Holders[0].Expires, longTTL-time.Second, before.Holders[0].Expires)
	}
	mutex := mustAcquire(t, l, lock.Request{Keys: keys(t, 1), TTL: time.Second, Holder: "mutex"})
	out, errs := l.RenewAll(ctx, []*lock.Lease{rebuilt, mutex, other}, longTTL)
	for i, err := range errs {
		if err != nil || out[i] == nil {
			t.Fatalf("RenewAll[%d]: %v", i, err)
		}
	}
	// Without its Limit the lease names a mutex the owner never held.
	if _, err := l.Renew(ctx, &lock.Lease{Keys: ks, Owner: req.Owner}, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the slot as a mutex = %v, want ErrLost", err)
	}
	if err := l.Release(ctx, rebuilt); err != nil {
		t.Fatalf("Release of the rebuilt lease: %v", err)
	}
	mustRelease(t, l, other)
	mustRelease(t, l, mutex)
}

// semMixed: one key used as a mutex (Limit 1) and as a semaphore (Limit 3):
// the mutex waits for every semaphore holder, a semaphore holder counts a
// mutex as taking the whole key, and the fences increase across both.
func (s *suite) semMixed(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	s0 := mustAcquire(t, l, semReq(key, 3, "s0"))
	s1 := mustAcquire(t, l, semReq(key, 3, "s1"))
	_, err := l.TryAcquire(ctx, semReq(key, 1, "mutex"))
	if he := wantHeldError(t, err, key); he.Holders != 2 || he.Holder != "s0" || he.Fence != s0.Fence {
		t.Fatalf("mutex on a semaphore with 2 holders: HeldError = %s, want Holders 2, oldest s0 (fence %d)", heldFields(he), s0.Fence)
	}
	mustRelease(t, l, s0)
	_, err = l.TryAcquire(ctx, semReq(key, 0, "mutex"))
	if he := wantHeldError(t, err, key); he.Holders != 1 || he.Holder != "s1" {
		t.Fatalf("mutex on a semaphore with 1 holder: HeldError = %s, want Holders 1, s1", heldFields(he))
	}
	mustRelease(t, l, s1)
	m := mustAcquire(t, l, semReq(key, 1, "mutex"))
	if m.Fence <= s1.Fence {
		t.Fatalf("mutex fence %d, want > %d (the last semaphore holder's)", m.Fence, s1.Fence)
	}
	wantHolders(t, l, key, m)
	_, err = l.TryAcquire(ctx, semReq(key, 3, "s2"))
	if he := wantHeldError(t, err, key); he.Holders != 1 || he.Holder != "mutex" || he.Fence != m.Fence {
		t.Fatalf("semaphore on a held mutex: HeldError = %s, want Holders 1, mutex (fence %d)", heldFields(he), m.Fence)
	}
	mustRelease(t, l, m)
	s2 := mustAcquire(t, l, semReq(key, 3, "s2"))
	if s2.Fence <= m.Fence {
		t.Fatalf("semaphore fence %d, want > %d (the mutex's)", s2.Fence, m.Fence)
	}
	mustRelease(t, l, s2)
}

// semMultiKey: a semaphore lease on several keys takes a slot of each or none.
func (s *suite) semMultiKey(t *testing.T) {
	const n = 2
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	ks := keys(t, 3)
	b0 := mustAcquire(t, l, semReq(ks[1], n, "b0"))
	b1 := mustAcquire(t, l, semReq(ks[1], n, "b1"))
	req := lock.Request{Keys: ks, TTL: longTTL, Holder: "multi", Limit: n}
	_, err := l.TryAcquire(ctx, req)
	if he := wantHeldError(t, err, ks[1]); he.Holders != n {
		t.Fatalf("HeldError = %s, want Holders %d", heldFields(he), n)
	}
	wantHolders(t, l, ks[0])
	wantHolders(t, l, ks[2])
	mustRelease(t, l, b0)
	multi := mustAcquire(t, l, req)
	wantHolders(t, l, ks[0], multi)
	wantHolders(t, l, ks[1], b1, multi)
	wantHolders(t, l, ks[2], multi)
	if multi.Fence <= b1.Fence {
		t.Fatalf("fence %d, want > %d", multi.Fence, b1.Fence)
	}
	mustRelease(t, l, multi)
	wantHolders(t, l, ks[0])
	wantHolders(t, l, ks[1], b1)
	mustRelease(t, l, b1)
}

// semInspectBounds: Inspect lists at most MaxInspectHolders holders and
// MaxInspectWaiters waiters, oldest first, and counts all of them.
func (s *suite) semInspectBounds(t *testing.T) {
	const n = lock.MaxInspectHolders + 2
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	var held []*lock.Lease
	for i := range n {
		held = append(held, mustAcquire(t, l, semReq(key, n, fmt.Sprintf("h%02d", i))))
	}
	sort.Slice(held, func(i, j int) bool { return held[i].Fence < held[j].Fence })
	const queued = lock.MaxInspectWaiters + 1
	var owners []string
	for i := range queued {
		req := semReq(key, n, fmt.Sprintf("w%02d", i))
		req.Owner, req.Queue = owner(t), true
		owners = append(owners, req.Owner)
		if _, err := l.TryAcquire(ctx, req); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("waiter %d: %v, want ErrNotAcquired", i, err)
		}
	}
	st := wantHolders(t, l, key, held...)
	if st.Queued != queued || len(st.Waiters) != lock.MaxInspectWaiters || st.Waiters[0].Holder != "w00" {
		t.Fatalf("Inspect = %+v: want %d queued, the first %d listed from w00", st, queued, lock.MaxInspectWaiters)
	}
	for _, o := range owners {
		if err := l.Dequeue(ctx, []string{key}, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, le := range held {
		mustRelease(t, l, le)
	}
}

// semMixedLimits: two locks name the same key with different limits (two
// namespaces' locks on a Global key, say). A request with the larger limit
// never takes the key past the bound a holder acquired with: holders of a
// Limit-2 lease never see a third holder, whatever limit it asks for.
func (s *suite) semMixedLimits(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	small := mustAcquire(t, l, semReq(key, 2, "small"))
	big := mustAcquire(t, l, semReq(key, 5, "big")) // 2 holders: within both bounds
	_, err := l.TryAcquire(ctx, semReq(key, 5, "third"))
	if he := wantHeldError(t, err, key); he.Holders != 2 {
		t.Fatalf("a third holder with limit 5 beside a limit-2 holder: HeldError = %s, want busy with 2 holders", heldFields(he))
	}
	mustRelease(t, l, small)
	third := mustAcquire(t, l, semReq(key, 5, "third")) // the limit-2 holder is gone
	wantHolders(t, l, key, big, third)
	mustRelease(t, l, big)
	mustRelease(t, l, third)
}
