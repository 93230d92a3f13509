package etcd

import (
	testingclock "k8s.io/utils/clock/testing"

	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

func TestConformanceSingle(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}}
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second))
	t.Run("Semaphore", func(t *testing.T) {
		locktest.RunSemaphore(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second))
	})
	// A queue longer than Inspect lists: the exact count, holder and places.
	// The waiters keep their place for 30 s: the check takes seconds.
	t.Run("QueueVisibility", func(t *testing.T) {
		locktest.CheckQueueVisibility(t, lockerFactory(cfg, WithWaiterTTL(30*time.Second)))
	})
}

// TestConformanceCluster3Auth runs the suite on a 3-member cluster with etcd
// auth (see cluster3Auth).
func TestConformanceCluster3Auth(t *testing.T) {
	newLocker, opts := cluster3Auth(t)
	locktest.Run(t, newLocker, opts...)
}

// cluster3Auth starts a 3-member cluster with etcd auth and returns its
// Locker factory and suite options. The waiter TTL is 3s rather than 1s: a
// member that rejects a fresh auth token makes the client authenticate
// again, and etcd's bcrypt check of the password takes up to a second on a
// loaded 2-core machine, so a waiter's refresh can come later than a 1s
// waiter TTL allows (it would rightly lose its place, and the FIFO order
// test would see it).
func cluster3Auth(t *testing.T) (func(t *testing.T) lock.Locker, []locktest.Option) {
	c := etcdtest.StartCluster(t, 3, etcdtest.WithRootPassword("s3cret"))
	cfg := configFor(c)
	cfg.Prefix = "/conformance/auth/"
	return lockerFactory(cfg, WithWaiterTTL(3*time.Second)), []locktest.Option{locktest.WithWaiterTTL(3 * time.Second), locktest.WithRounds(3)}
}

// TestConformanceTLSDial runs the suite over TLS with every connection
// opened by Config.Dial (see tlsDial).
func TestConformanceTLSDial(t *testing.T) {
	newLocker, opts, check := tlsDial(t)
	locktest.Run(t, newLocker, opts...)
	check()
}

// tlsDial starts a member over TLS and returns a Locker factory whose every
// connection Config.Dial opens (gRPC runs TLS over the dialer's
// connections), the suite options, and the check that the dialer was used.
func tlsDial(t *testing.T) (func(t *testing.T) lock.Locker, []locktest.Option, func()) {
	m := etcdtest.Start(t, etcdtest.WithTLS())
	d := &countingDialer{}
	cfg := configFor(m.Cluster())
	cfg.Dial = d.dial
	check := func() {
		if d.calls.Load() == 0 {
			t.Fatal("no connection went through Config.Dial")
		}
	}
	return lockerFactory(cfg), []locktest.Option{locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3)}, check
}

// runOnEveryConfig runs a suite of queue-rule cases (locktest.RunPolicies,
// RunPriority, RunWeights) on every configuration the conformance suite
// runs on.
func runOnEveryConfig(t *testing.T, suite func(t *testing.T, newLocker func(t *testing.T) lock.Locker, opts ...locktest.Option)) {
	t.Run("Single", func(t *testing.T) {
		m := etcdtest.Start(t)
		cfg := Config{Endpoints: []string{m.Addr}}
		suite(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second))
	})
	t.Run("Cluster3Auth", func(t *testing.T) {
		newLocker, opts := cluster3Auth(t)
		suite(t, newLocker, opts...)
	})
	t.Run("TLSDial", func(t *testing.T) {
		newLocker, opts, check := tlsDial(t)
		suite(t, newLocker, opts...)
		check()
	})
}

// TestConformancePolicies runs the queue policies' cases (Replace and
// Preempt) on every configuration.
func TestConformancePolicies(t *testing.T) { runOnEveryConfig(t, locktest.RunPolicies) }

// TestConformancePriority runs the cases of priority with aging
// (Request.Boost) on every configuration.
func TestConformancePriority(t *testing.T) { runOnEveryConfig(t, locktest.RunPriority) }

// TestConformanceWeights runs the cases of weighted semaphores
// (Request.Weight) on every configuration.
func TestConformanceWeights(t *testing.T) { runOnEveryConfig(t, locktest.RunWeights) }

func TestLockerReadsItsClock(t *testing.T) {
	m := etcdtest.Start(t)
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		return newTestLocker(t, Config{Endpoints: []string{m.Addr}, Prefix: "/clock/"}, WithClock(c))
	})
}
