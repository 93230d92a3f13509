package etcd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// isolationTTL is the TTL of the fault clients and of the probe leases.
const isolationTTL = 2 * time.Second // the TTL runEtcdFaultSeries gives the clients

// TestFaultsEtcdLeaderIsolated runs the fenced-register fault test of
// locktest against a 3-member cluster in network namespaces while the raft
// leader is cut off from its two peers (iptables in its namespace) for
// longer than the election timeout and the clients' TTL, then healed. The
// clients keep reaching every member, the isolated old leader too: their
// etcd clients hold all three endpoints, with no proxy between, so some of
// their calls land on the stale leader. It must grant and renew nothing once
// it lost its quorum (it steps down after an election timeout without
// hearing from a quorum, and its linearizable reads and transactions need
// one); the clients must get errors or time-outs there and go on with the
// other members.
//
// Each fault also checks directly that the partition happened: the isolated
// member stops calling itself the leader and another member leads; and that
// a Locker that reaches only the isolated member can neither acquire a key
// nor renew a lease it took there before the partition.
func TestFaultsEtcdLeaderIsolated(t *testing.T) {
	etcdtest.RequireNetns(t)
	c := etcdtest.StartCluster(t, 3, etcdtest.WithNetns())
	cfg := configFor(c)
	cfg.Prefix = "/faults/"

	// One Locker per member that reaches that member only, for the probes.
	probeCfg := configFor(c)
	probeCfg.Prefix = "/isolation-probe/"
	only := map[*etcdtest.Member]*Locker{}
	for _, m := range c.Members {
		pc := probeCfg
		pc.Endpoints = []string{m.Addr}
		only[m] = newTestLocker(t, pc, WithOpTimeout(time.Second))
	}

	var injected, confirmed, refusedAcquire, refusedRenew atomic.Int64
	nemeses := []locktest.Nemesis{{Name: "leader-isolated", Inject: func(ctx context.Context, rng *rand.Rand) {
		old, err := c.Leader()
		if err != nil {
			return // mid-election: the next fault finds one
		}
		injected.Add(1)
		probe := only[old]
		// A lease taken through the leader before the partition, to renew
		// through it once it is cut off.
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		before, berr := probe.Acquire(pctx, lock.Request{Keys: []string{fmt.Sprintf("renew-%d", injected.Load())}, TTL: isolationTTL, Holder: "probe"})
		pcancel()
		start := time.Now()
		heal, err := c.IsolatePeers(old)
		if err != nil {
			t.Errorf("isolate %s: %v", old.Name, err)
			return
		}
		defer func() {
			if err := heal(); err != nil {
				t.Error(err)
			}
		}()
		next, err := waitOtherLeader(c, old, 10*time.Second)
		if err != nil {
			t.Errorf("leader-isolated: %v", err)
			return
		}
		confirmed.Add(1)
		t.Logf("leader-isolated: %s cut off from its peers; %s leads after %v", old.Name, next.Name, time.Since(start).Round(time.Millisecond))

		// Through the stale leader only: no grant, no renewal.
		actx, acancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		if l, err := probe.Acquire(actx, lock.Request{Keys: []string{fmt.Sprintf("acquire-%d", injected.Load())}, TTL: isolationTTL, Holder: "probe"}); err == nil {
			t.Errorf("the isolated old leader %s granted %s (fence %d)", old.Name, l.Keys, l.Fence)
		} else {
			refusedAcquire.Add(1)
		}
		acancel()
		if berr == nil {
			rctx, rcancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			if l, err := probe.Renew(rctx, before, isolationTTL); err == nil {
				t.Errorf("the isolated old leader %s renewed %s until %v", old.Name, l.Keys, l.Expires)
			} else {
				refusedRenew.Add(1)
			}
			rcancel()
		}
		// Past the election timeout and the TTL: leases granted through the
		// old leader before the cut expire under the new one.
		hold := isolationTTL + etcdtest.ElectionTimeout + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
		if d := hold - time.Since(start); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}}}

	runEtcdFaultSeries(t, c, "cluster-3-netns", cfg, 3, 8*time.Second, nemeses)
	t.Logf("leader isolations: %d injected, %d confirmed (new leader elected, old one stepped down); through the stale leader only: %d acquisitions and %d renewals refused",
		injected.Load(), confirmed.Load(), refusedAcquire.Load(), refusedRenew.Load())
	if confirmed.Load() == 0 || confirmed.Load() != injected.Load() {
		t.Errorf("%d of %d leader isolations confirmed: the partition did not happen every time", confirmed.Load(), injected.Load())
	}
	if refusedRenew.Load() == 0 && !t.Failed() {
		t.Errorf("no renewal through the isolated leader was tried: the probe never got a lease before a partition")
	}
}

// waitOtherLeader waits until old says it does not lead and another member
// says it does, and returns that one.
func waitOtherLeader(c *etcdtest.Cluster, old *etcdtest.Member, timeout time.Duration) (*etcdtest.Member, error) {
	var next *etcdtest.Member
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if isLeader, err := old.IsLeader(); err != nil || isLeader {
			last = fmt.Sprintf("the isolated %s: leader=%v, err=%v", old.Name, isLeader, err)
			return false, nil
		}
		for _, m := range c.Members {
			if m == old {
				continue
			}
			if ok, err := m.IsLeader(); err == nil && ok {
				next = m
				return true, nil
			}
		}
		last = fmt.Sprintf("%s stepped down but no other member leads", old.Name)
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no new leader among the peers of the isolated %s within %v (%s)", old.Name, timeout, last)
	}
	return next, nil
}
