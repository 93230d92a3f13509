package etcd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// against a 3-member cluster while the leader is killed (SIGKILL) and
// restarted with its data, or a member is paused and resumed.
//
// The clients' TTL is 1s, etcd's lease granularity: with a shorter one etcd
// would keep the keys for a whole second anyway and a client stalling past
// its Expires would never be overtaken, so stale writes would not happen.
func TestFaultsFencedRegister(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cfg := configFor(c)
	cfg.Prefix = "/faults/"
	var tally locktest.FaultTally
	for _, seed := range locktest.FaultSeeds(t, 4) {
		locktest.RunFaults(t, "cluster-3", seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker {
				return newTestLocker(t, cfg, WithOpTimeout(2*time.Second))
			},
			Inject: func(ctx context.Context, rng *rand.Rand) {
				if rng.IntN(3) > 0 {
					leader, err := c.Leader()
					if err != nil {
						// Mid-election: the next fault finds one.
						return
					}
					leader.Kill()
					time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
					if err := leader.Restart(); err != nil {
						t.Errorf("restart the killed leader %s: %v", leader.Name, err)
					}
					return
				}
				m := c.Members[rng.IntN(len(c.Members))]
				if err := m.Pause(); err != nil {
					t.Errorf("pause %s: %v", m.Name, err)
					return
				}
				time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
				if err := m.Resume(); err != nil {
					t.Errorf("resume %s: %v", m.Name, err)
				}
			},
			TTL:            time.Second,
			Duration:       8 * time.Second,
			AcquireTimeout: 3 * time.Second,
			FaultGap:       time.Second,
		})
		// The next run starts with every member up and one leader.
		if _, err := c.WaitLeader(time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	tally.Check(t)
}
