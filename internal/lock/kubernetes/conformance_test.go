package kubernetes

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

func TestConformance(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "conformance"}
	locktest.Run(t, lockerFactory(cfg, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

func TestConformanceSemaphore(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "semaphore"}
	locktest.RunSemaphore(t, lockerFactory(cfg, WithWaiterTTL(time.Second)), locktest.WithWaiterTTL(time.Second))
}

// TestQueueVisibility: the waiters keep their places for 30 s; the check
// takes seconds.
func TestQueueVisibility(t *testing.T) {
	needEnv(t)
	locktest.CheckQueueVisibility(t, lockerFactory(Config{Prefix: "visibility"}, WithWaiterTTL(30*time.Second)))
}
