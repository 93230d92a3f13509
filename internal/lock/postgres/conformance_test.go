package postgres

import (
	testingclock "k8s.io/utils/clock/testing"

	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

func TestConformance(t *testing.T) {
	s := pgtest.Start(t)
	locktest.Run(t, lockerFactory(configFor(s)), locktest.WithWaiterTTL(time.Second))
	t.Run("Semaphore", func(t *testing.T) {
		locktest.RunSemaphore(t, lockerFactory(configFor(s)), locktest.WithWaiterTTL(time.Second))
	})
	// A queue longer than Inspect lists: the exact count, holder and places.
	// The waiters keep their place for 30 s: the check takes seconds.
	t.Run("QueueVisibility", func(t *testing.T) {
		locktest.CheckQueueVisibility(t, lockerFactory(configFor(s), WithWaiterTTL(30*time.Second)))
	})
}

// TestConformancePasswordTLS: a TLS-only server, a non-default password and
// schema, fewer rounds of the race.
func TestConformancePasswordTLS(t *testing.T) {
	s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
	cfg := configFor(s)
	cfg.Schema = "locks_tls"
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}

func TestLockerReadsItsClock(t *testing.T) {
	s := pgtest.Start(t)
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		return newTestLocker(t, configFor(s), WithClock(c))
	})
}

// TestConformancePolicies: Request.Replace and Request.Preempt, for the
// configurations of TestConformance and TestConformancePasswordTLS.
func TestConformancePolicies(t *testing.T) {
	s := pgtest.Start(t)
	locktest.RunPolicies(t, lockerFactory(configFor(s)), locktest.WithWaiterTTL(time.Second))
	t.Run("PasswordTLS", func(t *testing.T) {
		s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
		cfg := configFor(s)
		cfg.Schema = "locks_tls"
		locktest.RunPolicies(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
	})
}

// TestConformancePriority: Request.Boost, for the configurations of
// TestConformance and TestConformancePasswordTLS. The waiters keep their
// place for 5 s: a case queues up to eight waiters, each through a new
// Locker whose first call connects and checks the schema (about 0.1 s on a
// loaded machine), and no case needs a waiter to expire.
func TestConformancePriority(t *testing.T) {
	const waiterTTL = 5 * time.Second
	s := pgtest.Start(t)
	locktest.RunPriority(t, lockerFactory(configFor(s), WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL))
	t.Run("PasswordTLS", func(t *testing.T) {
		s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
		cfg := configFor(s)
		cfg.Schema = "locks_tls"
		locktest.RunPriority(t, lockerFactory(cfg, WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL), locktest.WithRounds(3))
	})
}

// TestConformanceWeights: Request.Weight, for the configurations of
// TestConformance and TestConformancePasswordTLS. The waiters keep their
// place for 5 s, as in TestConformancePriority: a case queues its waiters
// through new Lockers, and no case needs a waiter to expire.
func TestConformanceWeights(t *testing.T) {
	const waiterTTL = 5 * time.Second
	s := pgtest.Start(t)
	locktest.RunWeights(t, lockerFactory(configFor(s), WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL))
	t.Run("PasswordTLS", func(t *testing.T) {
		s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
		cfg := configFor(s)
		cfg.Schema = "locks_tls"
		locktest.RunWeights(t, lockerFactory(cfg, WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL), locktest.WithRounds(3))
	})
}
