package postgres

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// while the server is killed (SIGKILL, every backend at once) and restarted
// with its data, or paused and resumed. Fences must not go backwards across
// crash recovery, and a lease held across a restart is either kept with its
// token or lost, never granted twice.
func TestFaultsFencedRegister(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	// Short operation timeouts: a paused server must not stall the clients
	// for seconds.
	newLocker := func(t *testing.T) lock.Locker {
		return newTestLocker(t, cfg, WithOperationTimeout(time.Second))
	}
	// Create the schema before the faults start.
	if err := newTestLocker(t, cfg).Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 4) {
		locktest.RunFaults(t, "kill-restart", seed, &tally, locktest.Faults{
			NewLocker: newLocker,
			// Crash recovery and reconnecting (a SCRAM handshake per
			// connection) take a while on a loaded machine: a longer TTL than
			// the default (calls get half of it), a longer run and fewer
			// faults, so that clients get leases between the faults.
			TTL:            600 * time.Millisecond,
			Duration:       4 * time.Second,
			FaultGap:       800 * time.Millisecond,
			AcquireTimeout: 3 * time.Second,
			Inject: func(_ context.Context, rng *rand.Rand) {
				if rng.IntN(3) > 0 {
					s.Kill()
					time.Sleep(time.Duration(20+rng.IntN(100)) * time.Millisecond)
					began := time.Now()
					if err := s.Restart(); err != nil {
						t.Errorf("restart: %v", err)
					}
					t.Logf("killed and restarted; crash recovery took %v", time.Since(began).Round(time.Millisecond))
					return
				}
				if err := s.Pause(); err != nil {
					t.Errorf("pause: %v", err)
					return
				}
				time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
				if err := s.Resume(); err != nil {
					t.Errorf("resume: %v", err)
				}
			},
		})
	}
	tally.Check(t)
}
