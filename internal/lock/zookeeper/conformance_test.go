package zookeeper

import (
	testingclock "k8s.io/utils/clock/testing"

	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// suite is one of locktest's conformance suites (Run, RunSemaphore,
// RunPolicies, RunPriority, RunWeights).
type suite func(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...locktest.Option)

// ensembleWaiterTTL is the waiter TTL of the runs on the ensemble. A queued
// request that does not call again is pruned after the waiter TTL. The FIFO
// cases make a waiter join and then take their other steps (each a few
// ensemble round trips) before it calls again: under a loaded CI machine one
// second was not always enough for three servers, and the first waiter was
// pruned as dead.
const ensembleWaiterTTL = 3 * time.Second

// runSuite runs s on the shared servers of n (1: standalone) with cfg (its
// Servers set to theirs), a waiter TTL of one second on the standalone
// server and ensembleWaiterTTL on the ensemble, and opts.
func runSuite(t *testing.T, n int, cfg Config, s suite, opts ...locktest.Option) {
	e := sharedServers(t, n)
	logsOnFailure(t, e)
	cfg.Servers = e.Addrs()
	waiterTTL := time.Second
	if n > 1 {
		waiterTTL = ensembleWaiterTTL
	}
	s(t, lockerFactory(cfg, WithWaiterTTL(waiterTTL)), append([]locktest.Option{locktest.WithWaiterTTL(waiterTTL)}, opts...)...)
}

// digestConfig is the configuration of the runs with digest ACLs.
var digestConfig = Config{Root: "/digest/locks", Digest: "lockwarden:s3cret"}

func TestConformanceStandalone(t *testing.T) {
	runSuite(t, 1, Config{Root: "/conformance"}, locktest.Run)
}

func TestConformanceEnsemble(t *testing.T) {
	runSuite(t, 3, Config{Root: "/conformance"}, locktest.Run, locktest.WithRounds(5))
}

func TestConformanceDigest(t *testing.T) {
	runSuite(t, 1, digestConfig, locktest.Run, locktest.WithRounds(3))
}

// TestConformancePolicies runs the queue policies' suite (Request.Replace
// and Request.Preempt) in every configuration the conformance suite runs in:
// standalone, the ensemble (reads from followers) and digest ACLs (the
// replacement marks are nodes the Locker creates under the key nodes).
func TestConformancePolicies(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { runSuite(t, 1, Config{Root: "/conformance"}, locktest.RunPolicies) })
	t.Run("Ensemble", func(t *testing.T) {
		runSuite(t, 3, Config{Root: "/conformance"}, locktest.RunPolicies, locktest.WithRounds(5))
	})
	t.Run("Digest", func(t *testing.T) { runSuite(t, 1, digestConfig, locktest.RunPolicies, locktest.WithRounds(3)) })
}

// TestConformancePriority runs the priority suite (Request.Boost) in every
// configuration the conformance suite runs in: standalone, the ensemble
// (the ranks come from the leader's clock, reads from followers) and
// digest ACLs (the arrival node is written under them).
func TestConformancePriority(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { runSuite(t, 1, Config{Root: "/conformance"}, locktest.RunPriority) })
	t.Run("Ensemble", func(t *testing.T) {
		runSuite(t, 3, Config{Root: "/conformance"}, locktest.RunPriority, locktest.WithRounds(5))
	})
	t.Run("Digest", func(t *testing.T) { runSuite(t, 1, digestConfig, locktest.RunPriority, locktest.WithRounds(3)) })
}

// TestConformanceWeights runs the weighted semaphores' suite
// (Request.Weight) in every configuration the conformance suite runs in:
// standalone, the ensemble (reads from followers: the weights of the slots
// and waiters are read from their nodes' data) and digest ACLs.
func TestConformanceWeights(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { runSuite(t, 1, Config{Root: "/conformance"}, locktest.RunWeights) })
	t.Run("Ensemble", func(t *testing.T) {
		runSuite(t, 3, Config{Root: "/conformance"}, locktest.RunWeights, locktest.WithRounds(5))
	})
	t.Run("Digest", func(t *testing.T) { runSuite(t, 1, digestConfig, locktest.RunWeights, locktest.WithRounds(3)) })
}

// TestSemaphore runs the counting-semaphore suite (Request.Limit > 1: slot
// nodes beside the holder node) on the standalone server and on the
// ensemble, where reads may come from a follower.
func TestSemaphore(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { runSuite(t, 1, Config{Root: "/semaphore"}, locktest.RunSemaphore) })
	t.Run("Ensemble", func(t *testing.T) { runSuite(t, 3, Config{Root: "/semaphore"}, locktest.RunSemaphore) })
}

// TestQueueVisibility: a queue longer than Inspect lists, on the ensemble
// (reads may come from a follower). The waiters keep their place for 30 s:
// the check takes seconds.
func TestQueueVisibility(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	locktest.CheckQueueVisibility(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}, WithWaiterTTL(30*time.Second)))
}

func TestLockerReadsItsClock(t *testing.T) {
	e := sharedServers(t, 1)
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		return newTestLocker(t, Config{Servers: e.Addrs(), Root: "/clock"}, WithClock(c))
	})
}
