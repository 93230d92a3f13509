package kubernetes

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// conformanceWaiterTTL is the waiters' TTL in the suites: a waiter's
// refresh is a read and a write of each key's Lease, each a raft commit of
// the API server's etcd, and on a loaded 2-core machine a refresh can take
// longer than the 1s the in-process stores use (the waiter would rightly
// lose its place, and the FIFO order tests would see it).
const conformanceWaiterTTL = 3 * time.Second

func TestConformance(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "conformance"}
	locktest.Run(t, lockerFactory(cfg, WithWaiterTTL(conformanceWaiterTTL)), locktest.WithWaiterTTL(conformanceWaiterTTL))
}

func TestConformanceSemaphore(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "semaphore"}
	locktest.RunSemaphore(t, lockerFactory(cfg, WithWaiterTTL(conformanceWaiterTTL)), locktest.WithWaiterTTL(conformanceWaiterTTL))
}

// TestQueueVisibility: the waiters keep their places for 30 s; the check
// takes seconds.
func TestQueueVisibility(t *testing.T) {
	needEnv(t)
	locktest.CheckQueueVisibility(t, lockerFactory(Config{Prefix: "visibility"}, WithWaiterTTL(30*time.Second)))
}

func TestConformancePolicies(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "policies"}
	locktest.RunPolicies(t, lockerFactory(cfg, WithWaiterTTL(conformanceWaiterTTL)), locktest.WithWaiterTTL(conformanceWaiterTTL))
}

func TestConformancePriority(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "priority"}
	locktest.RunPriority(t, lockerFactory(cfg, WithWaiterTTL(conformanceWaiterTTL)), locktest.WithWaiterTTL(conformanceWaiterTTL))
}

func TestConformanceWeights(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "weights"}
	locktest.RunWeights(t, lockerFactory(cfg, WithWaiterTTL(conformanceWaiterTTL)), locktest.WithWaiterTTL(conformanceWaiterTTL))
}
