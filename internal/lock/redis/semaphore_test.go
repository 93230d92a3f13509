package redis

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

func TestSemaphoreStandalone(t *testing.T) {
	s := redistest.Start(t)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: []string{s.Addr}, Prefix: "sem:"}), locktest.WithWaiterTTL(time.Second))
}

func TestSemaphoreSentinel(t *testing.T) {
	master := redistest.Start(t, redistest.WithPassword("m4ster"))
	sentinels := redistest.StartSentinels(t, master, 3, "mymaster")
	cfg := Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName, Password: "m4ster", DB: 2}
	locktest.RunSemaphore(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}

func TestSemaphoreRedlock3(t *testing.T) {
	servers := redistest.StartN(t, 3)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: addrs(servers), DB: 1}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}

func TestSemaphoreRedlock5(t *testing.T) {
	servers := redistest.StartN(t, 5)
	locktest.RunSemaphore(t, lockerFactory(Config{Addrs: addrs(servers)}), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(2))
}
