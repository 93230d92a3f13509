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
// (exclusion and fencing) against a 3-member cluster that the clients reach
// through one proxy per member, while the leader is killed (SIGKILL) and
// restarted with its data, a member is paused and resumed, or one member's
// link to the clients is cut, black-holed or slowed.
//
// The clients' TTL is 2s: etcd grants leases in whole seconds and its
// leader checks for expired leases every 500ms, so a lease ends up to half a
// second after its TTL. A client that stalls past its Expires + TTL/2 (what
// the fault test does) is then reliably overtaken by another, and its stale
// write must be rejected; with a 1s TTL it often wakes before etcd frees the
// key, and the runs exercise fencing less.
func TestFaultsFencedRegister(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cfg := configFor(c)
	cfg.Prefix = "/faults/"
	links := locktest.NewLinks(t, c.Endpoints())
	cfg.Endpoints = locktest.Addrs(links)
	nemeses := append([]locktest.Nemesis{
		{Name: "kill-restart-leader", Inject: func(ctx context.Context, rng *rand.Rand) {
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
		}},
		locktest.PauseResume(t, 800*time.Millisecond, func(rng *rand.Rand) (func() error, func() error) {
			m := c.Members[rng.IntN(len(c.Members))]
			return m.Pause, m.Resume
		}),
	}, locktest.LinkNemeses(links, 1500*time.Millisecond)...)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 4) {
		locktest.RunFaults(t, "cluster-3", seed, &tally, locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker {
				return newTestLocker(t, cfg, WithOpTimeout(2*time.Second))
			},
			Nemeses:        nemeses,
			TTL:            2 * time.Second,
			Duration:       12 * time.Second,
			AcquireTimeout: 4 * time.Second,
			// A leader change resets every etcd lease to its full TTL
			// (plus an election timeout): with faults every second no
			// lease would ever expire under a stalled client.
			FaultGap: 3 * time.Second,
		})
		// The next run starts with every member up and one leader.
		if _, err := c.WaitLeader(time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	tally.Check(t)
}
