package zookeeper

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// skewOffset is how far ahead of the others server 3's wall clock runs in
// TestFaultsSkewedServerClock: more than the TTL, so that on its clock every
// lease last written under another leader has run out.
const skewOffset = 12 * time.Second

// TestFaultsSkewedServerClock runs the fenced-register fault test on a
// 3-server ensemble whose server 3 has its wall clock skewOffset ahead
// (libfaketime preloaded into its JVM; its timeouts keep real time), with
// the Lockers told (MaxClockSkew) that the servers' clocks may differ by more
// than that. The one nemesis, leader-change, kills the leader and restarts
// it: leadership moves between the servers, and server 3 (the highest id, so
// it wins the elections it can) leads every other time. ZooKeeper stamps
// writes with its leader's clock, so after a move to server 3 every holder
// node last renewed under another leader looks skewOffset older than it is.
// Exclusion and fencing must hold, and server 3 must have led at least once
// (or the run proved nothing). TestSkewedLeaderClock is its control.
func TestFaultsSkewedServerClock(t *testing.T) {
	zktest.Require(t)
	zktest.RequireFaketime(t)
	e := zktest.StartEnsemble(t, 3, zktest.WithClockOffset(3, skewOffset))
	skewed := e.Servers[2]

	var skewedLed atomic.Int64
	leaderChange := locktest.Nemesis{Name: "leader-change", Inject: func(_ context.Context, rng *rand.Rand) {
		killLeader(t, e, rng)
		if l, err := e.Leader(); err == nil && l == skewed {
			skewedLed.Add(1)
		}
	}}
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 1) {
		locktest.RunFaults(t, "skew-12s-tolerance-13s", seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker {
				return newTestLocker(t, Config{Servers: e.Addrs(), Root: "/skew", MaxClockSkew: skewOffset + time.Second})
			},
			Nemeses: []locktest.Nemesis{leaderChange},
			// Longer than an election on a loaded machine (seconds), so a
			// lease granted before one is still valid after it.
			TTL:            5 * time.Second,
			AcquireTimeout: 6 * time.Second,
			// Room for several leader changes (each restarts a JVM).
			Duration: 20 * time.Second,
			FaultGap: time.Second,
		})
	}
	tally.Check(t)
	if skewedLed.Load() == 0 {
		t.Errorf("server 3 (clock %v ahead) never led during the runs: the skew was never exercised", skewOffset)
	}
}

// TestSkewedLeaderClock takes a lease under a leader with the right clock,
// moves leadership to server 3, whose clock is skewOffset ahead, and has
// another Locker try the key until the lease's Expires:
//
//   - within-max-clock-skew: MaxClockSkew is above the offset, so the
//     other Locker must not get the key while the lease is valid;
//   - beyond-max-clock-skew (the control): the default MaxClockSkew, below
//     the offset; the holder node looks past its TTL on server 3's clock,
//     and the other Locker takes the key while the first lease is still
//     valid (at most staleSlack early: an acquirer asks the ensemble's
//     clock only for holders whose end is that close on its own clock).
//     The test fails if it does not: the skew would not be what the first
//     case guards against. This is why docs/safety.md asks ZooKeeper's
//     operators to keep the servers' clocks synchronized.
func TestSkewedLeaderClock(t *testing.T) {
	zktest.Require(t)
	zktest.RequireFaketime(t)
	e := zktest.StartEnsemble(t, 3, zktest.WithClockOffset(3, skewOffset))
	logsOnFailure(t, e)
	skewed := e.Servers[2]
	rng := rand.New(rand.NewPCG(1, 2))
	// lead kills leaders until want(leader) holds.
	lead := func(want func(*zktest.Server) bool) {
		t.Helper()
		for range 6 {
			l, err := e.Leader()
			if err == nil && want(l) {
				return
			}
			killLeader(t, e, rng)
		}
		t.Fatal("leadership did not move where the test needs it in 6 elections")
	}
	for _, tc := range []struct {
		name     string
		skew     time.Duration
		takeover bool
	}{
		{"within-max-clock-skew", skewOffset + time.Second, false},
		{"beyond-max-clock-skew", 0, true}, // the default, DefaultMaxClockSkew
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Servers: e.Addrs(), Root: "/skew-" + tc.name, MaxClockSkew: tc.skew, SessionTimeout: 30 * time.Second}
			holder := newTestLocker(t, cfg)
			other := newTestLocker(t, cfg)
			ctx := context.Background()
			// A TTL that outlasts the elections below, so that the lease
			// is still valid under server 3 for longer than staleSlack
			// (the window in which a takeover can show). Elections on a
			// loaded machine can take longer than the first TTL: then the
			// attempt shows nothing, and the next one doubles the TTL.
			var held *lock.Lease
			var restart func()
			for ttl := 12 * time.Second; held == nil; ttl *= 2 {
				if ttl > 64*time.Second {
					t.Fatal("the elections that move leadership to server 3 outlasted a 64s lease: the test cannot show anything on this machine")
				}
				lead(func(s *zktest.Server) bool { return s != skewed })
				l, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: ttl, Holder: "first"})
				if err != nil {
					t.Fatal(err)
				}
				restart = leadWithoutRestart(t, e, skewed)
				if left := time.Until(l.Expires); left < staleSlack+time.Second {
					t.Logf("moving leadership to server 3 left the %v lease %v: too little to show a takeover; again with twice the TTL", ttl, left.Round(time.Millisecond))
					if err := holder.Release(ctx, l); err != nil && !errors.Is(err, lock.ErrNotHeld) {
						t.Fatal(err)
					}
					restart()
					continue
				}
				held = l
			}
			var took *lock.Lease
			var early time.Duration // how long the first lease still had when the second was granted
			for time.Now().Before(held.Expires) {
				l, err := other.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Second, Holder: "second"})
				if err == nil {
					took, early = l, time.Until(held.Expires)
					break
				}
				if !errors.Is(err, lock.ErrNotAcquired) {
					t.Logf("try: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			restart() // only now: the member left down answers nothing the test reads
			switch {
			case took != nil && early > 0 && !tc.takeover:
				t.Errorf("with MaxClockSkew %v above server 3's %v offset, a second Locker took the key (fence %d) %v before the first lease (fence %d) expired", tc.skew, skewOffset, took.Fence, early.Round(time.Millisecond), held.Fence)
			case tc.takeover && (took == nil || early <= 0):
				t.Errorf("with MaxClockSkew at its default %v, below server 3's %v offset, no second Locker took the key while the first lease was valid: the control cannot show what the skew tolerance prevents", DefaultMaxClockSkew, skewOffset)
			case took != nil:
				t.Logf("a second Locker took the key (fence %d) %v before the first lease (fence %d) expired", took.Fence, early.Round(time.Millisecond), held.Fence)
			}
		})
	}
}

// leadWithoutRestart moves leadership to target by killing the leaders
// before it and leaving them down while the survivors elect: restarting a
// JVM on a loaded machine takes longer than the election itself, and the
// lease taken before the move must still be valid after it. Two of three
// members keep the quorum. It returns the restart of the member it left
// down, which the caller runs once the lease has been tried.
func leadWithoutRestart(t *testing.T, e *zktest.Ensemble, target *zktest.Server) (restart func()) {
	t.Helper()
	for range 6 {
		l, err := e.Leader()
		if err != nil {
			t.Fatalf("find the leader: %v", err)
		}
		if l == target {
			return func() {}
		}
		l.Kill()
		if err := e.WaitLeader(60 * time.Second); err != nil {
			t.Fatalf("after killing server %d: %v", l.ID, err)
		}
		restart = func() {
			t.Helper()
			if err := l.Restart(); err != nil {
				t.Fatalf("restart server %d: %v", l.ID, err)
			}
			if err := e.WaitLeader(60 * time.Second); err != nil {
				t.Fatalf("after restarting server %d: %v", l.ID, err)
			}
		}
		if nl, err := e.Leader(); err == nil && nl == target {
			return restart
		}
		restart() // the other survivor won: bring the quorum back to three and try again
	}
	t.Fatalf("leadership did not move to server %d in 6 elections", target.ID)
	return nil
}
