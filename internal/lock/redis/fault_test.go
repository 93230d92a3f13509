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

// TestFaultsSemaphore runs the semaphore fault test of locktest (at most
// Limit leases valid at once, tokens strictly increasing) while a server is
// killed and restarted, or paused, as in TestFaultsFencedRegister: on a
// standalone server, the master of a Sentinel group, a 3-node Redlock with 2
// slots (all 3 nodes needed) and a 5-node Redlock with 3 slots (4 needed).
// The servers restart with their data (appendfsync always): one restarted
// empty forgets its holders, and the count is not guaranteed then, only the
// tokens (docs/safety.md, "Semaphores").
func TestFaultsSemaphore(t *testing.T) {
	if testing.Short() {
		t.Skip("fault runs take several seconds")
	}
	keep := redistest.WithPersistence()
	single := redistest.Start(t, keep)
	master := redistest.Start(t, keep)
	sentinels := redistest.StartSentinels(t, master, 3, "semmaster")
	redlock3 := redistest.StartN(t, 3, keep)
	redlock5 := redistest.StartN(t, 5, keep)
	type setup struct {
		name    string
		cfg     Config
		servers []*redistest.Server
		limit   int
	}
	setups := []setup{
		{"standalone", Config{Addrs: []string{single.Addr}}, []*redistest.Server{single}, 3},
		{"sentinel", Config{Addrs: sentinels.Addrs(), MasterName: sentinels.MasterName}, []*redistest.Server{master}, 3},
		{"redlock-3", Config{Addrs: addrs(redlock3)}, redlock3, 2},
		{"redlock-5", Config{Addrs: addrs(redlock5)}, redlock5, 3},
	}
	var tally locktest.FaultTally
	// Consecutive seeds cover every setup; a replayed seed picks its own.
	for _, seed := range locktest.FaultSeeds(t, len(setups)) {
		s := setups[seed%uint64(len(setups))]
		locktest.RunFaults(t, s.name, seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker { return newTestLocker(t, s.cfg) },
			Inject:    killOrPause(s.servers),
			Limit:     s.limit,
		})
	}
	tally.Check(t)
}

// killOrPause injects the faults of TestFaultsFencedRegister: one server is
// killed and restarted, or paused and resumed.
func killOrPause(servers []*redistest.Server) func(context.Context, *rand.Rand) {
	return func(_ context.Context, rng *rand.Rand) {
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
	}
}
