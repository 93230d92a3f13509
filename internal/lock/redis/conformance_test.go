package redis

import (
	testingclock "k8s.io/utils/clock/testing"

	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

func TestConformanceStandalone(t *testing.T) {
	s := redistest.Start(t)
	locktest.Run(t, lockerFactory(Config{Addrs: []string{s.Addr}, Prefix: "conf:"}), locktest.WithWaiterTTL(time.Second))
}

func TestConformanceStandalonePasswordTLS(t *testing.T) {
	s := redistest.Start(t, redistest.WithPassword("s3cret"), redistest.WithTLS())
	cfg := Config{Addrs: []string{s.Addr}, Password: "s3cret", TLS: tlsFor(s), DB: 3}
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}

func TestConformanceRedlock3(t *testing.T) {
	servers := redistest.StartN(t, 3)
	locktest.Run(t, lockerFactory(Config{Addrs: addrs(servers), DB: 1}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(5))
}

func TestConformanceRedlock5(t *testing.T) {
	servers := redistest.StartN(t, 5)
	locktest.Run(t, lockerFactory(Config{Addrs: addrs(servers)}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(5))
}

func TestConformanceSentinel(t *testing.T) {
	master := redistest.Start(t, redistest.WithPassword("m4ster"))
	sentinels := redistest.StartSentinels(t, master, 3, "mymaster")
	cfg := Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName, Password: "m4ster", DB: 2}
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}

// TestConformancePolicies runs the queue rules' cases (Request.Replace and
// Request.Preempt) on every configuration the conformance tests above cover,
// with the same factories and options.
func TestConformancePolicies(t *testing.T) {
	runOnEveryConfig(t, locktest.RunPolicies)
}

// TestConformancePriority runs the cases of priority with aging
// (Request.Boost) on every configuration the conformance tests above cover,
// with the same factories and options.
func TestConformancePriority(t *testing.T) {
	runOnEveryConfig(t, locktest.RunPriority)
}

// TestConformanceWeights runs the cases of weighted semaphores
// (Request.Weight) on every configuration the conformance tests above cover,
// with the same factories and options.
func TestConformanceWeights(t *testing.T) {
	runOnEveryConfig(t, locktest.RunWeights)
}

// runOnEveryConfig runs a suite of cases (locktest.RunPolicies,
// locktest.RunPriority, locktest.RunWeights) on every configuration the
// conformance tests cover.
func runOnEveryConfig(t *testing.T, run func(*testing.T, func(*testing.T) lock.Locker, ...locktest.Option)) {
	t.Run("Standalone", func(t *testing.T) {
		s := redistest.Start(t)
		run(t, lockerFactory(Config{Addrs: []string{s.Addr}, Prefix: "conf:"}), locktest.WithWaiterTTL(time.Second))
	})
	t.Run("StandalonePasswordTLS", func(t *testing.T) {
		s := redistest.Start(t, redistest.WithPassword("s3cret"), redistest.WithTLS())
		cfg := Config{Addrs: []string{s.Addr}, Password: "s3cret", TLS: tlsFor(s), DB: 3}
		run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
	})
	t.Run("Redlock3", func(t *testing.T) {
		servers := redistest.StartN(t, 3)
		run(t, lockerFactory(Config{Addrs: addrs(servers), DB: 1}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(5))
	})
	t.Run("Redlock5", func(t *testing.T) {
		servers := redistest.StartN(t, 5)
		run(t, lockerFactory(Config{Addrs: addrs(servers)}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(5))
	})
	t.Run("Sentinel", func(t *testing.T) {
		master := redistest.Start(t, redistest.WithPassword("m4ster"))
		sentinels := redistest.StartSentinels(t, master, 3, "mymaster")
		cfg := Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName, Password: "m4ster", DB: 2}
		run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
	})
}

func TestLockerReadsItsClock(t *testing.T) {
	s := redistest.Start(t)
	locktest.CheckClock(t, func(t *testing.T, c *testingclock.FakeClock) lock.Locker {
		return newTestLocker(t, Config{Addrs: []string{s.Addr}, Prefix: "clock:"}, WithClock(c))
	})
}
