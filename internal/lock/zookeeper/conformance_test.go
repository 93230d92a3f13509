package zookeeper

import (
	testingclock "k8s.io/utils/clock/testing"

	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

func TestConformanceStandalone(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	locktest.Run(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}), locktest.WithWaiterTTL(time.Second))
}

func TestConformanceEnsemble(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	// A queued request that does not call again is pruned after the waiter
	// TTL. The FIFO cases make a waiter join and then take their other
	// steps (each a few ensemble round trips) before it calls again: under
	// a loaded CI machine one second was not always enough for three
	// servers, and the first waiter was pruned as dead.
	const waiterTTL = 3 * time.Second
	locktest.Run(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}, WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL), locktest.WithRounds(5))
}

func TestConformanceDigest(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/digest/locks", Digest: "lockwarden:s3cret"}
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}

// TestConformancePolicies runs the queue policies' suite (Request.Replace
// and Request.Preempt) in every configuration the conformance suite runs in:
// standalone, the ensemble (reads from followers) and digest ACLs (the
// replacement marks are nodes the Locker creates under the key nodes).
func TestConformancePolicies(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		e := sharedServers(t, 1)
		logsOnFailure(t, e)
		locktest.RunPolicies(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}), locktest.WithWaiterTTL(time.Second))
	})
	t.Run("Ensemble", func(t *testing.T) {
		e := sharedServers(t, 3)
		logsOnFailure(t, e)
		const waiterTTL = 3 * time.Second // as TestConformanceEnsemble
		locktest.RunPolicies(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}, WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL), locktest.WithRounds(5))
	})
	t.Run("Digest", func(t *testing.T) {
		e := sharedServers(t, 1)
		logsOnFailure(t, e)
		cfg := Config{Servers: e.Addrs(), Root: "/digest/locks", Digest: "lockwarden:s3cret"}
		locktest.RunPolicies(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
	})
}

// TestSemaphore runs the counting-semaphore suite (Request.Limit > 1: slot
// nodes beside the holder node) on the standalone server and on the
// ensemble, where reads may come from a follower.
func TestSemaphore(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		e := sharedServers(t, 1)
		logsOnFailure(t, e)
		locktest.RunSemaphore(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/semaphore"}), locktest.WithWaiterTTL(time.Second))
	})
	t.Run("Ensemble", func(t *testing.T) {
		e := sharedServers(t, 3)
		logsOnFailure(t, e)
		const waiterTTL = 3 * time.Second // as TestConformanceEnsemble
		locktest.RunSemaphore(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/semaphore"}, WithWaiterTTL(waiterTTL)), locktest.WithWaiterTTL(waiterTTL))
	})
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
