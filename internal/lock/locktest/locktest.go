// Package locktest is the conformance suite every lock.Locker implementation
// must pass: mutual exclusion under contention, owner checks, expiry, fencing
// tokens, all-or-nothing multi-key leases, FIFO queues with dead waiters,
// release notifications, Inspect and argument validation.
//
// A backend's tests call Run with a function that returns a new Locker on the
// same backend each time it is called (the suite uses several, like several
// processes would):
//
//	func TestConformance(t *testing.T) {
//		srv := start(t)
//		locktest.Run(t, func(t *testing.T) lock.Locker { return newLocker(t, srv) },
//			locktest.WithWaiterTTL(time.Second))
//	}
//
// Every subtest uses fresh key names, so lockers may share a backend with
// other tests.
package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

type config struct {
	waiterTTL time.Duration
	rounds    int
	racers    int
}

// Option configures Run.
type Option func(*config)

// WithWaiterTTL tells the suite the waiter TTL the lockers were built with; it
// waits at most a few times that long for a dead waiter to be pruned. Build
// the lockers with a short one (a second) to keep the suite fast. Default: 1s.
func WithWaiterTTL(d time.Duration) Option { return func(c *config) { c.waiterTTL = d } }

// WithRounds sets how many rounds the mutual-exclusion race runs. Default: 10.
func WithRounds(n int) Option { return func(c *config) { c.rounds = n } }

// WithRacers sets how many goroutines race for the key in each round. Default: 100.
func WithRacers(n int) Option { return func(c *config) { c.racers = n } }

// Run runs the conformance suite as subtests of t. newLocker must return a new
// Locker on the same backend at every call; the suite closes none of them
// (register cleanups in newLocker).
func Run(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...Option) {
	cfg := config{waiterTTL: time.Second, rounds: 10, racers: 100}
	for _, o := range opts {
		o(&cfg)
	}
	s := &suite{cfg: cfg, newLocker: newLocker}
	t.Run("MutualExclusion", s.mutualExclusion)
	t.Run("AcquireWaitsForRelease", s.acquireWaitsForRelease)
	t.Run("NonOwnerCannotReleaseOrRenew", s.nonOwner)
	t.Run("ExpiredLeaseIsLost", s.expiredLease)
	t.Run("ReleaseLetsNextIn", s.releaseLetsNextIn)
	t.Run("FencesStrictlyIncrease", s.fencesIncrease)
	t.Run("SameOwnerAcquiringAgainGetsLargerToken", s.sameOwnerAgain)
	t.Run("ReplacedLeaseOfSameOwnerTouchesNothing", func(t *testing.T) { s.replacedLease(t, 1) })
	t.Run("MultiKeyAllOrNothing", s.multiKey)
	t.Run("FIFOSkipsDeadWaiter", s.fifoDeadWaiter)
	t.Run("FIFOAcquireOrder", s.fifoAcquireOrder)
	t.Run("AcquireLeavesQueueOnCancel", s.acquireLeavesQueue)
	t.Run("Dequeue", s.dequeue)
	t.Run("WatchDeliversRelease", s.watch)
	t.Run("Inspect", s.inspect)
	t.Run("RenewAll", s.renewAll)
	t.Run("RenewExtendsTheLease", s.renewExtends)
	t.Run("UnreadWatchNeverBlocksReleases", s.unreadWatch)
	t.Run("ReleaseOfExpiredLeaseIsNotHeld", s.releaseExpired)
	t.Run("InvalidRequests", s.invalid)
}

type suite struct {
	cfg       config
	newLocker func(t *testing.T) lock.Locker
}

const longTTL = 10 * time.Second

// keys returns n fresh key names for this test.
func keys(t *testing.T, n int) []string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "." + hex.EncodeToString(b[:])
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s.%d", base, i)
	}
	return out
}

func owner(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %v (last error: %v)", what, timeout, last)
	}
}

// mustAcquire makes one TryAcquire that must succeed. A backend error (a
// timeout on a loaded machine) is retried a few times; ErrNotAcquired is not.
func mustAcquire(t *testing.T, l lock.Locker, req lock.Request) *lock.Lease {
	t.Helper()
	var err error
	for range 3 {
		var lease *lock.Lease
		lease, err = l.TryAcquire(ctxT(t, 10*time.Second), req)
		if err == nil {
			return lease
		}
		if !errors.Is(err, lock.ErrBackendUnavailable) && !errors.Is(err, lock.ErrQuorum) {
			break
		}
	}
	t.Fatalf("TryAcquire(%q): %v", req.Keys, err)
	return nil
}

func mustRelease(t *testing.T, l lock.Locker, lease *lock.Lease) {
	t.Helper()
	if err := l.Release(ctxT(t, 10*time.Second), lease); err != nil {
		t.Fatalf("Release(%q): %v", lease.Keys, err)
	}
}

func inspect1(ctx context.Context, l lock.Locker, key string) (lock.KeyState, error) {
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		return lock.KeyState{}, err
	}
	if len(st) != 1 || st[0].Key != key {
		return lock.KeyState{}, fmt.Errorf("Inspect(%q) = %+v: want one state for the key", key, st)
	}
	return st[0], nil
}

// heldFields shows every field of a HeldError (its Error() leaves out the
// queue position, the waiters and the holder count).
func heldFields(he *lock.HeldError) string {
	return fmt.Sprintf("{Key:%q Holder:%q Fence:%d Position:%d Waiters:%d Holders:%d}", he.Key, he.Holder, he.Fence, he.Position, he.Waiters, he.Holders)
}

func wantHeldError(t *testing.T, err error, key string) *lock.HeldError {
	t.Helper()
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("error = %v: want one matching ErrNotAcquired", err)
	}
	var he *lock.HeldError
	if !errors.As(err, &he) {
		t.Fatalf("error = %v: want a *lock.HeldError", err)
	}
	if he.Key != key {
		t.Fatalf("HeldError.Key = %q, want %q", he.Key, key)
	}
	return he
}

// mutualExclusion: in each round many goroutines on several lockers race for
// one free key until one wins; exactly one may win, since the winner holds
// the key for the rest of the round.
func (s *suite) mutualExclusion(t *testing.T) {
	lockers := []lock.Locker{s.newLocker(t), s.newLocker(t), s.newLocker(t), s.newLocker(t)}
	for round := range s.cfg.rounds {
		key := keys(t, 1)[0]
		ctx := ctxT(t, 30*time.Second)
		var (
			winners atomic.Int32
			mu      sync.Mutex
			leases  []*lock.Lease
			errs    []error
			won     = make(chan struct{})
			once    sync.Once
			start   = make(chan struct{})
			wg      sync.WaitGroup
		)
		for g := range s.cfg.racers {
			l := lockers[g%len(lockers)]
			wg.Go(func() {
				<-start
				b := wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 1 << 30, Cap: 20 * time.Millisecond}
				for {
					select {
					case <-won:
						return
					case <-ctx.Done():
						return
					default:
					}
					lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: fmt.Sprintf("racer-%d", g)})
					if err == nil {
						winners.Add(1)
						mu.Lock()
						leases = append(leases, lease)
						mu.Unlock()
						once.Do(func() { close(won) })
						return
					}
					if !errors.Is(err, lock.ErrNotAcquired) && !errors.Is(err, lock.ErrQuorum) && !errors.Is(err, lock.ErrBackendUnavailable) {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					select {
					case <-won:
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
		if n := winners.Load(); n != 1 {
			t.Fatalf("round %d: %d racers hold the key at once, want exactly 1 (leases %+v)", round, n, leases)
		}
		st, err := inspect1(ctx, lockers[0], key)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held || st.Holder != leases[0].Holder || st.Fence != leases[0].Fence {
			t.Fatalf("round %d: Inspect = %+v, want held by %q with fence %d", round, st, leases[0].Holder, leases[0].Fence)
		}
		mustRelease(t, lockers[1], leases[0])
	}
}

// acquireWaitsForRelease: a blocking Acquire returns only after the holder
// releases, with a larger fence.
func (s *suite) acquireWaitsForRelease(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	key := keys(t, 1)[0]
	la := mustAcquire(t, a, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "a"})
	type res struct {
		lease *lock.Lease
		err   error
	}
	done := make(chan res, 1)
	go func() {
		lease, err := b.Acquire(ctxT(t, 20*time.Second), lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "b"})
		done <- res{lease, err}
	}()
	// Let b try at least once: its failed try is visible as nothing, so wait
	// for a short while on the result channel; an early result is a violation.
	select {
	case r := <-done:
		t.Fatalf("Acquire returned while the key was held: %+v, %v", r.lease, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	mustRelease(t, a, la)
	r := <-done
	if r.err != nil {
		t.Fatalf("Acquire after release: %v", r.err)
	}
	if r.lease.Fence <= la.Fence {
		t.Fatalf("fence after release = %d, want > %d", r.lease.Fence, la.Fence)
	}
	mustRelease(t, b, r.lease)
}

func (s *suite) nonOwner(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	lease := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "owner"})
	forged := *lease
	forged.Owner = owner(t)
	if err := l.Release(ctx, &forged); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release by a non-owner: %v, want ErrNotHeld", err)
	}
	if _, err := l.Renew(ctx, &forged, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew by a non-owner: %v, want ErrLost", err)
	}
	st, err := inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Holder != "owner" || st.Fence != lease.Fence {
		t.Fatalf("after non-owner attempts Inspect = %+v, want still held by owner with fence %d", st, lease.Fence)
	}
	before := time.Now()
	renewed, err := l.Renew(ctx, lease, longTTL)
	if err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	if renewed.Fence != lease.Fence || renewed.Owner != lease.Owner {
		t.Fatalf("Renew changed the lease identity: %+v -> %+v", lease, renewed)
	}
	// The validity counts from the start of the renewal, never later: a
	// loaded machine may start the renewal long after the acquisition.
	if !renewed.Expires.After(before) || renewed.Expires.After(before.Add(longTTL)) {
		t.Fatalf("renewed lease Expires %v not within (renew start %v, renew start + TTL]", renewed.Expires, before)
	}
	mustRelease(t, l, renewed)
	if err := l.Release(ctx, renewed); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
}

func (s *suite) expiredLease(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	ttl := 500 * time.Millisecond
	old := mustAcquire(t, a, lock.Request{Keys: []string{key}, TTL: ttl, Holder: "old"})
	if !old.Expires.After(old.Acquired) || old.Expires.Sub(old.Acquired) > ttl {
		t.Fatalf("lease validity %v outside (0, %v]", old.Expires.Sub(old.Acquired), ttl)
	}
	eventually(t, 5*time.Second, "lease expires in the backend", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, b, key)
		return err == nil && !st.Held, err
	})
	if _, err := a.Renew(ctx, old, ttl); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of an expired lease: %v, want ErrLost", err)
	}
	if err := a.Release(ctx, old); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an expired lease: %v, want ErrNotHeld", err)
	}
	// Someone else takes the key; the old owner still cannot renew, and its
	// attempt must not disturb the new holder.
	next := mustAcquire(t, b, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "new"})
	if next.Fence <= old.Fence {
		t.Fatalf("fence after expiry = %d, want > %d", next.Fence, old.Fence)
	}
	if _, err := a.Renew(ctx, old, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of a lease taken over: %v, want ErrLost", err)
	}
	st, err := inspect1(ctx, a, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Holder != "new" || st.Fence != next.Fence {
		t.Fatalf("Inspect = %+v, want held by new with fence %d", st, next.Fence)
	}
	mustRelease(t, b, next)
}

func (s *suite) releaseLetsNextIn(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	la := mustAcquire(t, a, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "a"})
	_, err := b.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "b"})
	he := wantHeldError(t, err, key)
	if he.Holder != "a" || he.Fence != la.Fence {
		t.Fatalf("HeldError = %s, want holder a with fence %d", heldFields(he), la.Fence)
	}
	mustRelease(t, a, la)
	lb := mustAcquire(t, b, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "b"})
	if lb.Fence <= la.Fence {
		t.Fatalf("fence = %d, want > %d", lb.Fence, la.Fence)
	}
	mustRelease(t, b, lb)
}

func (s *suite) fencesIncrease(t *testing.T) {
	lockers := []lock.Locker{s.newLocker(t), s.newLocker(t)}
	ks := keys(t, 3)
	// {ks[0], ks[1]} right after {ks[1]}: its first key has the older token,
	// so a store that derived the token from the first key only would not
	// go past ks[1]'s.
	sets := [][]string{{ks[0]}, {ks[1]}, {ks[0], ks[1]}, {ks[1], ks[2]}, {ks[2], ks[0]}, {ks[0], ks[1], ks[2]}}
	last := map[string]int64{}
	for i := range 30 {
		l := lockers[i%2]
		set := sets[i%len(sets)]
		lease := mustAcquire(t, l, lock.Request{Keys: set, TTL: longTTL, Holder: fmt.Sprintf("h%d", i)})
		if lease.Fence <= 0 || lease.Fence >= lock.MaxFence {
			t.Fatalf("fence %d outside (0, MaxFence)", lease.Fence)
		}
		for _, k := range set {
			if lease.Fence <= last[k] {
				t.Fatalf("acquisition %d: fence %d for key %s, want > %d (the previous one)", i, lease.Fence, k, last[k])
			}
			last[k] = lease.Fence
		}
		mustRelease(t, lockers[(i+1)%2], lease)
	}
	st, err := lockers[0].Inspect(ctxT(t, 10*time.Second), ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Held || s.Fence != last[s.Key] {
			t.Fatalf("Inspect of free key = %+v, want not held with the last fence %d", s, last[s.Key])
		}
	}
}

// sameOwnerAgain: an owner that acquires keys it already holds (a restarted
// operator acquiring again) gets a new token, larger than the one it held,
// and Inspect reports the new one.
func (s *suite) sameOwnerAgain(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	ks := keys(t, 2)
	req := lock.Request{Keys: ks, TTL: longTTL, Owner: owner(t), Holder: "restarted"}
	first := mustAcquire(t, a, req)
	second := mustAcquire(t, b, req)
	if second.Fence <= first.Fence || second.Fence >= lock.MaxFence {
		t.Fatalf("the same owner acquiring again got fence %d, want > %d (its first one) and < MaxFence", second.Fence, first.Fence)
	}
	st, err := a.Inspect(ctxT(t, 10*time.Second), ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Held || s.Fence != second.Fence {
			t.Fatalf("Inspect after acquiring again = %+v, want held with fence %d", s, second.Fence)
		}
	}
	mustRelease(t, a, second)
}

// replacedLease: renewal and release are scoped to the acquisition, not the
// owner. An owner acquires, acquires again (a restarted operator: same
// owner token, new fencing token), and then the first lease, still in a
// client's hands (the old process, resumed), is renewed and released: both
// must report it gone (ErrLost, ErrNotHeld) and leave the second lease held,
// or another owner could take the keys while the second lease is valid.
func (s *suite) replacedLease(t *testing.T, limit int) {
	a, b, other := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 30*time.Second)
	ks := keys(t, 2)
	req := lock.Request{Keys: ks, TTL: longTTL, Owner: owner(t), Holder: "restarted", Limit: limit}
	first := mustAcquire(t, a, req)
	second := mustAcquire(t, b, req)
	if second.Fence <= first.Fence {
		t.Fatalf("the same owner acquiring again got fence %d, want > %d", second.Fence, first.Fence)
	}
	if _, err := a.Renew(ctx, first, longTTL); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the replaced lease (fence %d; the owner holds fence %d): %v, want ErrLost", first.Fence, second.Fence, err)
	}
	if _, errs := a.RenewAll(ctx, []*lock.Lease{first}, longTTL); !errors.Is(errs[0], lock.ErrLost) {
		t.Fatalf("RenewAll of the replaced lease: %v, want ErrLost", errs[0])
	}
	if err := a.Release(ctx, first); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the replaced lease (fence %d; the owner holds fence %d): %v, want ErrNotHeld", first.Fence, second.Fence, err)
	}
	st, err := other.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range st {
		if !k.Held || k.HolderCount != 1 || k.Fence != second.Fence {
			t.Fatalf("after the replaced lease was renewed and released, Inspect(%s) = %+v: want the second lease (fence %d) to hold it alone", k.Key, k, second.Fence)
		}
	}
	if limit == 1 {
		_, err := other.TryAcquire(ctx, lock.Request{Keys: ks[:1], TTL: longTTL, Holder: "other"})
		if he := wantHeldError(t, err, ks[0]); he.Fence != second.Fence {
			t.Fatalf("another owner was refused by fence %d, want the second lease's %d", he.Fence, second.Fence)
		}
	}
	renewed, err := b.Renew(ctx, second, longTTL)
	if err != nil {
		t.Fatalf("Renew of the second lease after the replaced one was renewed and released: %v", err)
	}
	mustRelease(t, b, renewed)
}

func (s *suite) multiKey(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	ks := keys(t, 3)
	la := mustAcquire(t, a, lock.Request{Keys: []string{ks[1]}, TTL: longTTL, Holder: "a"})
	_, err := b.TryAcquire(ctx, lock.Request{Keys: ks, TTL: longTTL, Holder: "b"})
	_ = wantHeldError(t, err, ks[1])
	st, err := b.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s.Held != (i == 1) {
			t.Fatalf("after a failed multi-key acquire Inspect(%s) = %+v: the free keys must stay free", s.Key, s)
		}
	}
	mustRelease(t, a, la)
	lb := mustAcquire(t, b, lock.Request{Keys: ks, TTL: longTTL, Holder: "b"})
	for _, k := range ks {
		_, err := a.TryAcquire(ctx, lock.Request{Keys: []string{k}, TTL: longTTL, Holder: "a"})
		if he := wantHeldError(t, err, k); he.Holder != "b" || he.Fence != lb.Fence {
			t.Fatalf("HeldError = %s, want holder b with fence %d", heldFields(he), lb.Fence)
		}
	}
	mustRelease(t, b, lb)
	st, err = a.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Held {
			t.Fatalf("after release Inspect(%s) = %+v, want free", s.Key, s)
		}
	}
}

// fifoDeadWaiter: waiters are served in the order they joined; a waiter that
// stops heartbeating is skipped once its waiter TTL passes; a request that is
// not queued does not jump the queue.
func (s *suite) fifoDeadWaiter(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 30*time.Second)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	w1 := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "w1", Owner: owner(t), Queue: true}
	dead := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "dead", Owner: owner(t), Queue: true}
	w2 := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "w2", Owner: owner(t), Queue: true}
	for i, r := range []lock.Request{w1, dead, w2} {
		_, err := l.TryAcquire(ctx, r)
		he := wantHeldError(t, err, key)
		if he.Position != i || he.Holder != "holder" || he.Waiters != i+1 {
			t.Fatalf("%s joins: HeldError = %s, want position %d, holder %q, %d waiters", r.Holder, heldFields(he), i, "holder", i+1)
		}
	}
	st, err := inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, w := range st.Waiters {
		names = append(names, w.Holder)
		if w.Since.IsZero() || (i > 0 && w.Since.Before(st.Waiters[i-1].Since)) {
			t.Fatalf("waiters %+v: want non-zero, non-decreasing Since", st.Waiters)
		}
	}
	if got := strings.Join(names, ","); got != "w1,dead,w2" {
		t.Fatalf("Inspect waiters = %s, want w1,dead,w2", got)
	}
	mustRelease(t, l, h)

	// The key is free but waiters are queued: neither an unqueued request nor
	// a waiter behind the head may take it.
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "jumper"})
	if he := wantHeldError(t, err, key); he.Position != -1 || he.Waiters != 3 || he.Holder != "" {
		t.Fatalf("unqueued request on a free key with waiters: HeldError = %s, want position -1, 3 waiters, no holder", heldFields(he))
	}
	_, err = l.TryAcquire(ctx, w2)
	if he := wantHeldError(t, err, key); he.Position != 2 {
		t.Fatalf("w2 before its turn: HeldError = %s, want position 2", heldFields(he))
	}
	l1 := mustAcquire(t, l, w1)
	mustRelease(t, l, l1)

	// "dead" is now at the head but never calls again: w2 keeps its place by
	// calling, and gets the key once dead's waiter TTL has passed.
	var l2 *lock.Lease
	eventually(t, 5*s.cfg.waiterTTL+5*time.Second, "w2 acquires after the dead waiter is pruned", func(ctx context.Context) (bool, error) {
		lease, err := l.TryAcquire(ctx, w2)
		if err != nil {
			if errors.Is(err, lock.ErrNotAcquired) {
				return false, nil
			}
			return false, err
		}
		l2 = lease
		return true, nil
	})
	if l2.Fence <= l1.Fence {
		t.Fatalf("fence %d, want > %d", l2.Fence, l1.Fence)
	}
	st, err = inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiters) != 0 {
		t.Fatalf("waiters after the last one acquired: %+v, want none", st.Waiters)
	}
	mustRelease(t, l, l2)
}

// fifoAcquireOrder: blocking Acquire calls with Queue get the key in the
// order they queued.
func (s *suite) fifoAcquireOrder(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	const n = 4
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
		errs  = make(chan error, n)
	)
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		wl := s.newLocker(t)
		wg.Go(func() {
			lease, err := wl.Acquire(ctxT(t, 30*time.Second), lock.Request{Keys: []string{key}, TTL: longTTL, Holder: name, Queue: true})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			if err := wl.Release(context.Background(), lease); err != nil {
				errs <- fmt.Errorf("%s release: %w", name, err)
			}
		})
		// Start the next waiter only once this one is queued.
		eventually(t, 10*time.Second, name+" queued", func(ctx context.Context) (bool, error) {
			st, err := inspect1(ctx, l, key)
			return err == nil && len(st.Waiters) == i+1 && st.Waiters[i].Holder == name, err
		})
	}
	mustRelease(t, l, h)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := strings.Join(order, ","); got != "w0,w1,w2,w3" {
		t.Fatalf("acquisition order %s, want w0,w1,w2,w3", got)
	}
}

// acquireLeavesQueue: a queued Acquire whose context ends leaves the queue,
// and its error says both why it stopped and what the last attempt saw.
func (s *suite) acquireLeavesQueue(t *testing.T) {
	l, w := s.newLocker(t), s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := w.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "impatient", Queue: true})
		done <- err
	}()
	eventually(t, 10*time.Second, "impatient queued", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, l, key)
		return err == nil && len(st.Waiters) == 1, err
	})
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Acquire after cancel: %v, want an error matching context.Canceled and ErrNotAcquired", err)
	}
	st, err := inspect1(ctxT(t, 10*time.Second), l, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiters) != 0 {
		t.Fatalf("waiters after the queued Acquire was cancelled: %+v, want none", st.Waiters)
	}
	mustRelease(t, l, h)
}

func (s *suite) dequeue(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	w := lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "w", Owner: owner(t), Queue: true}
	_, err := l.TryAcquire(ctx, w)
	_ = wantHeldError(t, err, key)
	if err := l.Dequeue(ctx, w.Keys, w.Owner); err != nil {
		t.Fatalf("Dequeue: %v", err)
	}
	if err := l.Dequeue(ctx, w.Keys, w.Owner); err != nil {
		t.Fatalf("second Dequeue: %v", err)
	}
	st, err := inspect1(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiters) != 0 {
		t.Fatalf("waiters after Dequeue: %+v", st.Waiters)
	}
	mustRelease(t, l, h)
	// With the queue empty again, an unqueued request takes the key at once.
	mustRelease(t, l, mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL}))
}

func (s *suite) watch(t *testing.T) {
	l, w := s.newLocker(t), s.newLocker(t)
	ks := keys(t, 2)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	one, err := w.Watch(wctx, ks[0])
	if err != nil {
		t.Fatalf("Watch(%s): %v", ks[0], err)
	}
	all, err := w.Watch(wctx)
	if err != nil {
		t.Fatalf("Watch(): %v", err)
	}
	// A release of another key must not reach the keyed watcher.
	mustRelease(t, l, mustAcquire(t, l, lock.Request{Keys: []string{ks[1]}, TTL: longTTL}))
	mustRelease(t, l, mustAcquire(t, l, lock.Request{Keys: []string{ks[0]}, TTL: longTTL}))
	timeout := time.After(10 * time.Second)
	select {
	case k := <-one:
		if k != ks[0] {
			t.Fatalf("Watch(%s) delivered %q", ks[0], k)
		}
	case <-timeout:
		t.Fatalf("Watch(%s) delivered nothing after a release", ks[0])
	}
	got := map[string]bool{}
	for !got[ks[0]] || !got[ks[1]] {
		select {
		case k := <-all:
			got[k] = true
		case <-timeout:
			t.Fatalf("Watch() delivered %v, want both %v", got, ks)
		}
	}
	cancel()
	for range one {
	}
	for range all {
	}
}

func (s *suite) inspect(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	ks := keys(t, 2)
	st, err := l.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Held || s.Holder != "" || s.Fence != 0 || len(s.Waiters) != 0 {
			t.Fatalf("Inspect of a never-used key = %+v, want the zero state", s)
		}
	}
	before := time.Now()
	lease := mustAcquire(t, l, lock.Request{Keys: ks, TTL: longTTL, Holder: "cluster/ns/Job/j/uid"})
	_, err = l.TryAcquire(ctx, lock.Request{Keys: ks[1:], TTL: longTTL, Holder: "waiting-job", Owner: owner(t), Queue: true})
	_ = wantHeldError(t, err, ks[1])
	st, err = l.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s.Key != ks[i] || !s.Held || s.Holder != "cluster/ns/Job/j/uid" || s.Fence != lease.Fence {
			t.Fatalf("Inspect = %+v, want %s held by the job with fence %d", s, ks[i], lease.Fence)
		}
		// Expires and Acquired come from the backend; allow for clock skew between it and the test.
		if s.Expires.Before(before) || s.Expires.After(time.Now().Add(longTTL+time.Second)) {
			t.Fatalf("Inspect(%s).Expires = %v, want about %v from now", s.Key, s.Expires, longTTL)
		}
		if s.Acquired.IsZero() || s.Acquired.After(s.Expires) {
			t.Fatalf("Inspect(%s).Acquired = %v, want set and before Expires %v", s.Key, s.Acquired, s.Expires)
		}
	}
	if len(st[0].Waiters) != 0 || len(st[1].Waiters) != 1 || st[1].Waiters[0].Holder != "waiting-job" || st[1].Waiters[0].Since.IsZero() {
		t.Fatalf("waiters = %+v / %+v, want none / waiting-job with a since time", st[0].Waiters, st[1].Waiters)
	}
	mustRelease(t, l, lease)
	st, err = l.Inspect(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Held || s.Fence != lease.Fence {
			t.Fatalf("Inspect after release = %+v, want free with the last fence %d", s, lease.Fence)
		}
	}
}

func (s *suite) renewAll(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	ks := keys(t, 4)
	var leases []*lock.Lease
	for _, k := range ks[:3] {
		leases = append(leases, mustAcquire(t, l, lock.Request{Keys: []string{k}, TTL: longTTL}))
	}
	forged := *leases[1]
	forged.Owner = owner(t)
	batch := []*lock.Lease{leases[0], &forged, leases[2], nil}
	got, errs := l.RenewAll(ctx, batch, longTTL)
	if len(got) != len(batch) || len(errs) != len(batch) {
		t.Fatalf("RenewAll returned %d leases and %d errors for %d inputs", len(got), len(errs), len(batch))
	}
	for i, want := range []error{nil, lock.ErrLost, nil, lock.ErrInvalidRequest} {
		if want == nil {
			if errs[i] != nil || got[i] == nil || got[i].Fence != batch[i].Fence {
				t.Fatalf("RenewAll[%d] = %+v, %v; want renewed", i, got[i], errs[i])
			}
			continue
		}
		if !errors.Is(errs[i], want) || got[i] != nil {
			t.Fatalf("RenewAll[%d] = %+v, %v; want error %v", i, got[i], errs[i], want)
		}
	}
	for _, le := range []*lock.Lease{got[0], leases[1], got[2]} {
		mustRelease(t, l, le)
	}
}

func (s *suite) invalid(t *testing.T) {
	l := s.newLocker(t)
	ctx := ctxT(t, 10*time.Second)
	k := keys(t, 1)[0]
	tooMany := make([]string, lock.MaxKeys+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("%s.%d", k, i)
	}
	valid := &lock.Lease{Keys: []string{k}, Owner: owner(t), TTL: longTTL}
	noOwner := *valid
	noOwner.Owner = ""
	noKeys := *valid
	noKeys.Keys = nil
	calls := map[string]func() error{
		"no keys":       func() error { _, err := l.TryAcquire(ctx, lock.Request{TTL: longTTL}); return err },
		"too many keys": func() error { _, err := l.TryAcquire(ctx, lock.Request{Keys: tooMany, TTL: longTTL}); return err },
		"duplicate keys": func() error {
			_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{k, k}, TTL: longTTL})
			return err
		},
		"empty key": func() error { _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{""}, TTL: longTTL}); return err },
		"ttl below min": func() error {
			_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{k}, TTL: lock.MinTTL - 1})
			return err
		},
		"acquire ttl":      func() error { _, err := l.Acquire(ctx, lock.Request{Keys: []string{k}}); return err },
		"renew no owner":   func() error { _, err := l.Renew(ctx, &noOwner, longTTL); return err },
		"renew nil":        func() error { _, err := l.Renew(ctx, nil, longTTL); return err },
		"renew short ttl":  func() error { _, err := l.Renew(ctx, valid, time.Millisecond); return err },
		"release no owner": func() error { return l.Release(ctx, &noOwner) },
		"release no keys":  func() error { return l.Release(ctx, &noKeys) },
		"release nil":      func() error { return l.Release(ctx, nil) },
		"dequeue no owner": func() error { return l.Dequeue(ctx, []string{k}, "") },
		"dequeue no keys":  func() error { return l.Dequeue(ctx, nil, valid.Owner) },
		"inspect no keys":  func() error { _, err := l.Inspect(ctx, nil); return err },
		"inspect dup keys": func() error { _, err := l.Inspect(ctx, []string{k, k}); return err },
		"watch dup keys":   func() error { _, err := l.Watch(ctx, k, k); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, lock.ErrInvalidRequest) {
			t.Errorf("%s: error %v, want one matching ErrInvalidRequest", name, err)
		}
	}
	_, errs := l.RenewAll(ctx, []*lock.Lease{&noOwner}, longTTL)
	if !errors.Is(errs[0], lock.ErrInvalidRequest) {
		t.Errorf("RenewAll with an invalid lease: %v, want ErrInvalidRequest", errs[0])
	}
	// Nothing was taken by the rejected calls.
	st, err := inspect1(ctx, l, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held || len(st.Waiters) != 0 {
		t.Fatalf("after invalid requests Inspect = %+v, want untouched", st)
	}
}

// renewExtends: a lease renewed with a longer TTL still holds its key after
// its first TTL has run out, and nobody else gets it. (A store whose Renew
// only checked the owner would pass the other tests, whose holders renew
// right after acquiring or release before the first TTL ends.)
func (s *suite) renewExtends(t *testing.T) {
	a, b := s.newLocker(t), s.newLocker(t)
	ctx := ctxT(t, 30*time.Second)
	key := keys(t, 1)[0]
	const first = 2 * time.Second
	lease := mustAcquire(t, a, lock.Request{Keys: []string{key}, TTL: first, Holder: "renewed"})
	renewed, err := a.Renew(ctx, lease, longTTL)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if !renewed.Expires.After(lease.Expires) {
		t.Fatalf("Renew with TTL %v moved Expires from %v to %v, want later", longTTL, lease.Expires, renewed.Expires)
	}
	// Wait out the first TTL (the lease's own clock): a store that did not
	// extend the lease has freed the key by then.
	time.Sleep(time.Until(lease.Acquired.Add(first + 500*time.Millisecond)))
	st, err := inspect1(ctx, b, key)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Fence != lease.Fence {
		t.Fatalf("after the first TTL of the renewed lease, Inspect = %+v, want held with fence %d", st, lease.Fence)
	}
	if _, err := b.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the renewed lease's key: %v, want ErrNotAcquired", err)
	}
	mustRelease(t, a, renewed)
}

// unreadWatch: a Watch whose channel nobody reads never holds up a
// release: notifications beyond what it buffers are dropped (a waiter also
// polls), not waited for.
func (s *suite) unreadWatch(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := l.Watch(wctx, key); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		for range 100 {
			lease, err := l.TryAcquire(wctx, lock.Request{Keys: []string{key}, TTL: longTTL})
			if err == nil {
				err = l.Release(wctx, lease)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("acquire and release with an unread Watch: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("100 acquisitions and releases did not end within 30s while a Watch of the key went unread: releases wait for the reader")
	}
}

// releaseExpired: releasing a lease after its TTL ran out, with nothing
// else done to the key since, reports ErrNotHeld: the lease was gone, and
// the caller must not believe it held the key until the release.
// (ExpiredLeaseIsLost renews first, which many stores treat as the release.)
func (s *suite) releaseExpired(t *testing.T) {
	a := s.newLocker(t)
	ctx := ctxT(t, 20*time.Second)
	key := keys(t, 1)[0]
	old := mustAcquire(t, a, lock.Request{Keys: []string{key}, TTL: 500 * time.Millisecond, Holder: "old"})
	eventually(t, 5*time.Second, "lease expires in the backend", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, a, key)
		return err == nil && !st.Held, err
	})
	// Redlock shows the key free once a quorum of nodes let it go; the
	// others follow within the time the acquisition took to reach them.
	time.Sleep(time.Until(old.Acquired.Add(old.TTL + 250*time.Millisecond)))
	if err := a.Release(ctx, old); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an expired lease: %v, want ErrNotHeld", err)
	}
}
