package zookeeper

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// BenchmarkCycle is an uncontended TryAcquire + Release of one key on the
// standalone server: list the key node's children (holder and queue), one
// multi (create the holder node, write the key node), then read the key and
// holder nodes and one multi (check the key node's version, delete the holder node).
func BenchmarkCycle(b *testing.B) {
	e := sharedServers(b, 1)
	warmUp(b, e.Addrs())
	l := newTestLocker(b, Config{Servers: e.Addrs(), Root: "/bench"})
	ctx := context.Background()
	req := lock.Request{Keys: []string{testKey("cycle")}, TTL: 30 * time.Second, Holder: "bench"}
	for b.Loop() {
		lease, err := l.TryAcquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, lease); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFloor is the least a correct lease cycle costs with the raw
// client, for comparison with BenchmarkCycle: one multi that creates the
// ephemeral holder node and writes the key node (its new mzxid is the fencing
// token), and one multi that checks the key node's version (no acquisition
// since) and deletes the holder node. It skips what the Locker adds: the FIFO
// queue check before acquiring, the owner check before releasing (the floor
// knows both from its own writes) and the TTL timer.
func BenchmarkFloor(b *testing.B) {
	e := sharedServers(b, 1)
	warmUp(b, e.Addrs())
	c := rawConn(b, e.Addrs())
	for _, p := range []string{"/benchfloor", "/benchfloor/k"} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			b.Fatal(err)
		}
	}
	_, st, err := c.Exists("/benchfloor/k")
	if err != nil {
		b.Fatal(err)
	}
	version := st.Version
	data := mustJSON(holderData{Owner: ownerHash("owner"), Holder: "bench", TTLMs: 30000})
	for b.Loop() {
		res, err := c.Multi(
			&zk.CreateRequest{Path: "/benchfloor/k/holder", Data: data, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
			&zk.SetDataRequest{Path: "/benchfloor/k", Data: []byte("k"), Version: version})
		if err != nil {
			b.Fatal(err)
		}
		version = res[1].Stat.Version
		if _, err := c.Multi(
			&zk.CheckVersionRequest{Path: "/benchfloor/k", Version: version},
			&zk.DeleteRequest{Path: "/benchfloor/k/holder", Version: 0}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandover measures, per handover, the time from the start of the
// holder's Release to the return of a queued waiter's Acquire, and reports
// the median and 99th percentile. The waiter's fallback polling is 10s (its
// queue heartbeat with a 30s waiter TTL, and its backoff), so handovers well
// under that show that the waiter is woken by the ZooKeeper watch on the
// holder node, not by polling.
func BenchmarkHandover(b *testing.B) {
	e := sharedServers(b, 1)
	warmUp(b, e.Addrs())
	cfg := Config{Servers: e.Addrs(), Root: "/bench"}
	holder := newTestLocker(b, cfg)
	waiter := newTestLocker(b, cfg, WithWaiterTTL(30*time.Second),
		WithBackoff(wait.Backoff{Duration: 10 * time.Second, Factor: 1, Steps: 1 << 30, Cap: 10 * time.Second}))
	ctx := context.Background()
	key := testKey("handover")
	var lat []time.Duration
	for b.Loop() {
		held, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		type res struct {
			lease *lock.Lease
			at    time.Time
			err   error
		}
		done := make(chan res, 1)
		go func() {
			l, err := waiter.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Queue: true})
			done <- res{l, time.Now(), err}
		}()
		err = wait.PollUntilContextTimeout(ctx, time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			st, err := holder.Inspect(ctx, []string{key})
			return err == nil && len(st[0].Waiters) == 1, nil
		})
		if err != nil {
			b.Fatalf("the waiter never queued: %v", err)
		}
		start := time.Now()
		if err := holder.Release(ctx, held); err != nil {
			b.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			b.Fatal(r.err)
		}
		lat = append(lat, r.at.Sub(start))
		if err := waiter.Release(ctx, r.lease); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

var warmed sync.Once

// warmUp runs a few hundred writes and reads on a fresh server before the
// first benchmark measures it: a JVM runs its code interpreted at first, and
// the benchmark that happens to run first would pay for the compilation.
func warmUp(b *testing.B, servers []string) {
	warmed.Do(func() {
		l := newTestLocker(b, Config{Servers: servers, Root: "/warmup"})
		ctx := context.Background()
		req := lock.Request{Keys: []string{testKey("warm")}, TTL: 30 * time.Second}
		for range 500 {
			lease, err := l.TryAcquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, lease); err != nil {
				b.Fatal(err)
			}
			if _, err := l.Inspect(ctx, req.Keys); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRenewAll is one watchdog round over held leases (see
// locktest.BenchRenewAll): one write of the Locker's renewal node, then a
// read of every holder node.
func BenchmarkRenewAll(b *testing.B) {
	e := sharedServers(b, 1)
	warmUp(b, e.Addrs())
	l := newTestLocker(b, Config{Servers: e.Addrs(), Root: "/benchrenew"})
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), "renew")
}
