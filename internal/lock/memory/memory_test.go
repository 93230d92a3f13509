package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeStore returns a Store and two of its Lockers on one fake clock.
func fakeStore(t *testing.T, opts ...Option) (*testingclock.FakeClock, *Store, *Locker, *Locker) {
	t.Helper()
	fc := testingclock.NewFakeClock(t0)
	s := newTestStore(t, WithStoreClock(fc))
	return fc, s, newTestLocker(t, s, opts...), newTestLocker(t, s, opts...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustTry(t *testing.T, l *Locker, req lock.Request) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctxT(t), req)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", req.Keys, err)
	}
	return lease
}

func inspect1(t *testing.T, l *Locker, key string) lock.KeyState {
	t.Helper()
	st, err := l.Inspect(ctxT(t), []string{key})
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return st[0]
}

func wantHeld(t *testing.T, err error) *lock.HeldError {
	t.Helper()
	var he *lock.HeldError
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.As(err, &he) {
		t.Fatalf("error %v: want a *lock.HeldError", err)
	}
	return he
}

// waitUntil polls cond (on the real clock) for up to 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: not within 10s", what)
	}
}

type result struct {
	lease *lock.Lease
	err   error
}

// acquireAsync starts l.Acquire(req) and returns where its result comes.
func acquireAsync(t *testing.T, l *Locker, req lock.Request) <-chan result {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	done := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, req)
		done <- result{lease, err}
	}()
	return done
}

func wantPending(t *testing.T, done <-chan result, why string) {
	t.Helper()
	select {
	case r := <-done:
		t.Fatalf("Acquire returned %+v, %v %s", r.lease, r.err, why)
	case <-time.After(20 * time.Millisecond):
	}
}

func wantResult(t *testing.T, done <-chan result) *lock.Lease {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		return r.lease
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return within 10s")
		return nil
	}
}

// TestLeaseExpiresAtItsTTL: on the store's clock a lease holds its key
// until its TTL has passed, to the nanosecond; at that instant another
// client takes the key with a larger token, and the first lease is lost.
func TestLeaseExpiresAtItsTTL(t *testing.T) {
	fc, _, a, b := fakeStore(t)
	const ttl = 2 * time.Second
	old := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "a"})
	if !old.Acquired.Equal(t0) || !old.Expires.Equal(t0.Add(ttl-drift(ttl))) {
		t.Fatalf("lease Acquired %v, Expires %v: want %v and the TTL less the drift allowance after it", old.Acquired, old.Expires, t0)
	}
	st := inspect1(t, b, "k")
	if !st.Held || !st.Acquired.Equal(t0) || !st.Expires.Equal(t0.Add(ttl)) {
		t.Fatalf("Inspect = %+v: want held, acquired at %v, expiring a TTL later on the store's clock", st, t0)
	}

	fc.Step(ttl - time.Nanosecond)
	req := lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "b"}
	_, w, err := b.attempt(ctxT(t), req)
	he := wantHeld(t, err)
	if he.Holder != "a" || he.Fence != old.Fence || he.Holders != 1 || he.Position != -1 || he.Waiters != 0 {
		t.Fatalf("a nanosecond before the TTL: HeldError %+v, want held by a with fence %d", he, old.Fence)
	}
	if w.Within != time.Nanosecond || w.C == nil {
		t.Fatalf("Wake %+v: want the holder's remaining TTL (1ns) and a release channel", w)
	}

	fc.Step(time.Nanosecond)
	if st := inspect1(t, b, "k"); st.Held || st.Fence != old.Fence || st.HolderCount != 0 {
		t.Fatalf("at the TTL: Inspect = %+v, want free with the last fence %d", st, old.Fence)
	}
	if _, err := a.Renew(ctxT(t), old, ttl); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the expired lease that nobody took: %v, want ErrLost", err)
	}
	next := mustTry(t, b, req)
	if next.Fence <= old.Fence {
		t.Fatalf("fence after expiry %d, want > %d", next.Fence, old.Fence)
	}
	if _, err := a.Renew(ctxT(t), old, ttl); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the lease taken over: %v, want ErrLost", err)
	}
	if err := a.Release(ctxT(t), old); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the lease taken over: %v, want ErrNotHeld", err)
	}
	if st := inspect1(t, a, "k"); !st.Held || st.Holder != "b" || st.Fence != next.Fence {
		t.Fatalf("Inspect = %+v, want held by b with fence %d", st, next.Fence)
	}
}

// TestAcquireWakesOnRelease: an Acquire blocked by a holder returns as soon
// as the holder releases, without the clock moving (its backoff timer on
// the fake clock never fires).
func TestAcquireWakesOnRelease(t *testing.T) {
	for _, queue := range []bool{false, true} {
		t.Run(fmt.Sprintf("queue=%v", queue), func(t *testing.T) {
			fc, _, a, b := fakeStore(t)
			held := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a"})
			done := acquireAsync(t, b, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "b", Queue: queue})
			waitUntil(t, "Acquire waits on the fake clock", fc.HasWaiters)
			wantPending(t, done, "while the key was held")
			if err := a.Release(ctxT(t), held); err != nil {
				t.Fatal(err)
			}
			lease := wantResult(t, done)
			if lease.Fence <= held.Fence || !fc.Now().Equal(t0) {
				t.Fatalf("Acquire got fence %d at %v, want > %d with the clock still at %v", lease.Fence, fc.Now(), held.Fence, t0)
			}
			if st := inspect1(t, a, "k"); st.Holder != "b" || st.Queued != 0 {
				t.Fatalf("Inspect = %+v, want held by b, nobody queued", st)
			}
		})
	}
}

// TestAcquireWaitsForTheTTL: a holder that vanishes without releasing
// blocks an Acquire until the clock passes its TTL, and no longer: with
// the default backoff the waiter polls; with a backoff far longer than the
// TTL the holder's remaining TTL (Wake.Within) times its next attempt.
func TestAcquireWaitsForTheTTL(t *testing.T) {
	const ttl = 5 * time.Second
	for name, backoff := range map[string]wait.Backoff{
		"default backoff":      lock.DefaultBackoff,
		"backoff past the TTL": {Duration: time.Hour, Factor: 1, Jitter: 1e-6, Cap: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			fc, _, a, b := fakeStore(t, WithBackoff(backoff))
			gone := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "vanished"})
			done := acquireAsync(t, b, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "next"})
			waitUntil(t, "Acquire waits on the fake clock", fc.HasWaiters)
			fc.Step(ttl - time.Millisecond)
			waitUntil(t, "Acquire waits again", fc.HasWaiters)
			wantPending(t, done, "before the holder's TTL ended")
			fc.Step(100 * time.Millisecond)
			lease := wantResult(t, done)
			if lease.Fence <= gone.Fence || lease.Acquired.Before(t0.Add(ttl)) {
				t.Fatalf("lease %+v: want a fence above %d, acquired after the TTL", lease, gone.Fence)
			}
		})
	}
}

// TestWaiterExpiresOnTheClock: a waiter keeps its place until its waiter
// TTL has passed on the store's clock, keeps it longer by calling again,
// and a waiter that stopped calling is pruned: the next one takes the key.
func TestWaiterExpiresOnTheClock(t *testing.T) {
	fc, _, a, b := fakeStore(t, WithWaiterTTL(time.Second))
	h := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "h"})
	dead := lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "dead", Owner: "dead-owner", Queue: true}
	live := lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "live", Owner: "live-owner", Queue: true}
	for i, r := range []lock.Request{dead, live} {
		_, err := b.TryAcquire(ctxT(t), r)
		if he := wantHeld(t, err); he.Position != i || he.Waiters != i+1 {
			t.Fatalf("%s joins: %+v, want position %d", r.Holder, he, i)
		}
	}
	fc.Step(600 * time.Millisecond)
	_, err := b.TryAcquire(ctxT(t), live) // keeps its place
	_ = wantHeld(t, err)
	fc.Step(400 * time.Millisecond) // dead's deadline: still queued
	if st := inspect1(t, a, "k"); st.Queued != 2 || st.Waiters[0].Holder != "dead" || !st.Waiters[0].Since.Equal(t0) {
		t.Fatalf("at the waiter TTL: Inspect = %+v, want dead (since %v) and live queued", st, t0)
	}
	fc.Step(time.Nanosecond)
	if st := inspect1(t, a, "k"); st.Queued != 1 || st.Waiters[0].Holder != "live" {
		t.Fatalf("past the waiter TTL: Inspect = %+v, want live alone", st)
	}
	if err := a.Release(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	if l := mustTry(t, b, live); l.Fence <= h.Fence {
		t.Fatalf("fence %d, want > %d", l.Fence, h.Fence)
	}
	// The pruned waiter calls again: it joins at the back, behind nobody.
	_, err = b.TryAcquire(ctxT(t), dead)
	if he := wantHeld(t, err); he.Holder != "live" || he.Position != 0 || he.Waiters != 1 {
		t.Fatalf("dead calls again: %+v, want position 0 of 1 behind the holder live", he)
	}
}

// TestOptionErrors: a wrong option is a *lock.ConfigError of the memory
// store naming it, and says what is valid.
func TestOptionErrors(t *testing.T) {
	s := newTestStore(t)
	cases := map[string]struct {
		opts  []Option
		field string
	}{
		"nil clock":         {[]Option{WithClock(nil)}, "WithClock"},
		"short waiter TTL":  {[]Option{WithWaiterTTL(lock.MinWaiterTTL - 1)}, "WithWaiterTTL"},
		"no backoff":        {[]Option{WithBackoff(wait.Backoff{})}, "WithBackoff"},
		"shrinking backoff": {[]Option{WithBackoff(wait.Backoff{Duration: time.Millisecond, Factor: 0.5})}, "WithBackoff"},
	}
	for name, tc := range cases {
		for how, build := range map[string]func() (*Locker, error){
			"New":       func() (*Locker, error) { return New(tc.opts...) },
			"NewLocker": func() (*Locker, error) { return s.NewLocker(tc.opts...) },
		} {
			l, err := build()
			var ce *lock.ConfigError
			if l != nil || !errors.As(err, &ce) || !errors.Is(err, lock.ErrInvalidConfig) || ce.Store != "memory" || ce.Field != tc.field || ce.Reason == "" {
				t.Errorf("%s: %s = %v, %v; want a *lock.ConfigError of the memory store naming %s", name, how, l, err, tc.field)
			}
		}
	}
	_, err := NewStore(WithStoreClock(nil))
	var ce *lock.ConfigError
	if !errors.As(err, &ce) || ce.Field != "WithStoreClock" {
		t.Errorf("NewStore(WithStoreClock(nil)) = %v, want a *lock.ConfigError naming WithStoreClock", err)
	}
	l, err := New(WithWaiterTTL(lock.MinWaiterTTL), WithBackoff(wait.Backoff{Duration: time.Millisecond}))
	if err != nil {
		t.Fatalf("New with the smallest valid options: %v", err)
	}
	_ = l.Close()
}

// TestLeaseCountsFromTheCallStart: a call that waits out a paused store
// returns a lease whose validity counts from the start of the call, while
// the store holds the key from when it ran the call.
func TestLeaseCountsFromTheCallStart(t *testing.T) {
	fc, s, a, _ := fakeStore(t)
	const ttl = 10 * time.Second
	s.Pause()
	done := make(chan result, 1)
	go func() {
		lease, err := a.TryAcquire(ctxT(t), lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "a"})
		done <- result{lease, err}
	}()
	waitUntil(t, "the call waits for the paused store", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stalled == 1
	})
	fc.Step(3 * time.Second)
	s.Resume()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.lease.Acquired.Equal(t0) || !r.lease.Expires.Equal(t0.Add(ttl-drift(ttl))) {
		t.Fatalf("lease Acquired %v Expires %v: want counted from the call's start %v", r.lease.Acquired, r.lease.Expires, t0)
	}
	if st := inspect1(t, a, "k"); !st.Acquired.Equal(t0.Add(3*time.Second)) || !st.Expires.Equal(t0.Add(3*time.Second+ttl)) {
		t.Fatalf("Inspect = %+v: want the store's grant 3s later, for a TTL", st)
	}
	renewStart := fc.Now()
	s.Pause()
	go func() {
		lease, err := a.Renew(ctxT(t), r.lease, ttl)
		done <- result{lease, err}
	}()
	waitUntil(t, "the renewal waits for the paused store", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stalled == 1
	})
	fc.Step(time.Second)
	s.Resume()
	r = <-done
	if r.err != nil || !r.lease.Expires.Equal(renewStart.Add(ttl-drift(ttl))) {
		t.Fatalf("Renew = %+v, %v: want Expires counted from the renewal's start %v", r.lease, r.err, renewStart)
	}
}

// TestPause: calls to a paused store wait; those whose context ends first
// fail with lock.ErrBackendUnavailable, having changed nothing; the others
// run once it resumes, and Close ends them.
func TestPause(t *testing.T) {
	s := newTestStore(t)
	a, b := newTestLocker(t, s), newTestLocker(t, s)
	s.Pause()
	s.Pause() // twice: one Resume ends it
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a"})
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire on a paused store: %v, want ErrBackendUnavailable and the deadline", err)
	}
	done := acquireAsync(t, b, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "b"})
	closed := make(chan error, 1)
	c := newTestLocker(t, s)
	go func() {
		_, err := c.Inspect(context.Background(), []string{"k"})
		closed <- err
	}()
	waitUntil(t, "two calls wait", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stalled == 2
	})
	_ = c.Close()
	if err := <-closed; !errors.Is(err, ErrClosed) || !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("a waiting call of a closed Locker: %v, want ErrClosed", err)
	}
	wantPending(t, done, "while the store was paused")
	s.Resume()
	s.Resume()
	lease := wantResult(t, done)
	if lease.Holder != "b" || lease.Fence != 1 {
		t.Fatalf("lease %+v: want b's with the first token (the timed-out call took nothing)", lease)
	}
}

// TestDropReplies: a store that loses its replies runs the calls: the
// acquisition whose reply was lost holds the key, the same owner's next
// acquisition replaces it with a new token, and the release notifications
// meanwhile are lost.
func TestDropReplies(t *testing.T) {
	s := newTestStore(t)
	a, b := newTestLocker(t, s), newTestLocker(t, s)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := b.Watch(wctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	prev := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a"})
	s.DropReplies()
	if err := a.Release(ctxT(t), prev); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Release with the reply lost: %v, want ErrBackendUnavailable", err)
	}
	req := lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a", Owner: "owner-a"}
	if _, err := a.TryAcquire(ctxT(t), req); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("TryAcquire with the reply lost: %v, want ErrBackendUnavailable", err)
	}
	if _, err := b.Watch(wctx); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Watch with the reply lost: %v, want ErrBackendUnavailable", err)
	}
	s.DeliverReplies()
	st := inspect1(t, b, "k")
	if !st.Held || st.Holder != "a" || st.Fence <= prev.Fence {
		t.Fatalf("Inspect = %+v: want the acquisition whose reply was lost to hold the key", st)
	}
	select {
	case k := <-watch:
		t.Fatalf("Watch delivered %q released while the replies were lost", k)
	default:
	}
	again := mustTry(t, a, req)
	if st2 := inspect1(t, b, "k"); again.Fence <= st.Fence || st2.HolderCount != 1 || st2.Fence != again.Fence {
		t.Fatalf("the owner acquiring again: fence %d, Inspect %+v: want its lease replaced with a larger token", again.Fence, st2)
	}
	if err := a.Release(ctxT(t), again); err != nil {
		t.Fatal(err)
	}
	if k := <-watch; k != "k" {
		t.Fatalf("Watch delivered %q", k)
	}
}

// TestWatchNeverBlocksRelease: a watcher that does not read loses
// notifications but never holds up a Release; its channel closes when its
// context ends, and every watch ends when its Locker is closed.
func TestWatchNeverBlocksRelease(t *testing.T) {
	s := newTestStore(t)
	// Closed by the test, not by a cleanup: a Release that blocked would
	// hold the store's mutex, and the cleanup would hang instead of the
	// test failing.
	l, err := s.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.NewLocker()
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := w.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := w.Watch(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		for range 10 * watchBuffer {
			lease, err := l.TryAcquire(context.Background(), lock.Request{Keys: []string{"k"}, TTL: time.Minute})
			if err == nil {
				err = l.Release(context.Background(), lease)
			}
			if err != nil {
				released <- err
				return
			}
		}
		released <- nil
	}()
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%d releases did not end within 10s with a watcher that does not read", 10*watchBuffer)
	}
	cancel()
	n := 0
	for range slow {
		n++
	}
	if n != watchBuffer {
		t.Fatalf("the slow watcher got %d notifications, want the %d buffered", n, watchBuffer)
	}
	_ = w.Close()
	n = 0
	for range other {
		n++
	}
	if n != watchBuffer {
		t.Fatalf("the keyed watcher got %d notifications before Close, want %d", n, watchBuffer)
	}
	if _, err := w.Watch(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
	_ = l.Close()
}

// TestClose: a closed Locker's calls fail, a blocked Acquire ends, and the
// other Lockers of the store are not affected.
func TestClose(t *testing.T) {
	s := newTestStore(t)
	a, b := newTestLocker(t, s), newTestLocker(t, s)
	held := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "a"})
	done := acquireAsync(t, b, lock.Request{Keys: []string{"k"}, TTL: time.Minute, Holder: "b", Queue: true})
	waitUntil(t, "b queued", func() bool { return inspect1(t, a, "k").Queued == 1 })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case r := <-done:
		// (lock.BlockingAcquire makes one more attempt once Closed fires:
		// the error wraps that attempt's, not the last refusal.)
		if !errors.Is(r.err, ErrClosed) || r.lease != nil {
			t.Fatalf("Acquire ended by Close: %+v, %v; want an error matching ErrClosed", r.lease, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a blocked Acquire")
	}
	if _, err := b.TryAcquire(ctxT(t), lock.Request{Keys: []string{"j"}, TTL: time.Minute}); !errors.Is(err, ErrClosed) || !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("TryAcquire after Close: %v, want ErrClosed and ErrBackendUnavailable", err)
	}
	if _, err := a.Renew(ctxT(t), held, time.Minute); err != nil {
		t.Fatalf("another Locker's Renew after Close: %v", err)
	}
}

// TestRenewOfALostLeaseReleasesTheRest: a renewal that finds one key of the
// lease gone releases the keys the acquisition still held, and leaves a
// later acquisition of the same owner alone.
func TestRenewOfALostLeaseReleasesTheRest(t *testing.T) {
	_, _, a, b := fakeStore(t)
	both := mustTry(t, a, lock.Request{Keys: []string{"x", "y"}, TTL: time.Minute, Owner: "o", Holder: "both"})
	later := mustTry(t, b, lock.Request{Keys: []string{"y"}, TTL: time.Minute, Owner: "o", Holder: "later"})
	if _, err := a.Renew(ctxT(t), both, time.Minute); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew: %v, want ErrLost", err)
	}
	st, err := a.Inspect(ctxT(t), []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Held || !st[1].Held || st[1].Fence != later.Fence {
		t.Fatalf("Inspect = %+v: want x released, y held by the later acquisition (fence %d)", st, later.Fence)
	}
	if _, err := b.Renew(ctxT(t), later, time.Minute); err != nil {
		t.Fatalf("Renew of the later acquisition: %v", err)
	}
}

// TestFenceBound: tokens stay below lock.MaxFence; an acquisition that
// would need more is refused and takes nothing.
func TestFenceBound(t *testing.T) {
	_, s, a, _ := fakeStore(t)
	s.entryOf("k").fence = lock.MaxFence - 2
	last := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Minute})
	if last.Fence != lock.MaxFence-1 {
		t.Fatalf("fence %d, want %d", last.Fence, lock.MaxFence-1)
	}
	if err := a.Release(ctxT(t), last); err != nil {
		t.Fatal(err)
	}
	_, err := a.TryAcquire(ctxT(t), lock.Request{Keys: []string{"k", "fresh"}, TTL: time.Minute})
	if err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire past the last token: %v, want a refusal", err)
	}
	st, err := a.Inspect(ctxT(t), []string{"k", "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Held || st[1].Held || st[0].Fence != lock.MaxFence-1 || st[1].Fence != 0 {
		t.Fatalf("Inspect = %+v: want both keys free, nothing issued", st)
	}
}

// TestFenceAboveEveryKey: a lease's token is larger than every token issued
// for any of its keys, not only for its first.
func TestFenceAboveEveryKey(t *testing.T) {
	_, _, a, _ := fakeStore(t)
	var last *lock.Lease
	for range 3 {
		last = mustTry(t, a, lock.Request{Keys: []string{"b"}, TTL: time.Minute})
		if err := a.Release(ctxT(t), last); err != nil {
			t.Fatal(err)
		}
	}
	for _, keys := range [][]string{{"a", "b"}, {"c", "d", "b"}} {
		lease := mustTry(t, a, lock.Request{Keys: keys, TTL: time.Minute})
		if lease.Fence <= last.Fence {
			t.Fatalf("lease on %q got fence %d, want > %d (issued for b)", keys, lease.Fence, last.Fence)
		}
		if err := a.Release(ctxT(t), lease); err != nil {
			t.Fatal(err)
		}
		last = lease
	}
}

// TestMutexAndSlotOfOneOwner: a mutex lease and a semaphore slot never hold
// one key together, even the same owner's: each refuses the other.
func TestMutexAndSlotOfOneOwner(t *testing.T) {
	_, _, a, _ := fakeStore(t)
	mutex := lock.Request{Keys: []string{"k"}, TTL: time.Minute, Owner: "o", Holder: "mutex"}
	slot := lock.Request{Keys: []string{"k"}, TTL: time.Minute, Owner: "o", Holder: "slot", Limit: 3}
	for _, c := range []struct{ hold, ask lock.Request }{{mutex, slot}, {slot, mutex}} {
		held := mustTry(t, a, c.hold)
		_, err := a.TryAcquire(ctxT(t), c.ask)
		if he := wantHeld(t, err); he.Holders != 1 || he.Holder != c.hold.Holder || he.Fence != held.Fence {
			t.Fatalf("%s asked while the owner's %s holds the key: %+v, want refused by it", c.ask.Holder, c.hold.Holder, he)
		}
		if st := inspect1(t, a, "k"); st.HolderCount != 1 || st.Holder != c.hold.Holder {
			t.Fatalf("Inspect = %+v, want the %s alone", st, c.hold.Holder)
		}
		if err := a.Release(ctxT(t), held); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReleaseOfAnExpiredLease: a lease past its TTL is not held, even when
// no call has cleared it from the store yet: its Release reports
// ErrNotHeld and announces nothing, for a mutex lease and a semaphore slot.
func TestReleaseOfAnExpiredLease(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			fc, _, a, b := fakeStore(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watch, err := b.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			lease := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: time.Second, Limit: limit})
			fc.Step(time.Second)
			if err := a.Release(ctxT(t), lease); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("Release of the expired lease: %v, want ErrNotHeld", err)
			}
			select {
			case k := <-watch:
				t.Fatalf("Watch delivered %q for a lease that had expired", k)
			default:
			}
		})
	}
}

// TestRenewExtendsOnTheStoresClock: a renewal late in a lease's life keeps
// the key held a TTL past the renewal on the store's clock (not past the
// grant), for a mutex lease and a semaphore slot.
func TestRenewExtendsOnTheStoresClock(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			fc, _, a, b := fakeStore(t)
			const ttl = time.Second
			lease := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "a", Limit: limit})
			if limit > 1 {
				// The other slot is taken: b can only take a's.
				_ = mustTry(t, b, lock.Request{Keys: []string{"k"}, TTL: time.Hour, Holder: "other", Limit: limit})
			}
			fc.Step(900 * time.Millisecond)
			renewed, err := a.Renew(ctxT(t), lease, ttl)
			if err != nil {
				t.Fatal(err)
			}
			if want := t0.Add(900*time.Millisecond + ttl - drift(ttl)); !renewed.Expires.Equal(want) {
				t.Fatalf("renewed Expires %v, want %v", renewed.Expires, want)
			}
			st := inspect1(t, b, "k")
			if want := t0.Add(900*time.Millisecond + ttl); !st.Holders[0].Expires.Equal(want) {
				t.Fatalf("Inspect = %+v: want a's lease to expire at %v on the store's clock", st, want)
			}
			fc.Step(ttl - time.Nanosecond) // past the first TTL, before the renewed one
			next := lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "next", Limit: limit}
			if _, err := b.TryAcquire(ctxT(t), next); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("TryAcquire before the renewed TTL ended: %v, want ErrNotAcquired", err)
			}
			fc.Step(time.Nanosecond)
			_ = mustTry(t, b, next)
		})
	}
}

// TestCallThatOutlivesTheTTL: an acquisition or a renewal that the paused
// store ran only after the lease's validity was over fails as if the store
// had not answered; the grant is released, so nobody waits for it.
func TestCallThatOutlivesTheTTL(t *testing.T) {
	fc, s, a, b := fakeStore(t)
	const ttl = time.Second
	stalled := func(n int) func() bool {
		return func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.stalled == n
		}
	}
	s.Pause()
	done := make(chan result, 1)
	go func() {
		lease, err := a.TryAcquire(ctxT(t), lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "late"})
		done <- result{lease, err}
	}()
	waitUntil(t, "the acquisition waits for the paused store", stalled(1))
	fc.Step(ttl - drift(ttl))
	s.Resume()
	if r := <-done; !errors.Is(r.err, lock.ErrBackendUnavailable) || r.lease != nil {
		t.Fatalf("an acquisition that took its validity: %+v, %v; want ErrBackendUnavailable", r.lease, r.err)
	}
	if st := inspect1(t, b, "k"); st.Held || st.Fence != 1 {
		t.Fatalf("Inspect = %+v: want the grant released (its token 1 spent)", st)
	}

	lease := mustTry(t, a, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "renewing"})
	s.Pause()
	go func() {
		renewed, err := a.Renew(ctxT(t), lease, ttl)
		done <- result{renewed, err}
	}()
	waitUntil(t, "the renewal waits for the paused store", stalled(1))
	fc.Step(ttl - drift(ttl))
	s.Resume()
	if r := <-done; !errors.Is(r.err, lock.ErrBackendUnavailable) || errors.Is(r.err, lock.ErrLost) {
		t.Fatalf("a renewal that took its validity: %+v, %v; want ErrBackendUnavailable", r.lease, r.err)
	}
}

// TestPingAnswersLikeAHealthCheck: Ping answers while the store does,
// fails while it drops its replies and after Close, and waits out a pause
// until its context ends.
func TestPingAnswersLikeAHealthCheck(t *testing.T) {
	l, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping of a healthy store: %v", err)
	}
	l.Store().DropReplies()
	if err := l.Ping(ctx); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Ping while replies are lost: %v, want lock.ErrBackendUnavailable", err)
	}
	l.Store().DeliverReplies()
	l.Store().Pause()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := l.Ping(short); err == nil {
		t.Fatal("Ping of a paused store answered")
	}
	l.Store().Resume()
	_ = l.Close()
	if err := l.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v, want ErrClosed", err)
	}
}
