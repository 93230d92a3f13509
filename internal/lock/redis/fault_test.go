package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestFaultsFencedRegister runs the fenced-register fault test of locktest,
// which checks exclusion and fencing, while one node at a time is killed
// and restarted with its data (appendfsync always), or paused, or cut off
// from the clients (partition, black hole) or slowed (latency) by the proxy
// the clients reach it through, or gets the stale lock of a crashed client
// (staleLock), or waiters that never heartbeat are queued at the head of
// some nodes' queues (deadWaiter): half the seeds against a 3-node Redlock,
// half against a standalone server.
func TestFaultsFencedRegister(t *testing.T) {
	keep := redistest.WithPersistence()
	redlock := redistest.StartN(t, 3, keep)
	single := []*redistest.Server{redistest.Start(t, keep)}
	links := map[string][]*locktest.Link{
		"redlock-3":  locktest.NewLinks(t, addrs(redlock)),
		"standalone": locktest.NewLinks(t, addrs(single)),
	}
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 8) {
		servers, mode := redlock, "redlock-3"
		if seed%2 == 1 {
			servers, mode = single, "standalone"
		}
		locktest.RunFaults(t, mode, seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker {
				return newTestLocker(t, Config{Addrs: locktest.Addrs(links[mode])})
			},
			Nemeses:  append(redisNemeses(t, servers), locktest.LinkNemeses(links[mode], 400*time.Millisecond)...),
			Policies: true,
		})
	}
	tally.Check(t)
}

// TestFaultsEmptyRestartKeepsFences is the fence's own test: a server that
// restarts empty (no persistence) forgets its leases, so a second holder can
// take a key while the first lease is still valid (docs/safety.md, "Redis
// restarted empty"), and the run does not check exclusion. What must hold
// even then is the fence: tokens keep rising across the restart (the
// server-clock floor), so the register refuses the first holder's writes.
func TestFaultsEmptyRestartKeepsFences(t *testing.T) {
	redlock := redistest.StartN(t, 3)
	single := redistest.Start(t)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 4) {
		servers, mode := redlock, "redlock-3"
		if seed%2 == 1 {
			servers, mode = []*redistest.Server{single}, "standalone"
		}
		locktest.RunFaults(t, mode, seed, &tally, locktest.Faults{
			NewLocker:     func(t *testing.T) lock.Locker { return newTestLocker(t, Config{Addrs: addrs(servers)}) },
			Nemeses:       redisNemeses(t, servers),
			EmptyRestarts: true,
		})
	}
	tally.Check(t)
}

// TestFaultHarnessCatchesAMutant is the negative control of the fault
// harness: a store that reports every lease as valid 200ms longer than the
// server keeps it (locktest.LateExpiry) must fail the exclusion check, in
// mutex and in semaphore runs, on a server that keeps its data. A harness
// that passed it would prove nothing about the stores that pass it.
func TestFaultHarnessCatchesAMutant(t *testing.T) {
	s := redistest.Start(t, redistest.WithPersistence())
	mutant := func(t *testing.T) lock.Locker {
		return locktest.LateExpiry(newTestLocker(t, Config{Addrs: []string{s.Addr}}), 200*time.Millisecond)
	}
	for name, limit := range map[string]int{"mutex": 1, "semaphore": 2} {
		t.Run(name, func(t *testing.T) {
			err := locktest.FindViolation(t, 5, locktest.Faults{NewLocker: mutant, Limit: limit})
			var ex *locktest.ExclusionError
			if !errors.As(err, &ex) {
				t.Fatalf("the fault harness passed a store that reports leases valid 200ms too long (%v): it cannot catch two valid holders", err)
			}
		})
	}
}

// redisNemeses are the faults of the servers themselves: one killed and
// restarted (with its data if it has persistence), one paused past the
// TTL, a crashed client's stale lock, dead waiters at the queues' heads.
func redisNemeses(t *testing.T, servers []*redistest.Server) []locktest.Nemesis {
	pick := func(rng *rand.Rand) *redistest.Server { return servers[rng.IntN(len(servers))] }
	return []locktest.Nemesis{
		locktest.KillRestart(t, func(rng *rand.Rand) (func(), func() error) {
			s := pick(rng)
			return s.Kill, func() error { s.Restart(); return nil }
		}),
		locktest.PauseResume(t, 350*time.Millisecond, func(rng *rand.Rand) (func() error, func() error) {
			s := pick(rng)
			return func() error { s.Pause(); return nil }, func() error { s.Resume(); return nil }
		}),
		{Name: "stale-lock", Inject: func(ctx context.Context, rng *rand.Rand) { staleLock(ctx, pick(rng), rng) }},
		{Name: "dead-waiter", Inject: func(ctx context.Context, rng *rand.Rand) { deadWaiter(ctx, servers, rng) }},
	}
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
	for seed := range tally.Seeds(t, len(setups)) {
		s := setups[seed%uint64(len(setups))]
		locktest.RunFaults(t, s.name, seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker { return newTestLocker(t, s.cfg) },
			Nemeses:   redisNemeses(t, s.servers)[:2], // kill-restart and pause
			Limit:     s.limit,
			Weights:   true, // a third of the requests take 2 or more slots
		})
	}
	tally.Check(t)
}

// faultKeys returns the lock keys (as the scripts name them, "{key}:") that
// the fault run has used on a server: those with a fence counter.
func faultKeys(ctx context.Context, s *redistest.Server) []string {
	bases, err := s.Client().Keys(ctx, "{*}:fence").Result()
	if err != nil {
		return nil
	}
	for i, b := range bases {
		bases[i] = strings.TrimSuffix(b, "fence")
	}
	return bases
}

// staleLock leaves the lock of a client that crashed (another owner, a
// 500ms TTL) on one node's free keys, as a partial acquisition does: the
// node refuses the key until it expires, and the queued acquirers it
// refuses meanwhile must not stay queued there once a majority granted them.
func staleLock(ctx context.Context, s *redistest.Server, rng *rand.Rand) {
	for _, b := range faultKeys(ctx, s) {
		s.Client().SetNX(ctx, b+"lock", fmt.Sprintf("crashed-%d", rng.Uint64()), 500*time.Millisecond)
	}
	time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
}

// deadWaiter queues, at the head of the queues of a random non-empty subset
// of the nodes, a waiter that never heartbeats (its deadline 300ms ahead):
// the nodes must prune it, and acquirers must not wait for it for longer.
func deadWaiter(ctx context.Context, servers []*redistest.Server, rng *rand.Rand) {
	owner := fmt.Sprintf("dead-%d", rng.Uint64())
	for i, s := range servers {
		if i > 0 && rng.IntN(2) == 0 {
			continue
		}
		c := s.Client()
		now, err := c.Time(ctx).Result()
		if err != nil {
			continue
		}
		deadline := now.Add(300 * time.Millisecond).UnixMilli()
		for _, b := range faultKeys(ctx, s) {
			c.ZAdd(ctx, b+"queue", goredis.Z{Score: 1, Member: owner})
			c.ZAdd(ctx, b+"deadlines", goredis.Z{Score: float64(deadline), Member: owner})
			c.HSet(ctx, b+"waiters", owner, fmt.Sprintf("%d dead", now.UnixMicro()))
		}
	}
	time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
}
