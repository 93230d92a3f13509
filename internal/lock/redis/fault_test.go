package redis

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// while one node at a time is killed and restarted empty, or paused: half the
// seeds against a 3-node Redlock, half against a standalone server.
func TestFaultsFencedRegister(t *testing.T) {
	redlock := redistest.StartN(t, 3)
	single := redistest.Start(t)
	var tally locktest.FaultTally
	for _, seed := range locktest.FaultSeeds(t, 8) {
		servers, mode := redlock, "redlock-3"
		if seed%2 == 1 {
			servers, mode = []*redistest.Server{single}, "standalone"
		}
		locktest.RunFaults(t, mode, seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker { return newTestLocker(t, Config{Addrs: addrs(servers)}) },
			Inject: func(_ context.Context, rng *rand.Rand) {
				s := servers[rng.IntN(len(servers))]
				if rng.IntN(2) == 0 {
					s.Kill()
					time.Sleep(time.Duration(20+rng.IntN(100)) * time.Millisecond)
					s.Restart()
				} else {
					s.Pause()
					time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
					s.Resume()
				}
			},
		})
	}
	tally.Check(t)
}
