package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// RunWeights runs the conformance cases of weighted semaphores
// (Request.Weight) as subtests of t: a lease takes Weight slots, the
// weights held never sum to more than the limit, and admission is strict
// FIFO by weight (a heavy waiter at the head is never passed by lighter
// ones, even while a slot is free). For stores that take weighted
// requests; newLocker is as for Run.
func RunWeights(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...Option) {
	s := caseSuite(newLocker, opts)
	t.Run("WeightTakesSlots", s.weightTakesSlots)
	t.Run("HeavyWaiterIsNotPassed", s.heavyNotPassed)
	t.Run("WeightsNeverExceedTheLimit", s.weightsNeverExceed)
	t.Run("InspectShowsWeights", s.inspectWeights)
	t.Run("InvalidWeight", s.invalidWeight)
}

// weighted is a request for key by name taking weight of limit slots.
func weighted(t *testing.T, key, name string, weight, limit int, queue bool) lock.Request {
	return lock.Request{Keys: []string{key}, TTL: longTTL, Holder: name, Owner: owner(t), Queue: queue, Limit: limit, Weight: weight}
}

// weightTakesSlots: on a limit of 4, a weight-3 lease and a weight-1 one
// fill the key; a third request of weight 1 is refused until one of them
// releases, and a weight-2 one until the weight-3 one does.
func (s *suite) weightTakesSlots(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	heavy := mustAcquire(t, l, weighted(t, key, "heavy", 3, 4, false))
	if heavy.Weight != 3 {
		t.Errorf("lease of weight 3: Weight %d", heavy.Weight)
	}
	light := mustAcquire(t, l, weighted(t, key, "light", 1, 4, false))
	_, err := l.TryAcquire(ctxT(t, 10*time.Second), weighted(t, key, "third", 1, 4, false))
	if he := wantHeldError(t, err, key); he.Holders != 2 {
		t.Fatalf("a fifth slot on a limit of 4 (weights 3+1 held): %s; want refused with 2 holders", heldFields(he))
	}
	mustRelease(t, l, light)
	two := weighted(t, key, "two", 2, 4, false)
	if _, err := l.TryAcquire(ctxT(t, 10*time.Second), two); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("weight 2 beside weight 3 on a limit of 4: %v; want ErrNotAcquired", err)
	}
	mustRelease(t, l, heavy)
	got := mustAcquire(t, l, two)
	other := mustAcquire(t, l, weighted(t, key, "other", 2, 4, false))
	mustRelease(t, l, got)
	mustRelease(t, l, other)
}

// heavyNotPassed: three weight-1 holders on a limit of 4; a weight-3
// waiter queues (one slot free, three needed), then a weight-1 waiter
// behind it is refused although a slot is free. When two holders release,
// the heavy waiter takes its slots, and the light one still waits for one.
func (s *suite) heavyNotPassed(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	var held []*lock.Lease
	for i := range 3 {
		held = append(held, mustAcquire(t, l, weighted(t, key, fmt.Sprintf("h%d", i), 1, 4, false)))
	}
	hl, ll := s.newLocker(t), s.newLocker(t)
	heavy, light := weighted(t, key, "heavy", 3, 4, true), weighted(t, key, "light", 1, 4, true)
	if he := queueOnce(t, hl, heavy); he.Position != 0 {
		t.Fatalf("weight 3 with one slot free: %s; want queued at the head", heldFields(&he))
	}
	if he := queueOnce(t, ll, light); he.Position != 1 {
		t.Fatalf("weight 1 behind the heavy waiter, one slot free: %s; want queued second, not let through", heldFields(&he))
	}
	wantQueue(t, l, key, "heavy", "light")
	// A request that does not queue does not pass them either.
	if _, err := l.TryAcquire(ctxT(t, 10*time.Second), weighted(t, key, "jumper", 1, 4, false)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("an unqueued weight-1 request with waiters ahead: %v; want ErrNotAcquired", err)
	}
	mustRelease(t, l, held[0])
	if _, err := hl.TryAcquire(ctxT(t, 10*time.Second), heavy); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("weight 3 with two slots free: %v; want ErrNotAcquired", err)
	}
	mustRelease(t, l, held[1])
	h := mustAcquire(t, hl, heavy)
	if _, err := ll.TryAcquire(ctxT(t, 10*time.Second), light); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("weight 1 with weights 3+1 held on a limit of 4: %v; want ErrNotAcquired", err)
	}
	mustRelease(t, l, held[2])
	got := mustAcquire(t, ll, light)
	mustRelease(t, ll, got)
	mustRelease(t, hl, h)
}

// weightsNeverExceed: racers of weights 1 to 3 on a limit of 4, each
// holding briefly; the weights they hold at once, as each one sees them
// while it holds, never exceed 4.
func (s *suite) weightsNeverExceed(t *testing.T) {
	key := keys(t, 1)[0]
	const limit = 4
	var inUse, peak, grants atomic.Int64
	var wg sync.WaitGroup
	ctx := ctxT(t, 60*time.Second)
	for c := range 8 {
		l := s.newLocker(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7)) //nolint:gosec // G404: a test schedule, not a secret
			for range 4 {
				w := 1 + rng.IntN(3)
				lease, err := l.Acquire(ctx, weighted(t, key, fmt.Sprintf("c%d", c), w, limit, true))
				if err != nil {
					t.Errorf("client %d weight %d: %v", c, w, err)
					return
				}
				now := inUse.Add(int64(w))
				for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
				}
				grants.Add(1)
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				inUse.Add(-int64(w))
				if err := l.Release(context.Background(), lease); err != nil {
					t.Errorf("client %d release: %v", c, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d slots held at once on a limit of %d", p, limit)
	}
	if grants.Load() != 32 {
		t.Fatalf("%d of 32 acquisitions granted", grants.Load())
	}
}

// inspectShowsWeights: Inspect reports each holder's weight.
func (s *suite) inspectWeights(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	a := mustAcquire(t, l, weighted(t, key, "a", 3, 5, false))
	b := mustAcquire(t, l, weighted(t, key, "b", 0, 5, false))
	st, err := inspect1(ctxT(t, 10*time.Second), l, key)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, h := range st.Holders {
		got[h.Holder] = h.Weight
	}
	if st.HolderCount != 2 || got["a"] != 3 || got["b"] != 1 {
		t.Fatalf("Inspect: %d holders, weights %v; want 2 holders, a 3 and b 1", st.HolderCount, got)
	}
	mustRelease(t, l, a)
	mustRelease(t, l, b)
}

// invalidWeight: a weight above the limit, a negative one, and a weight
// above 1 on a mutex are refused naming the field.
func (s *suite) invalidWeight(t *testing.T) {
	l := s.newLocker(t)
	key := keys(t, 1)[0]
	for name, req := range map[string]lock.Request{
		"above the limit": {Keys: []string{key}, TTL: longTTL, Limit: 3, Weight: 4},
		"negative":        {Keys: []string{key}, TTL: longTTL, Limit: 3, Weight: -1},
		"on a mutex":      {Keys: []string{key}, TTL: longTTL, Weight: 2},
	} {
		_, err := l.TryAcquire(ctxT(t, 10*time.Second), req)
		var invalid *lock.InvalidRequestError
		if !errors.As(err, &invalid) || invalid.Field != "weight" {
			t.Errorf("%s: %v; want an InvalidRequestError on field weight", name, err)
		}
	}
}

// RunWeightsRefused checks that a store that does not take weighted
// requests refuses them, naming the field, and still takes weight 1.
func RunWeightsRefused(t *testing.T, newLocker func(t *testing.T) lock.Locker) {
	l := newLocker(t)
	key := keys(t, 1)[0]
	_, err := l.TryAcquire(ctxT(t, 10*time.Second), lock.Request{Keys: []string{key}, TTL: longTTL, Limit: 4, Weight: 2})
	var invalid *lock.InvalidRequestError
	if !errors.As(err, &invalid) || invalid.Field != "weight" {
		t.Fatalf("weight 2: %v; want an InvalidRequestError on field weight", err)
	}
	lease := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: longTTL, Limit: 4, Weight: 1})
	mustRelease(t, l, lease)
}

// IgnoreWeights returns a Locker that asks l for one slot whatever the
// request's Weight, and reports the lease as taking the weight asked: the
// mutant of a store that counts holders instead of weights. The fault
// harness with Faults.Weights must catch it, as more slots held than the
// limit (TestFaultHarnessCatchesAMutant in the store packages).
func IgnoreWeights(l lock.Locker) lock.Locker { return &ignoreWeights{Locker: l} }

type ignoreWeights struct{ lock.Locker }

func (m *ignoreWeights) weighed(lease *lock.Lease, err error, weight int) (*lock.Lease, error) {
	if lease != nil {
		lease.Weight = max(weight, 1)
	}
	return lease, err
}

func (m *ignoreWeights) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	w := req.Weight
	req.Weight = 0
	lease, err := m.Locker.TryAcquire(ctx, req)
	return m.weighed(lease, err, w)
}

func (m *ignoreWeights) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	w := req.Weight
	req.Weight = 0
	lease, err := m.Locker.Acquire(ctx, req)
	return m.weighed(lease, err, w)
}
