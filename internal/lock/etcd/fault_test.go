package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
	links := locktest.NewLinks(t, c.Endpoints())
	runEtcdFaults(t, c, links, memberNemeses(t, c, links))
}

// TestFaultsSemaphore runs the semaphore fault test (at most Limit slots
// taken by the leases valid at once, tokens strictly increasing) under the
// same faults, with 2 and 3 slots, a third of the requests taking 2 or more
// (Faults.Weights).
func TestFaultsSemaphore(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	links := locktest.NewLinks(t, c.Endpoints())
	cfg := configFor(c)
	cfg.Prefix = "/semfaults/"
	cfg.Endpoints = locktest.Addrs(links)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 4) {
		limit := 2 + int(seed%2)
		f := etcdFaults(cfg, memberNemeses(t, c, links), limit)
		f.Weights = true
		locktest.RunFaults(t, fmt.Sprintf("limit-%d", limit), seed, &tally, f)
		if _, err := c.WaitLeader(time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	tally.Check(t)
}

// memberNemeses kill and restart the leader, pause a member, and cut,
// black-hole or slow one member's link to the clients.
func memberNemeses(t *testing.T, c *etcdtest.Cluster, links []*locktest.Link) []locktest.Nemesis {
	return append([]locktest.Nemesis{
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
}

// TestFaultsEtcdFailover runs the same fault test through etcd's own
// failures: two of the three members paused together for 1-3s (quorum lost
// for longer than the TTL) and resumed, and the history compacted under the
// clients' live watches. (A leader cut off from its peers while its clients
// stay attached needs a partition between the members themselves; etcd's
// peers deliver over connections either side dials, so a proxy in front of
// each member cannot cut one member off alone: docs/safety.md.)
func TestFaultsEtcdFailover(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	links := locktest.NewLinks(t, c.Endpoints())
	admin := adminClient(t, c)
	nemeses := []locktest.Nemesis{
		{Name: "quorum-loss", Inject: func(ctx context.Context, rng *rand.Rand) {
			order := rng.Perm(len(c.Members))
			paused := []*etcdtest.Member{c.Members[order[0]], c.Members[order[1]]}
			for _, m := range paused {
				if err := m.Pause(); err != nil {
					t.Errorf("pause %s: %v", m.Name, err)
				}
			}
			time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
			for _, m := range paused {
				if err := m.Resume(); err != nil {
					t.Errorf("resume %s: %v", m.Name, err)
				}
			}
		}},
		{Name: "compaction", Inject: func(ctx context.Context, _ *rand.Rand) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			resp, err := admin.Put(cctx, "/faults-compact-probe", "x")
			if err != nil {
				return // mid-election or quorum loss: the next one compacts
			}
			if _, err := admin.Compact(cctx, resp.Header.Revision); err != nil && ctx.Err() == nil {
				t.Logf("compact at %d: %v", resp.Header.Revision, err)
			}
		}},
	}
	runEtcdFaults(t, c, links, nemeses)
}

// runEtcdFaults runs the fault test with nemeses on c, whose clients reach
// it through links.
func runEtcdFaults(t *testing.T, c *etcdtest.Cluster, links []*locktest.Link, nemeses []locktest.Nemesis) {
	t.Helper()
	cfg := configFor(c)
	cfg.Prefix = "/faults/"
	cfg.Endpoints = locktest.Addrs(links)
	runEtcdFaultSeries(t, c, "cluster-3", cfg, 4, 12*time.Second, nemeses)
}

// runEtcdFaultSeries runs the fault harness runs times (each run lasting
// duration) with Lockers on cfg and checks the tally; c gets its leader back
// between runs.
func runEtcdFaultSeries(t *testing.T, c *etcdtest.Cluster, name string, cfg Config, runs int, duration time.Duration, nemeses []locktest.Nemesis) {
	t.Helper()
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, runs) {
		f := etcdFaults(cfg, nemeses, 1)
		f.Duration = duration
		locktest.RunFaults(t, name, seed, &tally, f)
		// The next run starts with every member up and one leader.
		if _, err := c.WaitLeader(time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	tally.Check(t)
}

// etcdFaults is the fault test of Lockers on cfg: a 2s TTL, 12s runs.
func etcdFaults(cfg Config, nemeses []locktest.Nemesis, limit int) locktest.Faults {
	return locktest.Faults{
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
		Limit:    limit,
		Policies: true,
	}
}

// adminClient is a plain etcd client of c, beside the Lockers under test.
func adminClient(t *testing.T, c *etcdtest.Cluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Username: c.Username, Password: c.Password, TLS: c.ClientTLS(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// TestFaultHarnessCatchesAMutant is the negative control of the fault
// suites above: a Locker that reports its leases valid 3s longer than etcd
// keeps their session (locktest.LateExpiry; the 2s TTL is kept up to half a
// second longer by the leader's expiry checks, so a smaller error could hide
// in that slack) must fail the exclusion check.
func TestFaultHarnessCatchesAMutant(t *testing.T) {
	m := etcdtest.Start(t)
	for kind, limit := range map[string]int{"mutex": 1, "semaphore": 2} {
		t.Run(kind, func(t *testing.T) {
			cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/mutant-" + kind + "/"}
			f := etcdFaults(cfg, nil, limit)
			newLocker := f.NewLocker
			f.NewLocker = func(t *testing.T) lock.Locker { return locktest.LateExpiry(newLocker(t), 3*time.Second) }
			f.Duration, f.FaultGap = 8*time.Second, 0
			err := locktest.FindViolation(t, 5, f)
			var ex *locktest.ExclusionError
			if !errors.As(err, &ex) {
				t.Fatalf("the fault harness passed the late-expiry mutant (%v): it cannot catch two valid holders", err)
			}
		})
	}
}
