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

// runOnEveryConfig runs a suite of queue-rule cases (locktest.RunPolicies,
// RunPriority, RunWeights) on the configurations of TestConformance and
// TestConformancePasswordTLS, telling the suite the waiter TTL and giving
// the Lockers opts.
func runOnEveryConfig(t *testing.T, suite func(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...locktest.Option), waiterTTL time.Duration, opts ...Option) {
	s := pgtest.Start(t)
	suite(t, lockerFactory(configFor(s), opts...), locktest.WithWaiterTTL(waiterTTL))
	t.Run("PasswordTLS", func(t *testing.T) {
		s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
		cfg := configFor(s)
		cfg.Schema = "locks_tls"
		suite(t, lockerFactory(cfg, opts...), locktest.WithWaiterTTL(waiterTTL), locktest.WithRounds(3))
	})
}

// TestConformancePolicies: Request.Replace and Request.Preempt.
func TestConformancePolicies(t *testing.T) {
	runOnEveryConfig(t, locktest.RunPolicies, time.Second)
}

// conformanceWaiterTTL is how long the waiters of TestConformancePriority
// and TestConformanceWeights keep their place: a case queues up to eight
// waiters, each through a new Locker whose first call connects and checks
// the schema (about 0.1 s on a loaded machine), and no case needs a waiter
// to expire.
const conformanceWaiterTTL = 5 * time.Second

// TestConformancePriority: Request.Boost.
func TestConformancePriority(t *testing.T) {
	runOnEveryConfig(t, locktest.RunPriority, conformanceWaiterTTL, WithWaiterTTL(conformanceWaiterTTL))
}

// TestConformanceWeights: Request.Weight.
func TestConformanceWeights(t *testing.T) {
	runOnEveryConfig(t, locktest.RunWeights, conformanceWaiterTTL, WithWaiterTTL(conformanceWaiterTTL))
}
