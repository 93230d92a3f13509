package zookeeper

import (
	"testing"
	"time"

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
	locktest.Run(t, lockerFactory(Config{Servers: e.Addrs(), Root: "/conformance"}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(5))
}

func TestConformanceDigest(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/digest/locks", Digest: "lockwarden:s3cret"}
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}
