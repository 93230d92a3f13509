package memory

import (
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// newTestStore returns a Store on the real clock.
func newTestStore(t testing.TB, opts ...StoreOption) *Store {
	t.Helper()
	s, err := NewStore(opts...)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return s
}

// newTestLocker returns a new client of s, closed when the test ends.
func newTestLocker(t testing.TB, s *Store, opts ...Option) *Locker {
	t.Helper()
	l, err := s.NewLocker(opts...)
	if err != nil {
		t.Fatalf("NewLocker: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// lockerFactory returns the suites' newLocker: every Locker it makes is a
// new client of one Store, like processes sharing a server.
func lockerFactory(s *Store, opts ...Option) func(t *testing.T) lock.Locker {
	return func(t *testing.T) lock.Locker { return newTestLocker(t, s, opts...) }
}

func TestConformance(t *testing.T) {
	s := newTestStore(t)
	locktest.Run(t, lockerFactory(s, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

func TestConformanceSemaphore(t *testing.T) {
	s := newTestStore(t)
	locktest.RunSemaphore(t, lockerFactory(s, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

func TestConformancePolicies(t *testing.T) {
	s := newTestStore(t)
	locktest.RunPolicies(t, lockerFactory(s, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

func TestConformancePriority(t *testing.T) {
	s := newTestStore(t)
	locktest.RunPriority(t, lockerFactory(s, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

// TestQueueVisibility: CheckQueueVisibility runs for several seconds and
// needs waiters that keep their places meanwhile (a waiter TTL of at least
// 10s).
func TestQueueVisibility(t *testing.T) {
	s := newTestStore(t)
	locktest.CheckQueueVisibility(t, lockerFactory(s, WithWaiterTTL(30*time.Second)))
}

// TestConformanceNew runs the suite on Lockers made by New, which share
// one Store through Store.NewLocker as the suite needs.
func TestConformanceNew(t *testing.T) {
	first, err := New(WithWaiterTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	locktest.Run(t, lockerFactory(first.Store(), WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}

func TestLockerReadsItsClock(t *testing.T) {
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		l, err := New(WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestConformanceWeights(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	locktest.RunWeights(t, lockerFactory(s, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}
