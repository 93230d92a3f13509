package watchdog_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// These tests drive the watchdog's scheduling with a fake clock and a fake
// backend: which leases go to the backend, when, in how many calls, and what
// becomes of a lease after the backend answered. What a real Redis does with
// a renewal is tested in package lock/redis.

const ttl = 30 * time.Second

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// renewCall is one RenewAll call as the backend saw it: the first key of each
// lease (sorted) and the TTL asked for.
type renewCall struct {
	Keys []string
	TTL  time.Duration
}

// fakeLocker is a lock.Locker whose RenewAll records its calls and answers
// from a script. Only RenewAll is used by the watchdog; the other methods
// (from the nil embedded interface) panic if called.
type fakeLocker struct {
	lock.Locker
	clock *clocktesting.FakeClock

	mu    sync.Mutex
	calls []renewCall
	// answer, when set, returns the result for one lease; the default renews
	// it for ttl from now.
	answer func(l *lock.Lease, ttl time.Duration) (*lock.Lease, error)
	// inFlight, when set, runs while the call is in flight (before answering).
	inFlight func()
}

func newFakeLocker(c *clocktesting.FakeClock) *fakeLocker { return &fakeLocker{clock: c} }

func (f *fakeLocker) RenewAll(_ context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	f.mu.Lock()
	call := renewCall{TTL: ttl}
	for _, l := range leases {
		call.Keys = append(call.Keys, l.Keys[0])
	}
	slices.Sort(call.Keys)
	f.calls = append(f.calls, call)
	answer, inFlight := f.answer, f.inFlight
	f.mu.Unlock()

	if inFlight != nil {
		inFlight()
	}
	renewed := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	for i, l := range leases {
		if answer != nil {
			renewed[i], errs[i] = answer(l, ttl)
			continue
		}
		r := *l
		r.TTL = ttl
		r.Expires = f.clock.Now().Add(ttl)
		renewed[i] = &r
	}
	return renewed, errs
}

// Calls returns the RenewAll calls so far and forgets them.
func (f *fakeLocker) Calls() []renewCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// lostRecorder collects the leases the watchdog reports lost.
type lostRecorder struct {
	mu   sync.Mutex
	lost []watchdog.Lost
}

func (r *lostRecorder) record(l watchdog.Lost) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost = append(r.lost, l)
}

func (r *lostRecorder) Refs() []holder.Ref {
	r.mu.Lock()
	defer r.mu.Unlock()
	var refs []holder.Ref
	for _, l := range r.lost {
		refs = append(refs, l.Ref)
	}
	return refs
}

func newWatchdog(t *testing.T) (*watchdog.Watchdog, *clocktesting.FakeClock, *lostRecorder) {
	t.Helper()
	c := clocktesting.NewFakeClock(t0)
	lost := &lostRecorder{}
	return watchdog.New(lost.record, watchdog.WithClock(c)), c, lost
}

func job(name string) holder.Ref { return holder.Ref{Kind: "Job", Namespace: "default", Name: name} }

// leaseOn returns a lease on key that was last renewed validFor before it
// expires, as seen at t0.
func leaseOn(key string, validFor time.Duration) *lock.Lease {
	return &lock.Lease{Keys: []string{key}, Owner: "owner-" + key, Fence: 7, TTL: ttl, Acquired: t0, Expires: t0.Add(validFor)}
}

func TestNothingIsRenewedBeforeAThirdOfTheTTL(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		elapsed time.Duration
		want    []renewCall
	}{
		"just acquired":             {elapsed: 0},
		"a moment before one third": {elapsed: ttl/3 - time.Millisecond},
		"at one third":              {elapsed: ttl / 3, want: []renewCall{{Keys: []string{"a"}, TTL: ttl}}},
		"past one third":            {elapsed: ttl / 2, want: []renewCall{{Keys: []string{"a"}, TTL: ttl}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, clk, _ := newWatchdog(t)
			backend := newFakeLocker(clk)
			w.Hold(job("a"), backend, leaseOn("a", ttl))

			clk.Step(tc.elapsed)
			w.RenewDue(t.Context())

			if diff := cmp.Diff(tc.want, backend.Calls()); diff != "" {
				t.Errorf("RenewAll calls (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestDueLeasesOfOneBackendGoInOneCall: when one lease of a backend is due,
// the leases of that backend due within a sixth of the TTL go along in the
// same call; leases further from due wait for their turn.
func TestDueLeasesOfOneBackendGoInOneCall(t *testing.T) {
	t.Parallel()
	w, clk, _ := newWatchdog(t)
	backend := newFakeLocker(clk)
	// At t0+10s "due" is exactly due (renewed 10s ago); the others were
	// renewed later, so they are due 4s, 5s (= TTL/6), 5s+1ms and 10s later.
	w.Hold(job("due"), backend, leaseOn("due", ttl))
	w.Hold(job("in-4s"), backend, leaseOn("in-4s", ttl+4*time.Second))
	w.Hold(job("in-5s"), backend, leaseOn("in-5s", ttl+ttl/6))
	w.Hold(job("in-5.001s"), backend, leaseOn("in-5.001s", ttl+ttl/6+time.Millisecond))
	w.Hold(job("in-10s"), backend, leaseOn("in-10s", ttl+10*time.Second))

	clk.Step(ttl / 3)
	w.RenewDue(t.Context())

	want := []renewCall{{Keys: []string{"due", "in-4s", "in-5s"}, TTL: ttl}}
	if diff := cmp.Diff(want, backend.Calls()); diff != "" {
		t.Errorf("RenewAll calls (-want,+got):\n%s", diff)
	}
}

func TestNothingIsSentWhileNoLeaseIsDue(t *testing.T) {
	t.Parallel()
	w, clk, _ := newWatchdog(t)
	backend := newFakeLocker(clk)
	// Both would be "nearly due" if another lease of the backend were due;
	// alone they are not sent.
	w.Hold(job("in-1s"), backend, leaseOn("in-1s", ttl+time.Second))
	w.Hold(job("in-2s"), backend, leaseOn("in-2s", ttl+2*time.Second))

	clk.Step(ttl / 3)
	w.RenewDue(t.Context())

	if got := backend.Calls(); len(got) != 0 {
		t.Errorf("RenewAll calls = %+v, want none while no lease is due", got)
	}
}

func TestEachBackendGetsItsOwnCall(t *testing.T) {
	t.Parallel()
	w, clk, _ := newWatchdog(t)
	east, west := newFakeLocker(clk), newFakeLocker(clk)
	w.Hold(job("e1"), east, leaseOn("e1", ttl))
	w.Hold(job("e2"), east, leaseOn("e2", ttl))
	w.Hold(job("w1"), west, leaseOn("w1", ttl))

	clk.Step(ttl / 3)
	w.RenewDue(t.Context())

	if diff := cmp.Diff([]renewCall{{Keys: []string{"e1", "e2"}, TTL: ttl}}, east.Calls()); diff != "" {
		t.Errorf("RenewAll calls on east (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]renewCall{{Keys: []string{"w1"}, TTL: ttl}}, west.Calls()); diff != "" {
		t.Errorf("RenewAll calls on west (-want,+got):\n%s", diff)
	}
}

func TestARenewalMovesTheNextOne(t *testing.T) {
	t.Parallel()
	w, clk, _ := newWatchdog(t)
	backend := newFakeLocker(clk)
	w.Hold(job("a"), backend, leaseOn("a", ttl))

	clk.Step(ttl / 3) // t0+10s: due; renewed until t0+40s, so next due at t0+20s
	w.RenewDue(t.Context())
	if got := len(backend.Calls()); got != 1 {
		t.Fatalf("%d RenewAll calls at one third of the TTL, want 1", got)
	}
	lease, _, ok := w.Holding(job("a"))
	if !ok || !lease.Expires.Equal(t0.Add(ttl/3+ttl)) {
		t.Fatalf("Holding = %+v, %v; want the renewed lease, expiring at %v", lease, ok, t0.Add(ttl/3+ttl))
	}

	clk.Step(ttl/3 - time.Millisecond)
	w.RenewDue(t.Context())
	if got := backend.Calls(); len(got) != 0 {
		t.Fatalf("renewed again %v after the last renewal: %+v; want to wait a third of the TTL", ttl/3-time.Millisecond, got)
	}

	clk.Step(time.Millisecond)
	w.RenewDue(t.Context())
	if got := len(backend.Calls()); got != 1 {
		t.Fatalf("%d RenewAll calls a third of the TTL after the last renewal, want 1", got)
	}
}

func TestARefusedRenewalIsReportedLost(t *testing.T) {
	t.Parallel()
	w, clk, lost := newWatchdog(t)
	backend := newFakeLocker(clk)
	refused := fmt.Errorf("renew: key taken over: %w", lock.ErrLost)
	backend.answer = func(l *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
		if l.Keys[0] == "gone" {
			return nil, refused
		}
		r := *l
		r.Expires = clk.Now().Add(ttl)
		return &r, nil
	}
	gone := leaseOn("gone", ttl)
	w.Hold(job("gone"), backend, gone)
	w.Hold(job("kept"), backend, leaseOn("kept", ttl))

	clk.Step(ttl / 3)
	w.RenewDue(t.Context())

	if diff := cmp.Diff([]holder.Ref{job("gone")}, lost.Refs()); diff != "" {
		t.Fatalf("leases reported lost (-want,+got):\n%s", diff)
	}
	l := lost.lost[0]
	if l.Lease != gone || !errors.Is(l.Err, lock.ErrLost) || !errors.Is(l.Err, refused) {
		t.Errorf("Lost = {Lease: %p, Err: %v}; want the held lease %p and an error matching lock.ErrLost with the backend's cause", l.Lease, l.Err, gone)
	}
	if _, _, ok := w.Holding(job("gone")); ok {
		t.Error("the lost lease is still held")
	}
	if _, _, ok := w.Holding(job("kept")); !ok {
		t.Error("the lease renewed in the same call is no longer held")
	}

	// The lost lease is never renewed again.
	clk.Step(ttl / 3)
	w.RenewDue(t.Context())
	if diff := cmp.Diff([]renewCall{{Keys: []string{"gone", "kept"}, TTL: ttl}, {Keys: []string{"kept"}, TTL: ttl}}, backend.Calls()); diff != "" {
		t.Errorf("RenewAll calls (-want,+got):\n%s", diff)
	}
}

// TestABackendErrorIsRetriedUntilTheLeaseExpires: a backend that does not
// answer loses no lease while the lease is still valid; once the validity
// ran out (someone else may hold the keys now) the lease is reported lost,
// and a lease found expired is not sent to the backend at all.
func TestABackendErrorIsRetriedUntilTheLeaseExpires(t *testing.T) {
	t.Parallel()
	timeout := errors.New("i/o timeout")
	cases := map[string]struct {
		// sentAt is when the renewal is sent, after t0; stall is how long the
		// backend takes to answer with an error.
		sentAt, stall time.Duration
		// noLease makes the backend return neither a lease nor an error.
		noLease  bool
		wantLost bool
		// notSent: the lease has expired when looked at; no renewal is sent.
		notSent bool
	}{
		"at a third of the TTL":                {sentAt: ttl / 3},
		"a moment before expiry":               {sentAt: ttl - time.Millisecond},
		"at expiry":                            {sentAt: ttl, wantLost: true, notSent: true},
		"after expiry":                         {sentAt: ttl + time.Second, wantLost: true, notSent: true},
		"sent before expiry, answered after":   {sentAt: ttl / 3, stall: ttl, wantLost: true},
		"no lease and no error, before expiry": {sentAt: ttl / 3, noLease: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, clk, lost := newWatchdog(t)
			backend := newFakeLocker(clk)
			backend.answer = func(*lock.Lease, time.Duration) (*lock.Lease, error) {
				if tc.noLease {
					return nil, nil
				}
				return nil, timeout
			}
			backend.inFlight = func() { clk.Step(tc.stall) }
			w.Hold(job("a"), backend, leaseOn("a", ttl))

			clk.Step(tc.sentAt)
			w.RenewDue(t.Context())

			_, _, holding := w.Holding(job("a"))
			if tc.wantLost {
				if diff := cmp.Diff([]holder.Ref{job("a")}, lost.Refs()); diff != "" {
					t.Fatalf("leases reported lost (-want,+got):\n%s", diff)
				}
				if err := lost.lost[0].Err; !errors.Is(err, lock.ErrLost) {
					t.Errorf("Lost.Err = %v, want it to match lock.ErrLost", err)
				}
				calls := backend.Calls()
				switch {
				case tc.notSent && len(calls) != 0:
					t.Errorf("RenewAll calls = %+v for a lease that had expired, want none", calls)
				case !tc.notSent && !tc.noLease && !errors.Is(lost.lost[0].Err, timeout):
					t.Errorf("Lost.Err = %v, want it to carry the backend's error", lost.lost[0].Err)
				}
				if holding {
					t.Error("the expired lease is still held")
				}
				return
			}
			if got := lost.Refs(); len(got) != 0 {
				t.Fatalf("reported lost %v while the lease was still valid", got)
			}
			if !holding {
				t.Fatal("the lease is no longer held after a backend error before its expiry")
			}
			// The next look (the next tick) retries, and a renewal that works
			// keeps the lease.
			backend.answer = nil
			w.RenewDue(t.Context())
			if got := len(backend.Calls()); got != 2 {
				t.Fatalf("%d RenewAll calls, want 2: the failed one and its retry on the next tick", got)
			}
			if l, _, ok := w.Holding(job("a")); !ok || !l.Expires.After(t0.Add(ttl)) {
				t.Errorf("after a successful retry Holding = %+v, %v; want a lease valid past the old expiry", l, ok)
			}
		})
	}
}

// TestReplacingALeaseDuringARenewal: a lease that is dropped or replaced while
// its renewal is in flight stays dropped or replaced, whatever the backend
// answers for the old one.
func TestReplacingALeaseDuringARenewal(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		// during runs while the renewal is in flight; it returns the lease
		// expected to be held afterwards (nil: none).
		during func(w *watchdog.Watchdog, backend lock.Locker) *lock.Lease
		// refuse makes the backend answer lock.ErrLost for the old lease.
		refuse bool
	}{
		"dropped, renewal succeeds": {
			during: func(w *watchdog.Watchdog, _ lock.Locker) *lock.Lease { w.Drop(job("a")); return nil },
		},
		"dropped, renewal refused": {
			during: func(w *watchdog.Watchdog, _ lock.Locker) *lock.Lease { w.Drop(job("a")); return nil },
			refuse: true,
		},
		"replaced, renewal succeeds": {
			during: func(w *watchdog.Watchdog, backend lock.Locker) *lock.Lease {
				l := leaseOn("a2", 2*ttl)
				w.Hold(job("a"), backend, l)
				return l
			},
		},
		"replaced, renewal refused": {
			during: func(w *watchdog.Watchdog, backend lock.Locker) *lock.Lease {
				l := leaseOn("a2", 2*ttl)
				w.Hold(job("a"), backend, l)
				return l
			},
			refuse: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, clk, lost := newWatchdog(t)
			backend := newFakeLocker(clk)
			var want *lock.Lease
			backend.inFlight = func() { want = tc.during(w, backend) }
			if tc.refuse {
				backend.answer = func(*lock.Lease, time.Duration) (*lock.Lease, error) { return nil, lock.ErrLost }
			}
			w.Hold(job("a"), backend, leaseOn("a", ttl))

			clk.Step(ttl / 3)
			w.RenewDue(t.Context())

			got, _, ok := w.Holding(job("a"))
			if got != want || ok != (want != nil) {
				t.Errorf("Holding = %+v, %v; want %+v", got, ok, want)
			}
			if refs := lost.Refs(); len(refs) != 0 {
				t.Errorf("reported lost %v: the answer about a lease no longer held must be ignored", refs)
			}
		})
	}
}

func TestStartRenewsOnEveryTick(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	w := watchdog.New(nil, watchdog.WithClock(clk), watchdog.WithTick(time.Second))
	renewed := make(chan struct{}, 1)
	backend := newFakeLocker(clk)
	backend.inFlight = func() { renewed <- struct{}{} }
	w.Hold(job("a"), backend, leaseOn("a", ttl))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- w.Start(ctx) }()
	for !clk.HasWaiters() { // until Start has made its ticker
		runtime.Gosched()
	}

	clk.Step(ttl / 3)
	select {
	case <-renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not renew a due lease on its tick")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start = %v after its context ended, want nil", err)
	}
}

// TestALeaseGrantedLessThanItsTTLIsRenewedByItsValidity: a store may grant
// less validity than the TTL (ZooKeeper: at most a session timeout). After
// a renewal the next one is due a third of that validity later, not at the
// next tick.
func TestALeaseGrantedLessThanItsTTLIsRenewedByItsValidity(t *testing.T) {
	t.Parallel()
	const granted = ttl / 2
	w, clk, lost := newWatchdog(t)
	backend := newFakeLocker(clk)
	backend.answer = func(l *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
		r := *l
		r.TTL = ttl
		r.Expires = clk.Now().Add(granted)
		return &r, nil
	}
	w.Hold(job("a"), backend, leaseOn("a", ttl))
	clk.Step(ttl / 3)
	w.RenewDue(t.Context())
	if got := len(backend.Calls()); got != 1 {
		t.Fatalf("%d renewals at a third of the TTL, want 1", got)
	}
	clk.Step(granted/3 - time.Millisecond)
	w.RenewDue(t.Context())
	if calls := backend.Calls(); len(calls) != 0 {
		t.Fatalf("renewed again %v after the store granted %v: want the next renewal a third of that later", granted/3-time.Millisecond, granted)
	}
	clk.Step(time.Millisecond)
	w.RenewDue(t.Context())
	if got := len(backend.Calls()); got != 1 {
		t.Fatalf("%d renewals a third of the granted validity after the last, want 1", got)
	}
	if refs := lost.Refs(); len(refs) != 0 {
		t.Fatalf("lost %v", refs)
	}
}
