package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// faultRuns is how many seeded runs a fault test makes (each lasts about
// 1.5s), fewer with -short.
func faultRuns(n int) int {
	if testing.Short() {
		return max(n/2, 1)
	}
	return n
}

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// (exclusion and fencing tokens) while the store stalls (pause), loses its
// replies after running the calls (lost-replies), gets the stale lock of a
// crashed client (stale-lock), or gets waiters that never call again at the
// head of its queues (dead-waiter). Each run has a Store of its own.
func TestFaultsFencedRegister(t *testing.T) {
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, faultRuns(6)) {
		s := newTestStore(t)
		locktest.RunFaults(t, "mutex", seed, &tally, locktest.Faults{
			NewLocker: lockerFactory(s, WithWaiterTTL(time.Second)),
			Nemeses:   memoryNemeses(t, s),
			Policies:  true,
		})
	}
	tally.Check(t)
}

// TestFaultsSemaphore runs the semaphore fault test of locktest (at most
// Limit leases valid at once, tokens strictly increasing) under the same
// nemeses, with 2 and 3 slots.
func TestFaultsSemaphore(t *testing.T) {
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, faultRuns(4)) {
		s := newTestStore(t)
		limit := 2 + int(seed%2)
		locktest.RunFaults(t, fmt.Sprintf("limit-%d", limit), seed, &tally, locktest.Faults{
			NewLocker: lockerFactory(s, WithWaiterTTL(time.Second)),
			Nemeses:   memoryNemeses(t, s),
			Limit:     limit,
			Policies:  true,
			Weights:   true,
		})
	}
	tally.Check(t)
}

// TestFaultHarnessCatchesAMutant is the negative control of the fault
// harness: a client that reports every lease as valid 200ms longer than the
// store keeps it (locktest.LateExpiry), and a store that frees leases half
// their TTL early (earlyExpiry), must each fail the exclusion check, in
// mutex and in semaphore runs; so must a store that ends a preempted
// lease at once (locktest.PreemptTakesOver) instead of at its Expires, and
// one that counts holders instead of weights (locktest.IgnoreWeights). A
// harness that passed them would prove nothing about the store that passes
// it.
func TestFaultHarnessCatchesAMutant(t *testing.T) {
	mutants := map[string]func(t *testing.T) func(t *testing.T) lock.Locker{
		"late-expiry": func(t *testing.T) func(t *testing.T) lock.Locker {
			s := newTestStore(t)
			return func(t *testing.T) lock.Locker {
				return locktest.LateExpiry(newTestLocker(t, s), 200*time.Millisecond)
			}
		},
		"early-expiry": func(t *testing.T) func(t *testing.T) lock.Locker {
			s := newTestStore(t)
			s.earlyExpiry = 150 * time.Millisecond // of the runs' 300ms TTL
			return lockerFactory(s)
		},
	}
	t.Run("preempt-takes-over/mutex", func(t *testing.T) {
		t.Parallel()
		s := newTestStore(t)
		err := locktest.FindViolation(t, 5, locktest.Faults{NewLocker: locktest.PreemptTakesOver(lockerFactory(s)), Policies: true})
		var ex *locktest.ExclusionError
		if !errors.As(err, &ex) {
			t.Fatalf("the fault harness passed a store that ends a preempted lease before it expires (%v): it cannot catch two valid holders", err)
		}
	})
	t.Run("ignore-weights/semaphore", func(t *testing.T) {
		t.Parallel()
		s := newTestStore(t)
		err := locktest.FindViolation(t, 5, locktest.Faults{NewLocker: func(t *testing.T) lock.Locker { return locktest.IgnoreWeights(newTestLocker(t, s)) }, Limit: 3, Weights: true})
		var ex *locktest.ExclusionError
		if !errors.As(err, &ex) {
			t.Fatalf("the fault harness passed a store that counts holders instead of weights (%v): it cannot catch more slots held than the limit", err)
		}
	})
	for name, mutant := range mutants {
		for kind, limit := range map[string]int{"mutex": 1, "semaphore": 2} {
			t.Run(name+"/"+kind, func(t *testing.T) {
				t.Parallel() // each run fails its check, whatever the load
				err := locktest.FindViolation(t, 5, locktest.Faults{NewLocker: mutant(t), Limit: limit})
				var ex *locktest.ExclusionError
				if !errors.As(err, &ex) {
					t.Fatalf("the fault harness passed the %s mutant (%v): it cannot catch two valid holders", name, err)
				}
			})
		}
	}
}

// memoryNemeses are the faults of an in-memory store s: it stalls (pause,
// past the runs' TTL at times), it loses its replies after running the
// calls (lost-replies), a crashed client leaves stale locks on the free
// keys (stale-lock), waiters that never call again sit at the head of the
// queues (dead-waiter).
func memoryNemeses(t *testing.T, s *Store) []locktest.Nemesis {
	return []locktest.Nemesis{
		locktest.PauseResume(t, 400*time.Millisecond, func(*rand.Rand) (func() error, func() error) {
			return func() error { s.Pause(); return nil }, func() error { s.Resume(); return nil }
		}),
		{Name: "lost-replies", Inject: func(ctx context.Context, rng *rand.Rand) {
			s.DropReplies()
			defer s.DeliverReplies()
			sleep(ctx, between(rng, 50*time.Millisecond, 400*time.Millisecond))
		}},
		{Name: "stale-lock", Inject: func(ctx context.Context, rng *rand.Rand) { staleLock(ctx, t, s, rng) }},
		{Name: "dead-waiter", Inject: func(ctx context.Context, rng *rand.Rand) {
			deadWaiter(s, rng)
			sleep(ctx, between(rng, 100*time.Millisecond, 500*time.Millisecond))
		}},
	}
}

// staleLock takes the store's free keys for a client that then crashes
// (another owner, a 500ms TTL, never released): they are refused until it
// expires.
func staleLock(ctx context.Context, t *testing.T, s *Store, rng *rand.Rand) {
	crashed, err := s.NewLocker()
	if err != nil {
		t.Errorf("stale-lock: %v", err)
		return
	}
	defer func() { _ = crashed.Close() }()
	for _, k := range s.keyNames() {
		_, _ = crashed.TryAcquire(ctx, lock.Request{Keys: []string{k}, TTL: 500 * time.Millisecond, Holder: fmt.Sprintf("crashed-%d", rng.Uint64())})
	}
	sleep(ctx, between(rng, 100*time.Millisecond, 500*time.Millisecond))
}

// deadWaiter puts a waiter that never calls again (its deadline 300ms
// ahead) at the head of every key's queue: the store must prune it, and
// nobody may wait for it longer.
func deadWaiter(s *Store, rng *rand.Rand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	owner := fmt.Sprintf("dead-%d", rng.Uint64())
	for _, e := range s.keys {
		e.queue = append([]*waiter{{owner: owner, holder: "dead", since: now, deadline: now.Add(300 * time.Millisecond)}}, e.queue...)
	}
}

// keyNames returns the names of the keys the store knows.
func (s *Store) keyNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.keys))
	for k := range s.keys {
		names = append(names, k)
	}
	return names
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// between returns a duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}
