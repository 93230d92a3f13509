package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// RunPriority runs the conformance cases of priority with aging
// (Request.Boost) as subtests of t: a key's queue is ordered by arrival
// less the request's head start, so a boosted waiter goes ahead of the
// ones that arrived less than its boost before it, never ahead of one that
// has waited longer than that, and equal boosts keep exact FIFO order. They
// are rules of the store's queue, so they hold between Lockers (operators)
// that share the store. newLocker is as for Run.
func RunPriority(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...Option) {
	s := caseSuite(newLocker, opts)
	t.Run("BoostGoesAheadOfRecentWaiters", s.boostGoesAhead)
	t.Run("BoostNeverPassesALongerWait", s.boostBounded)
	t.Run("EqualBoostsAreFIFO", s.equalBoostsFIFO)
	t.Run("BoostedWaiterKeepsItsPlace", s.boostKeepsPlace)
	t.Run("BoostOnASemaphore", s.boostSemaphore)
	t.Run("InvalidBoost", s.invalidBoost)
}

// prioReq is a queued request for key by name with head start boost.
func prioReq(t *testing.T, key, name string, boost time.Duration, limit int) lock.Request {
	return lock.Request{Keys: []string{key}, TTL: longTTL, Holder: name, Owner: owner(t), Queue: true, Boost: boost, Limit: limit}
}

// boostGoesAhead: behind a holder, two waiters without a boost, then one
// with an hour's: the boosted one is at the head and takes the key at the
// release; the others follow in their order.
func (s *suite) boostGoesAhead(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	low1, low2, high := prioReq(t, key, "low1", 0, 0), prioReq(t, key, "low2", 0, 0), prioReq(t, key, "high", time.Hour, 0)
	l1, l2, hl := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	queueOnce(t, l1, low1)
	queueOnce(t, l2, low2)
	if he := queueOnce(t, hl, high); he.Position != 0 || he.Waiters != 3 {
		t.Fatalf("refusal of the boosted waiter: %s; want position 0 of 3", heldFields(&he))
	}
	wantQueue(t, l, key, "high", "low1", "low2")
	mustRelease(t, l, h)
	if _, err := l1.TryAcquire(ctxT(t, 10*time.Second), low1); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("low1 at the release, behind the boosted waiter: %v; want ErrNotAcquired", err)
	}
	got := mustAcquire(t, hl, high)
	mustRelease(t, hl, got)
	got = mustAcquire(t, l1, low1)
	mustRelease(t, l1, got)
	got = mustAcquire(t, l2, low2)
	mustRelease(t, l2, got)
}

// boostBounded: a waiter that has waited longer than a newcomer's boost
// stays ahead of it; one that has waited less does not.
func (s *suite) boostBounded(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	const boost = 300 * time.Millisecond
	early := prioReq(t, key, "early", 0, 0)
	el := s.newLocker(t)
	queueOnce(t, el, early)
	// Past the boost (on any store's clock, with a margin; within the
	// waiter TTL, at least a second here), then a waiter without boost,
	// then a boosted one: it passes the recent waiter only.
	time.Sleep(boost + 300*time.Millisecond)
	queueOnce(t, el, early) // keeps its place
	recent := prioReq(t, key, "recent", 0, 0)
	queueOnce(t, s.newLocker(t), recent)
	boosted := prioReq(t, key, "boosted", boost, 0)
	if he := queueOnce(t, s.newLocker(t), boosted); he.Position != 1 {
		t.Fatalf("refusal of the boosted waiter: %s; want position 1, behind the waiter that waited longer than its boost", heldFields(&he))
	}
	wantQueue(t, l, key, "early", "boosted", "recent")
	mustRelease(t, l, h)
}

// equalBoostsFIFO: waiters with the same boost (none, then an hour's) keep
// the order they came in, among many Lockers.
func (s *suite) equalBoostsFIFO(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	names := []string{"a", "b", "c", "d", "e"}
	for _, n := range names {
		queueOnce(t, s.newLocker(t), prioReq(t, key, n, 0, 0))
	}
	for _, n := range []string{"x", "y", "z"} {
		queueOnce(t, s.newLocker(t), prioReq(t, key, n, time.Hour, 0))
	}
	wantQueue(t, l, key, "x", "y", "z", "a", "b", "c", "d", "e")
	mustRelease(t, l, h)
}

// boostKeepsPlace: a boosted waiter that calls again (to keep its place)
// keeps its rank, and a waiter that calls again with another boost keeps
// the place it joined with.
func (s *suite) boostKeepsPlace(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "holder"})
	low := prioReq(t, key, "low", 0, 0)
	ll := s.newLocker(t)
	queueOnce(t, ll, low)
	high := prioReq(t, key, "high", time.Hour, 0)
	hl := s.newLocker(t)
	queueOnce(t, hl, high)
	wantQueue(t, l, key, "high", "low")
	for range 3 {
		queueOnce(t, hl, high)
		low.Boost = 2 * time.Hour // asking again for more does not move it
		queueOnce(t, ll, low)
	}
	wantQueue(t, l, key, "high", "low")
	mustRelease(t, l, h)
}

// boostSemaphore: on a semaphore of 2 with both slots taken, a boosted
// waiter gets the first slot freed.
func (s *suite) boostSemaphore(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	a := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "a", Limit: 2})
	b := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "b", Limit: 2})
	low, high := prioReq(t, key, "low", 0, 2), prioReq(t, key, "high", time.Hour, 2)
	ll, hl := s.newLocker(t), s.newLocker(t)
	queueOnce(t, ll, low)
	queueOnce(t, hl, high)
	wantQueue(t, l, key, "high", "low")
	mustRelease(t, l, a)
	got := mustAcquire(t, hl, high)
	if _, err := ll.TryAcquire(ctxT(t, 10*time.Second), low); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("low with both slots taken again: %v; want ErrNotAcquired", err)
	}
	mustRelease(t, hl, got)
	mustRelease(t, l, b)
}

// invalidBoost: a negative boost, one above MaxBoost, and one without
// Queue are refused naming the field, before anything reaches the store.
func (s *suite) invalidBoost(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	for name, req := range map[string]lock.Request{
		"negative":   {Keys: []string{key}, TTL: longTTL, Queue: true, Boost: -time.Second},
		"too large":  {Keys: []string{key}, TTL: longTTL, Queue: true, Boost: lock.MaxBoost + time.Second},
		"not queued": {Keys: []string{key}, TTL: longTTL, Boost: time.Minute},
	} {
		_, err := l.TryAcquire(ctxT(t, 10*time.Second), req)
		var invalid *lock.InvalidRequestError
		if !errors.As(err, &invalid) || invalid.Field != "boost" {
			t.Errorf("%s boost: %v; want an InvalidRequestError on field boost", name, err)
		}
	}
	wantQueue(t, l, key)
}
